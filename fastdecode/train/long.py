"""zoo:ar-long: ar-small's weights with extended positions, fine-tuned on the `longctx.*` tasks with a length
curriculum (docs/zoo.md, "ar-long").

    python -m fastdecode.train.long --minutes 15 --out /tmp/ar-long-probe --threads 1

Each step is one training item (train seeds only) whose context length grows from `--start` to `--end` tokens over
the first `--ramp` share of the time; the loss is the next-token cross-entropy on the answer and EOS. The run stops
after `--minutes` of wall time, then measures teacher-forced exact match (every answer token and EOS the argmax:
what greedy decoding would write) on test items at the lengths of `--eval`, and saves the folder.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaForCausalLM

from ..bench.tasks import DEFAULT_TEST_SEED, format_prompt
from ..bench.tasks.longctx import CONTEXTS, OPS, LongTask
from .export import save_folder
from .loop import cpu_bf16_is_fast


def _encode(tokenizer, prompt: str, answer: str) -> tuple[torch.Tensor, int]:
    p = tokenizer(format_prompt(prompt), add_special_tokens=True)["input_ids"]
    a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return torch.tensor([p + a]), len(p)


def _item(task: LongTask, context: int, rng: random.Random):
    task.context = context  # the task object is private to this run: its length follows the curriculum
    return task.make_item(rng)


def extend_positions(model, kind: str, factor: float, positions: int) -> None:
    """Give the model longer positions: `linear` position interpolation or a larger RoPE `base` (theta x factor)."""
    cfg = model.config
    theta = cfg.rope_parameters.get("rope_theta", 10000.0)
    if kind == "linear":
        cfg.rope_parameters = {"rope_type": "linear", "factor": factor, "rope_theta": theta}
    elif kind == "base":
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": theta * factor}
    else:
        raise ValueError(f"unknown position extension {kind!r}; choose linear or base")
    cfg.max_position_embeddings = positions
    # rebuild the rotary tables from the new config
    rotary = type(model.model.rotary_emb)(config=cfg)
    model.model.rotary_emb = rotary


@torch.no_grad()
def exact_match(model, tokenizer, sizes: list[str], n: int) -> dict[str, float]:
    model.eval()
    out = {}
    for size in sizes:
        for cls in OPS:
            task = cls(size)
            hits = 0
            for item in task.items(DEFAULT_TEST_SEED, n):
                ids, plen = _encode(tokenizer, item.prompt, item.reference)
                logits = model(input_ids=ids).logits[0, plen - 1 : -1]
                hits += int(bool((logits.argmax(-1) == ids[0, plen:]).all()))
            out[task.name] = hits / n
    model.train()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="fastdecode/zoo/ar-small")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rope", default="linear", choices=["linear", "base"])
    ap.add_argument("--factor", type=float, default=8.0)
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--start", type=int, default=512)
    ap.add_argument("--end", type=int, default=4096)
    ap.add_argument("--ramp", type=float, default=0.6)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", default="1k,2k,4k")
    ap.add_argument("--eval-items", type=int, default=10)
    ap.add_argument("--log", default=None, help="JSONL progress log (default: OUT/train_log.jsonl while training)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.init)
    model = LlamaForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    extend_positions(model, args.rope, args.factor, args.positions)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    tasks = [cls("1k") for cls in OPS]
    bf16 = cpu_bf16_is_fast()
    budget = args.minutes * 60
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(args.log or out / "progress.jsonl", "w")
    log: list[dict] = []
    start = time.perf_counter()
    step = 0
    while (elapsed := time.perf_counter() - start) < budget:
        frac = min(1.0, elapsed / (budget * args.ramp))
        top = int(args.start + (args.end - args.start) * frac)
        context = rng.randint(max(256, top // 2), max(256, top))
        task = tasks[step % len(tasks)]
        item = _item(task, context, random.Random(rng.randrange(1_000_000)))  # train seeds only
        ids, plen = _encode(tokenizer, item.prompt, item.reference)
        lr = args.lr * min(1.0, (step + 1) / 20) * (0.55 + 0.45 * math.cos(math.pi * min(1.0, elapsed / budget)))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = model.model(input_ids=ids).last_hidden_state[0, plen - 1 : -1]
            loss = F.cross_entropy(model.lm_head(hidden).float(), ids[0, plen:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {"step": step, "loss": round(loss.item(), 4), "task": task.op, "tokens": int(ids.shape[1]),
               "lr": round(lr, 6), "elapsed_s": round(time.perf_counter() - start, 1)}
        log.append(row)
        logf.write(json.dumps(row) + "\n")
        logf.flush()
        step += 1
    train_s = time.perf_counter() - start
    model.eval()
    sizes = [s for s in args.eval.split(",") if s in CONTEXTS]
    acc = exact_match(model, tokenizer, sizes, args.eval_items)
    save_folder(model, tokenizer, out, log, dtype="bfloat16")
    summary = {"steps": step, "train_minutes": round(train_s / 60, 1), "rope": args.rope, "factor": args.factor,
               "lr": args.lr, "start": args.start, "end": args.end, "bf16_autocast": bf16,
               "eval_items": args.eval_items, "exact_match_fp32": acc}
    (out / "trial.json").write_text(json.dumps(summary, indent=2))
    logf.write(json.dumps({"summary": summary}) + "\n")
    logf.close()


if __name__ == "__main__":
    main()
