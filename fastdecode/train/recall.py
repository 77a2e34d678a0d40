"""zoo:ar-long's next recipe (docs/zoo.md, "ar-long", trial H): a model built from scratch for lookup, taught
multi-query associative recall (MQAR, the Zoology set-up) with single-token keys first, then the `longctx` suite's
multi-token keys at short contexts, then length.

    python -m fastdecode.train.recall --out DIR --threads 1     # every stage of RECIPE; rerun the same to resume

Why this order: the previous recipe (ar-small's weights and a length curriculum, trials A-G) never left guessing on
the keyed lookups. A lookup needs the asked key carried to the answer position and matched against every record
(an induction-style circuit); MQAR rows hold nothing else, so the circuit is the only way to lower their loss, and
single-token keys make it the shortest one (one previous-token head, one matching head). The suite's keys are 3-4
tokens ("QWERT" -> ' Q', 'W', 'ER', 'T') and its values 5-7 digit tokens: the next stage mixes MQAR rows with the
suite's tasks so the circuit is kept while it is widened to multi-token keys and multi-token answers.

An MQAR row (token ids, no text): BOS, `pairs` records `k v` (keys distinct, drawn from one half of the tokenizer's
non-special vocabulary, values from the other half), then `queries` of the keys again, each followed by its value;
the loss is on the queried values only.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from ..bench.tasks.longctx import OPS
from ..errors import ParameterError
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint
from .export import save_folder
from .long import _batch, exact_match
from .loop import cpu_bf16_is_fast


@dataclass(frozen=True)
class Pools:
    """The token ids MQAR keys and values are drawn from: two disjoint halves of the non-special vocabulary."""

    keys: tuple[int, ...]
    values: tuple[int, ...]


def mqar_pools(tokenizer, size: int = 0, seed: int = 0) -> Pools:
    """Split the tokenizer's non-special ids in two at random (fixed `seed`), `size` ids each (0: every id): keys
    never look like values. A smaller pool means each key and value is seen more often per step."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    random.Random(seed).shuffle(ids)
    half = min(size or len(ids) // 2, len(ids) // 2)
    return Pools(tuple(sorted(ids[:half])), tuple(sorted(ids[half : 2 * half])))


def mqar_batch(pools: Pools, bos: int, n: int, pairs: int, queries: int,
               rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` MQAR rows of `pairs` records and `queries` queries: ids [n, 1 + 2*pairs + 2*queries] and the mask
    [n, T-1] of the next-token targets that are queried values."""
    if queries > pairs or pairs > len(pools.keys):
        raise ParameterError(f"MQAR needs queries <= pairs <= {len(pools.keys)} keys (got {queries} queries, "
                             f"{pairs} pairs): lower --queries or --pairs.")
    width = 1 + 2 * pairs + 2 * queries
    ids = torch.empty(n, width, dtype=torch.long)
    mask = torch.zeros(n, width - 1, dtype=torch.bool)
    for r in range(n):
        keys = rng.sample(pools.keys, pairs)
        values = [rng.choice(pools.values) for _ in keys]
        asked = rng.sample(range(pairs), queries)
        row = [bos] + [t for kv in zip(keys, values, strict=True) for t in kv]
        row += [t for a in asked for t in (keys[a], values[a])]
        ids[r] = torch.tensor(row)
        mask[r, 2 * pairs + 1 :: 2] = True  # predicting each query's value from its key
    return ids, mask


@dataclass(frozen=True)
class Shape:
    """The from-scratch model (why this shape: `new_model`)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    mlp: int = 384
    rope_theta: float = 100_000.0
    positions: int = 16384
    tie: bool = True


def new_model(tokenizer, shape: Shape, seed: int) -> LlamaForCausalLM:
    """A Llama of `shape` with the zoo tokenizer's vocabulary, randomly initialised (`seed`).

    Narrow heads (4 of 32 dims at hidden 128; ar-small has 5 of 64 at 320): a lookup over multi-token keys needs
    several heads at once (previous-token heads that gather a key's pieces, a matching head, a copying head for
    each further answer digit), and a head's cost is its width, so narrow heads buy circuits cheaply; Zoology's
    attention models solve MQAR from width 64 up. Four layers: two make an induction circuit, the others gather
    multi-token keys and continue multi-token answers. Small enough for 0.8 s per 32-row MQAR step on one
    thread of this CPU (hidden 256 / 8 heads: 1.7 s; 192 / 6 heads: 1.3 s): on a CPU the steps bound the recipe.
    RoPE base 100,000 and 16,384 positions from the start: the length stage then grows contexts without changing
    positions (trial G's base change first sent the pass key back to guessing)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        head_dim=shape.hidden // shape.heads, max_position_embeddings=shape.positions, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta}, tie_word_embeddings=shape.tie,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(cfg).float()


@dataclass(frozen=True)
class RecallStage:
    """One stage: `tasks` is a rotation of `mqar` and the suite's ops (repeats weight one); suite rows are
    `start`-`end` tokens (growing over the first `ramp` of the stage) with `questions` questions each, MQAR rows
    have `pairs // 4` to `pairs` records (drawn per step; half of them queried, at most `queries`) from pools of
    `pool` keys and values; `batch_tokens`, when set, makes rows per step = it // length."""

    name: str
    steps: int
    lr: float
    tasks: str
    batch: int = 16
    pairs: int = 32
    queries: int = 16
    min_pairs: int = 0  # 0: pairs // 4
    pool: int = 512
    start: int = 160
    end: int = 448
    ramp: float = 0.0
    questions: int = 8
    batch_tokens: int = 0


RECIPE = (
    RecallStage("mqar", steps=1600, lr=2e-3, tasks="mqar", batch=32, pairs=16, min_pairs=4, queries=8, pool=128),
    RecallStage("keys", steps=900, lr=1e-3, tasks="mqar,kv,multikey,kv,multikey,passkey,after,vartrack", batch=8,
                pairs=16, min_pairs=4, queries=8, pool=128),
    RecallStage("length", steps=120, lr=5e-4, tasks="mqar,kv,multikey,passkey,kv,multikey,after,vartrack",
                pairs=16, min_pairs=4, queries=8, pool=128, start=448, end=2048, ramp=0.6, batch_tokens=4096),
)


def _step_batch(stage: RecallStage, step: int, tokenizer, pools: Pools, rng: random.Random):
    """The step's rows, from its own rng: ids [B, T], loss mask [B, T-1], the task and the length drawn."""
    op = stage.tasks.split(",")[step % len(stage.tasks.split(","))]
    done = step / max(1, stage.steps)
    frac = min(1.0, done / stage.ramp) if stage.ramp > 0 else 1.0
    top = int(stage.start + (stage.end - stage.start) * frac)
    context = rng.randint(max(128, top // 2), max(128, top))
    if op == "mqar":
        pairs = rng.randint(max(2, stage.min_pairs or stage.pairs // 4), stage.pairs)
        queries = max(1, min(stage.queries, pairs // 2))
        rows = max(1, stage.batch_tokens // (4 * stage.pairs)) if stage.batch_tokens else stage.batch
        ids, mask = mqar_batch(pools, tokenizer.bos_token_id, rows, pairs, queries, rng)
        return ids, mask, op
    task = {cls.op: cls for cls in OPS}[op]("1k")
    rows = max(1, stage.batch_tokens // context) if stage.batch_tokens else stage.batch
    ids, mask = _batch(tokenizer, task, context, rows, rng, stage.questions)  # train seeds only
    return ids, mask, op


def _lr(stage: RecallStage, step: int) -> float:
    """Warm-up 20 steps, cosine to 55 % of the rate (long.py's schedule)."""
    return stage.lr * min(1.0, (step + 1) / 20) * (0.55 + 0.45 * math.cos(math.pi * step / max(1, stage.steps)))


def _loss(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the masked targets; bfloat16 autocast on a GPU, and on a CPU where it is fast."""
    ids, mask = ids.to(model.device), mask.to(model.device)
    kind = model.device.type
    with torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda" or cpu_bf16_is_fast()):
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1][mask]  # [N, H], the supervised positions
        return F.cross_entropy(model.lm_head(hidden).float(), ids[:, 1:][mask])


def train_stage(model, tokenizer, stage: RecallStage, seed: int, out: Path, start_step: int = 0,
                opt: torch.optim.Optimizer | None = None, every: int = 50,
                on_step: Callable[[dict], None] | None = None, record: dict | None = None) -> list[dict]:
    """Train `model` in place from `start_step` to `stage.steps`, checkpointing to out/checkpoint every `every`
    steps (the record carries `record` and where the run is). Each step draws its rows from (seed, stage, step), so
    a resumed run sees the rows an uninterrupted one would."""
    pools = mqar_pools(tokenizer, stage.pool)
    opt = opt or torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    log: list[dict] = []
    began = time.perf_counter()
    for step in range(start_step, stage.steps):
        rng = random.Random(f"{seed}:{stage.name}:{step}")
        ids, mask, op = _step_batch(stage, step, tokenizer, pools, rng)
        for g in opt.param_groups:
            g["lr"] = _lr(stage, step)
        loss = _loss(model, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {"stage": stage.name, "step": step, "loss": round(loss.item(), 4), "task": op,
               "tokens": int(ids.shape[1]), "batch": int(ids.shape[0]), "lr": round(_lr(stage, step), 6),
               "elapsed_s": round(time.perf_counter() - began, 1)}
        log.append(row)
        if on_step is not None:
            on_step(row)
        if record is not None and ((step + 1) % every == 0 or step + 1 == stage.steps):
            spent = record.get("train_s", 0.0) + time.perf_counter() - began  # the run's seconds, all sessions
            save_checkpoint(out, {"model": model}, {"opt": opt},
                            {**record, "stage": stage.name, "step": step + 1, "train_s": spent})
    model.eval()
    return log


@torch.no_grad()
def mqar_accuracy(model, tokenizer, pairs: int, queries: int, n: int, pool: int = 0, seed: int = 1) -> float:
    """Share of queried values the model's argmax gets right, on `n` rows drawn from `seed` (not a training seed:
    training rows come from string seeds)."""
    model.eval()
    ids, mask = mqar_batch(mqar_pools(tokenizer, pool), tokenizer.bos_token_id, n, pairs, queries, random.Random(seed))
    pred = model(input_ids=ids.to(model.device)).logits[:, :-1].argmax(-1).cpu()  # [n, T-1]
    return float((pred[mask] == ids[:, 1:][mask]).float().mean())


def _stage_check(model, tokenizer, first: RecallStage, stage: RecallStage, items: int) -> dict:
    """What a stage's end row records: MQAR accuracy (at the first stage's setting) and, after a stage on the
    suite, teacher-forced exact match at that stage's longest contexts."""
    mq = mqar_accuracy(model, tokenizer, first.pairs, first.queries, 64, first.pool)
    suite = stage.tasks != "mqar"
    return {"mqar_accuracy": round(mq, 4), **({"exact_match": exact_match(model, tokenizer, [str(stage.end)], items)}
                                                if suite else {})}


def evaluate(model, tokenizer, stages: tuple[RecallStage, ...], sizes: list[str], items: int) -> dict:
    """MQAR accuracy at each stage's setting and the suite's teacher-forced exact match at `sizes`."""
    mq = {f"mqar@{s.pairs}x{s.queries}": mqar_accuracy(model, tokenizer, s.pairs, s.queries, 64, s.pool)
          for s in stages[:1]}
    return {"mqar_accuracy": mq, "exact_match_fp32": exact_match(model, tokenizer, sizes, items) if sizes else {}}


def run(out: Path, seed: int, threads: int, shape: Shape, stages: tuple[RecallStage, ...], sizes: list[str],
        items: int, log_path: Path | None = None, on_step: Callable[[dict], None] | None = None,
        status: Callable[[str], None] = lambda msg: None, device: str = "cpu") -> dict:
    """Every stage from a fresh model of `shape` (or from out/checkpoint when one of this run is there), then the
    evaluation; saves out/ (bfloat16) and out/trial.json."""
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(Path(__file__).parents[1] / "zoo" / "ar-small"))
    model = new_model(tokenizer, shape, seed)
    torch.nn.Module.to(model, torch.device(device))
    identity = {"seed": seed, "shape": asdict(shape), "stages": [asdict(s) for s in stages]}
    opts = {s.name: torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0)
            for s in stages}
    found = None
    for s in stages:  # which stage the checkpoint is in decides which optimiser's moments it holds
        where = out / "checkpoint" / "state.json"
        if where.is_file() and json.loads(where.read_text()).get("stage") == s.name:
            found = load_checkpoint(out, {"model": model}, {"opt": opts[s.name]}, identity)
            for state in opts[s.name].state.values():  # the moments come back on the CPU (AdamW keeps its step there)
                state.update({k: v if k == "step" else v.to(device) for k, v in state.items()})
    out.mkdir(parents=True, exist_ok=True)
    log_path = log_path or out / "progress.jsonl"
    began = time.perf_counter() - (found or {}).get("train_s", 0.0)
    with open(log_path, "a") as logf:
        def log_step(row: dict) -> None:
            logf.write(json.dumps(row) + "\n")
            logf.flush()
            if on_step is not None:
                on_step(row)

        names = [s.name for s in stages]
        first = names.index(found["stage"]) if found else 0
        for i, stage in enumerate(stages[first:], start=first):
            step0 = found["step"] if found and i == first else 0
            status(f"stage {stage.name}: steps {step0}-{stage.steps}")
            record = {**identity, "train_s": time.perf_counter() - began}
            train_stage(model, tokenizer, stage, seed, out, step0, opts[stage.name], on_step=log_step, record=record)
            log_step({"stage": stage.name, "end": True, **_stage_check(model, tokenizer, stages[0], stage, items),
                      "elapsed_s": round(time.perf_counter() - began, 1)})
        train_min = (time.perf_counter() - began) / 60
        status("evaluating")
        metrics = evaluate(model, tokenizer, stages, sizes, items)
        summary = {"recipe": "fastdecode.train.recall", "seed": seed, "shape": asdict(shape),
                   "stages": [asdict(s) for s in stages], "train_minutes": round(train_min, 1),
                   "bf16_autocast": cpu_bf16_is_fast(), "eval_items": items, **metrics}
        logf.write(json.dumps({"summary": summary}) + "\n")
    save_folder(model, tokenizer, out, [], dtype="bfloat16")
    (out / "trial.json").write_text(json.dumps(summary, indent=2))
    clear_checkpoint(out)
    return summary


def _stages(args) -> tuple[RecallStage, ...]:
    """RECIPE with --steps scaled: `a,b,c` steps per stage (0 skips a stage)."""
    if not args.steps:
        return RECIPE
    steps = [int(x) for x in args.steps.split(",")]
    if len(steps) != len(RECIPE):
        raise ParameterError(f"--steps takes {len(RECIPE)} counts, one per stage "
                             f"({', '.join(s.name for s in RECIPE)}), e.g. --steps 600,600,400")
    return tuple(type(s)(**{**asdict(s), "steps": n}) for s, n in zip(RECIPE, steps, strict=True) if n > 0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder; its checkpoint is resumed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", default="", help="steps per stage, comma-separated (default: RECIPE's)")
    ap.add_argument("--hidden", type=int, default=Shape.hidden)
    ap.add_argument("--layers", type=int, default=Shape.layers)
    ap.add_argument("--heads", type=int, default=Shape.heads)
    ap.add_argument("--mlp", type=int, default=Shape.mlp)
    ap.add_argument("--eval", default="384,1k,2k", help="suite lengths of the final exact match ('' for none)")
    ap.add_argument("--eval-items", type=int, default=10)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (a GPU runs the same steps, bf16 autocast)")
    args = ap.parse_args(argv)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    stages = _stages(args)
    shape = Shape(hidden=args.hidden, layers=args.layers, heads=args.heads, mlp=args.mlp)
    offset = {s.name: sum(p.steps for p in stages[:i]) for i, s in enumerate(stages)}
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as bar:
        task = bar.add_task("ar-long (recall)", total=sum(s.steps for s in stages), info="")

        def on_step(row: dict) -> None:  # a resumed run's bar starts where its checkpoint was
            if "loss" in row:
                bar.update(task, completed=offset[row["stage"]] + row["step"] + 1,
                           info=f"{row['stage']} {row['task']} loss {row['loss']:.3f}")

        sizes = [s for s in args.eval.split(",") if s]
        summary = run(Path(args.out), args.seed, args.threads, shape, stages, sizes, args.eval_items,
                      on_step=on_step, status=lambda msg: bar.console.print(msg), device=args.device)
    print(json.dumps({k: summary[k] for k in ("train_minutes", "mqar_accuracy", "exact_match_fp32")}, indent=2))


if __name__ == "__main__":
    main()
