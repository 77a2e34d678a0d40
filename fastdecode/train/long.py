"""zoo:ar-long: ar-small's weights fine-tuned on the `longctx.*` tasks in stages, short contexts first, then longer
positions with a length curriculum (docs/zoo.md, "ar-long").

    fastdecode train ar-long                                   # the shipped recipe: every stage of STAGES
    python -m fastdecode.train.long --minutes 15 --out DIR     # one stage, for trials (its flags: --help)

A step draws `--batch` training items (train seeds only) of one task at one length; the length grows from `--start`
to `--end` tokens over the first `--ramp` share of the stage. A row asks up to `--questions` questions about its
context (kv, multikey and after; the first as the suite asks it), and the loss is the next-token cross-entropy on
the answers and their EOS. A stage stops after `--steps` steps (or `--minutes` of wall time), measures teacher-forced
exact match (every answer token and EOS the argmax: what greedy decoding would write) on test items at the lengths
of `--eval`, and saves the folder.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaForCausalLM

from ..bench.tasks import DEFAULT_TEST_SEED, format_prompt
from ..bench.tasks.longctx import CONTEXTS, OPS, LongTask
from .export import save_folder
from .loop import cpu_bf16_is_fast


def _encode(tokenizer, prompt: str, answer: str) -> tuple[torch.Tensor, int]:
    """One item as the suite asks it: ids [1, T] and where its answer starts."""
    ids, supervised = _encode_many(tokenizer, prompt, answer, [])
    return torch.tensor([ids]), supervised.index(True)


def _more_questions(op: str, prompt: str, reference: str, rng: random.Random, k: int) -> list[tuple[str, str]]:
    """Up to `k` further questions about the same context, with their answers, read back from the prompt: training
    rows ask them after the first answer, so one forward over a long context teaches several lookups."""
    if op == "kv":
        pairs = [p for p in re.findall(r"key (\w+) value (\d+)\.", prompt) if p[1] != reference]
        return [(f"What is the value of key {key}?", v) for key, v in rng.sample(pairs, min(k, len(pairs)))]
    if op == "multikey":
        pairs = [p for p in re.findall(r"The special number of ([A-Za-z]+ [A-Za-z]+) is (\d+)\.", prompt)
                 if p[1] != reference]
        return [(f"What is the special number of {p}?", v) for p, v in rng.sample(pairs, min(k, len(pairs)))]
    if op == "after":
        body = prompt.split("This is a waiting line. ", 1)[1].split(".\n", 1)[0].split(", ")
        once = [i for i in range(len(body) - 1) if body.count(body[i]) == 1 and body[i + 1] != reference]
        return [(f"Who comes after {body[i]} in the waiting line?", body[i + 1])
                for i in rng.sample(once, min(k, len(once)))]
    return []  # passkey and vartrack ask the one thing their context holds


def _encode_many(tokenizer, prompt: str, answer: str, more: list[tuple[str, str]]) -> tuple[list[int], list[bool]]:
    """The item as the suite asks it, then `more` questions, each `Q: ...\nA: answer<eos>`: token ids and, per
    id, whether it is a supervised answer or EOS token."""
    eos = tokenizer.eos_token_id
    ids = tokenizer(format_prompt(prompt), add_special_tokens=True)["input_ids"]
    sup = [False] * len(ids)
    for i, (q, a) in enumerate([("", answer), *more]):
        if i:
            qi = tokenizer("\n" + format_prompt(q), add_special_tokens=False)["input_ids"]
            ids, sup = ids + qi, sup + [False] * len(qi)
        ai = tokenizer(a, add_special_tokens=False)["input_ids"] + [eos]
        ids, sup = ids + ai, sup + [True] * len(ai)
    return ids, sup


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
            task = cls(size if size in CONTEXTS else "1k")
            if size not in CONTEXTS:  # a length in tokens, shorter than the registered ones: a stage's own check
                task.context, task.name = int(size), f"longctx.{task.op}@{size}"
            hits = 0
            for item in task.items(DEFAULT_TEST_SEED, n):
                ids, plen = _encode(tokenizer, item.prompt, item.reference)
                logits = model(input_ids=ids.to(model.device)).logits[0, plen - 1 : -1]
                hits += int(bool((logits.argmax(-1).cpu() == ids[0, plen:]).all()))
            out[task.name] = hits / n
    model.train()
    return out


def _batch(tokenizer, task: LongTask, context: int, n: int, rng: random.Random, questions: int = 1):
    """`n` items of `task` at about `context` tokens (train seeds), each asked up to `questions` things, right-padded:
    ids [n, T] and the mask [n, T-1] of the next-token targets that are answers or EOS."""
    rows = []
    for _ in range(n):
        item = _item(task, context, random.Random(rng.randrange(1_000_000)))
        more = _more_questions(task.op, item.prompt, item.reference, rng, questions - 1)
        rows.append(_encode_many(tokenizer, item.prompt, item.reference, more))
    width = max(len(r) for r, _ in rows)
    ids = torch.full((n, width), tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros(n, width - 1, dtype=torch.bool)
    for i, (row, sup) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row) - 1] = torch.tensor(sup[1:])
    return ids, mask


@dataclass(frozen=True)
class Stage:
    """One stage of a run: its schedule, data and positions (`main`'s flags, documented there)."""

    name: str
    steps: int
    lr: float
    start: int
    end: int
    ramp: float = 0.0
    batch: int = 8
    questions: int = 1
    tasks: str = ""
    rope: str = "keep"
    factor: float = 1.0
    positions: int = 4096
    batch_tokens: int = 0  # when set, rows per step = batch_tokens // the step's length (at least 1), not `batch`


# the shipped recipe (docs/zoo.md, "ar-long"): retrieval at ar-small's own positions, then the lookups that had not
# started, then longer positions with a length curriculum
STAGES = (
    Stage("retrieval", steps=454, lr=1e-3, start=160, end=448, ramp=0.5, questions=6),
    Stage("lookup", steps=470, lr=5e-4, start=224, end=448, questions=8,
          tasks="kv,multikey,after,kv,multikey,after,vartrack,passkey"),
    Stage("length", steps=809, lr=3e-4, start=448, end=4096, ramp=0.6, questions=8, rope="base", factor=8.0,
          positions=16384, batch_tokens=4096, tasks="passkey,vartrack,after,passkey,vartrack,after,kv,multikey"),
)


def run_stage(model, tokenizer, stage: Stage, rng: random.Random, minutes: float | None = None,
              log_file=None, on_step=None) -> list[dict]:
    """Train `model` in place for one stage (`stage.steps` steps, or `minutes` of wall time when given)."""
    if stage.rope != "keep":
        extend_positions(model, stage.rope, stage.factor, stage.positions)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.0)
    by_op = {cls.op: cls("1k") for cls in OPS}
    tasks = [by_op[op] for op in stage.tasks.split(",")] if stage.tasks else list(by_op.values())
    bf16 = cpu_bf16_is_fast()
    log: list[dict] = []
    start = time.perf_counter()
    step = 0
    while True:
        elapsed = time.perf_counter() - start
        done = elapsed / (minutes * 60) if minutes else step / max(1, stage.steps)
        if done >= 1.0:
            break
        frac = min(1.0, done / stage.ramp) if stage.ramp > 0 else 1.0
        top = int(stage.start + (stage.end - stage.start) * frac)
        context = rng.randint(max(128, top // 2), max(128, top))
        task = tasks[step % len(tasks)]
        rows = max(1, stage.batch_tokens // context) if stage.batch_tokens else stage.batch
        ids, mask = _batch(tokenizer, task, context, rows, rng, stage.questions)  # train seeds only
        lr = stage.lr * min(1.0, (step + 1) / 20) * (0.55 + 0.45 * math.cos(math.pi * done))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][mask]
            loss = F.cross_entropy(model.lm_head(hidden).float(), ids[:, 1:][mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {"stage": stage.name, "step": step, "loss": round(loss.item(), 4), "task": task.op,
               "tokens": int(ids.shape[1]), "batch": rows, "lr": round(lr, 6),
               "elapsed_s": round(time.perf_counter() - start, 1)}
        log.append(row)
        if log_file is not None:
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()
        if on_step is not None:
            on_step(row)
        step += 1
    model.eval()
    return log


def load_init(path: str):
    tokenizer = AutoTokenizer.from_pretrained(path)
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer


CARD_SIZES = ("1k", "2k", "4k")


def evaluate(folder: Path, n: int) -> dict:
    """Greedy accuracy (fastdecode's ar.greedy, the suite's scorers) on the first `n` test items of every task at the
    card's context lengths."""
    from ..bench.evaluate import task_accuracy
    from ..models.loading import load

    model = load(folder, device="cpu", dtype="float32")
    acc = {f"longctx.{cls.op}@{size}": task_accuracy(model, f"longctx.{cls.op}@{size}", n, "ar.greedy", batch_size=1)
           for size in CARD_SIZES for cls in OPS}
    means = {size: sum(v for k, v in acc.items() if k.endswith("@" + size)) / len(OPS) for size in CARD_SIZES}
    return {"method": "ar.greedy", "items_per_task": n, "accuracy": acc, "mean_accuracy": means}


def build(out: Path, seed: int, threads: int, eval_items: int, command: str,
          status=lambda msg: None, on_step=None) -> dict:
    """`fastdecode train ar-long`: every stage of STAGES from zoo:ar-small, then the card."""
    from ..models.loading import resolve

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model, tokenizer = load_init(str(resolve("zoo:ar-small")))
    log: list[dict] = []
    start = time.perf_counter()
    for stage in STAGES:
        status(f"stage {stage.name}: {stage.steps} steps")
        log += run_stage(model, tokenizer, stage, rng, on_step=on_step)
    minutes = (time.perf_counter() - start) / 60
    save_folder(model, tokenizer, out, log, dtype="bfloat16")
    status("evaluating on the test split")
    metrics = {**evaluate(out, eval_items), "train_minutes": round(minutes, 1)}
    write_card(out, command, minutes, threads, metrics)
    return metrics


def _rows(stage: Stage) -> str:
    return f"{stage.batch_tokens} tokens" if stage.batch_tokens else str(stage.batch)


def write_card(folder: Path, command: str, minutes: float, threads: int, metrics: dict, provenance: str = "") -> None:
    stages = "\n".join(f"| {s.name} | {s.steps} | {_rows(s)} | {s.questions} | {s.start}-{s.end} | {s.lr:g} | "
                       f"{s.rope if s.rope == 'keep' else f'{s.rope} x{s.factor:g}'} | {s.tasks or 'all five'} |"
                       for s in STAGES)
    lines = [
        "# ar-long", "",
        "zoo:ar-small fine-tuned for the `longctx` suite (docs/sparse.md): retrieval at short contexts, then RoPE's "
        "base raised and a length curriculum (docs/zoo.md, \"ar-long\").", "",
        "## Reproduce", "", "```bash", command, "```", "",
        f"Trained in {minutes:.1f} minutes on this project's 2-core CPU machine ({threads} torch thread"
        f"{'s' if threads != 1 else ''}), float32, AdamW, warm-up 20 steps, cosine to 55 %; the loss is on the "
        "answers and their EOS only; train seeds only.", "",
        "| stage | steps | rows per step | questions per row | context (tokens) | lr | positions | tasks |",
        "|---|---|---|---|---|---|---|---|", stages, "",
        *([provenance, ""] if provenance else []),
        "## Measured on the test split", "", "```json", json.dumps(metrics, indent=2), "```", "",
    ]
    (folder / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="fastdecode/zoo/ar-small")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=15, help="wall-time budget (unless --steps)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: after --minutes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rope", default="linear", choices=["linear", "base", "keep"],
                    help="position extension; keep: the init's own (a later stage of a run)")
    ap.add_argument("--factor", type=float, default=8.0)
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--start", type=int, default=512)
    ap.add_argument("--end", type=int, default=4096)
    ap.add_argument("--ramp", type=float, default=0.6)
    ap.add_argument("--batch", type=int, default=1, help="items per step (same length drawn for the step)")
    ap.add_argument("--batch-tokens", type=int, default=0, help="items per step = this // the step's length")
    ap.add_argument("--questions", type=int, default=1,
                    help="questions per context in training rows (kv, multikey, after; the first as the suite asks)")
    ap.add_argument("--tasks", default="", help="the tasks' rotation, repeats weighting one (default: each once)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval", default="1k,2k,4k")
    ap.add_argument("--eval-items", type=int, default=10)
    ap.add_argument("--log", default=None, help="JSONL progress log (default: OUT/progress.jsonl)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model, tokenizer = load_init(args.init)
    stage = Stage("trial", steps=args.steps, lr=args.lr, start=args.start, end=args.end, ramp=args.ramp,
                  batch=args.batch, questions=args.questions, tasks=args.tasks, rope=args.rope, factor=args.factor,
                  positions=args.positions, batch_tokens=args.batch_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(args.log or out / "progress.jsonl", "w") as logf:
        start = time.perf_counter()
        log = run_stage(model, tokenizer, stage, rng, None if args.steps else args.minutes, log_file=logf)
        train_s = time.perf_counter() - start
        sizes = [s for s in args.eval.split(",") if s in CONTEXTS or s.isdigit()]
        acc = exact_match(model, tokenizer, sizes, args.eval_items)
        save_folder(model, tokenizer, out, log, dtype="bfloat16")
        summary = {"init": args.init, **asdict(stage), "steps": len(log), "train_minutes": round(train_s / 60, 1),
                   "bf16_autocast": cpu_bf16_is_fast(), "eval_items": args.eval_items, "exact_match_fp32": acc}
        (out / "trial.json").write_text(json.dumps(summary, indent=2))
        logf.write(json.dumps({"summary": summary}) + "\n")


if __name__ == "__main__":
    main()
