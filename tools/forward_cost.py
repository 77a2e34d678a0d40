"""What a causal model's cached forward costs as the number of tokens it verifies grows (JSONL, one row per count).

Speculative decoding trades forwards for wider forwards: a step that verifies k drafted tokens runs the target once
over k + 1 positions. Whether that pays depends on how a forward's time grows with its width on the machine at hand,
which this measures: the target's forward through the same adapter the speculative loop uses (KV cache of
`--context` tokens, logits for every new position), the median of `--reps` timed calls per width, and the share of
it spent in matrix products (torch profiler, a separate pass). `tools/measured.py` quotes the results in docs/spec.md
(`cost:` keys). The model runs on the CPU unless `--device` names another (on a GPU each timed call waits for the
device).

    python tools/forward_cost.py --model zoo:ar-small --out docs/results/cost/ar-small.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.jobs import machine  # noqa: E402

WIDTHS = [1, 2, 3, 4, 6, 8, 11, 16, 32, 71]  # 11: a spec.pld step (10 drafted); 71: spec.recycling's tree
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")


def primed(model, context: torch.Tensor):
    """A fresh KV cache holding `context` `[1, n]`."""
    cache = model.new_cache()
    model.forward(context, torch.arange(context.shape[1], device=context.device)[None], cache)
    return cache


def new_tokens(model, n: int, width: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`width` random tokens and their positions after `n` cached ones (drawn on the CPU, put on the model's device)."""
    ids = torch.randint(4, model.vocab_size, (1, width), generator=gen).to(model.device)
    return ids, torch.arange(n, n + width, device=model.device)[None]


def timed_forwards(
    model, context: torch.Tensor, widths: list[int], reps: int, gen: torch.Generator
) -> dict[int, list[float]]:
    """Seconds of `reps` forwards of each width of new tokens after the same cached context (trimmed back each time).

    The widths take turns, one forward each per round, so that a slow spell of a shared machine falls on all of
    them alike (timing one width after another let such spells move single widths by a third).
    """
    caches = {width: primed(model, context) for width in widths}
    times: dict[int, list[float]] = {width: [] for width in widths}
    for _ in range(reps + 3):  # the first rounds warm up allocators and kernels
        for width in widths:
            ids, pos = new_tokens(model, context.shape[1], width, gen)
            sync(model)
            start = time.perf_counter()
            model.forward(ids, pos, caches[width], num_logits=width)
            sync(model)
            times[width].append(time.perf_counter() - start)
            caches[width].trim(width)
    return {width: t[3:] for width, t in times.items()}


def sync(model) -> None:
    """Wait for the device's queued work (on a GPU a forward returns before it ran)."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def matmul_share(model, context: torch.Tensor, width: int, reps: int, gen: torch.Generator) -> float:
    """Share of the forwards' CPU time spent in matrix products (the weights' reads and the arithmetic)."""
    from torch.profiler import ProfilerActivity, profile

    cache = primed(model, context)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            ids, pos = new_tokens(model, context.shape[1], width, gen)
            model.forward(ids, pos, cache, num_logits=width)
            cache.trim(width)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    mm = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    return mm / total if total else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:ar-small")
    parser.add_argument("--context", type=int, default=40, help="cached tokens before the timed forward")
    parser.add_argument("--widths", type=int, nargs="+", default=WIDTHS, help="tokens per timed forward")
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where the model runs (the figures are the CPU's)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if min(args.widths) < 1 or args.reps < 1 or args.context < 1:
        parser.error("--widths, --reps and --context must be at least 1")
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model, device=args.device)
    if model.kind != "causal":
        parser.error(f"{args.model} is a {model.kind} model; this measures causal models' cached forwards")
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(4, model.vocab_size, (1, args.context), generator=gen).to(model.device)
    where = dict(machine(model.device), torch=torch.__version__)  # the bench rows' description of the machine
    rows = []
    timed = timed_forwards(model, context, args.widths, args.reps, gen)
    for width, times in timed.items():
        rows.append({"model": args.model, "context": args.context, "width": width, "reps": args.reps,
                     "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
                     "matmul_share": matmul_share(model, context, width, max(5, args.reps // 4), gen),
                     "machine": where})
    one = rows[0]["median_ms"] if rows[0]["width"] == 1 else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows:
            row["over_width_1"] = row["median_ms"] / one if one else None
            f.write(json.dumps(row) + "\n")
    for row in rows:
        ratio = f"{row['over_width_1']:.2f}x" if one else ""
        share = 100 * row["matmul_share"]
        print(f"width {row['width']:3d}: {row['median_ms']:6.2f} ms {ratio:>7}  matmul {share:.0f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
