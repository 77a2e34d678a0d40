"""Tokens/s of a batch generated in one call against the same prompts one at a time (JSONL, one row per method).

A batched call of `ar.*` runs one forward per step for all rows; a batched call of a `spec.*` method verifies
every row's draft in one target forward per step over the shared preallocated cache (rows accept different
counts). This measures what that buys on the machine at hand: the prompts of a suite, `--batch` at a time,
generated once as a batch and once row by row, the two taking turns per batch so that a slow spell of a shared
machine falls on both; the outputs are checked equal (greedy). Ratios within a row are what to read.

    python tools/batch_speed.py --model zoo:ar-small --suite code --limit 8 --batch 8 \
        --methods ar.greedy spec.suffix spec.pld --out docs/results/batch.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.jobs import machine  # noqa: E402
from fastdecode.bench.suites import get_suite  # noqa: E402
from fastdecode.bench.tasks import format_prompt  # noqa: E402


def prompts_of(suite: str, limit: int) -> list[str]:
    items = [item for task, seed, n in get_suite(suite).plan(limit=limit) for item in task.items(seed, n)]
    return [format_prompt(item.prompt) for item in items]


def timed(model, prompts: list[str], method: str, batched: bool, max_new: int) -> tuple[float, int, int, list]:
    """(seconds, generated tokens, target forwards, token ids) of one pass over `prompts`."""
    start = time.perf_counter()
    if batched:
        results = fastdecode.generate(model, prompts, method, max_new_tokens=max_new)
        forwards = max(r.stats.forwards for r in results)  # rows share their forwards
    else:
        results = [fastdecode.generate(model, p, method, max_new_tokens=max_new) for p in prompts]
        forwards = sum(r.stats.forwards for r in results)
    seconds = time.perf_counter() - start
    return seconds, sum(r.stats.new_tokens for r in results), forwards, [r.token_ids for r in results]


def measure(model, prompts: list[str], method: str, batch: int, max_new: int, reps: int) -> dict:
    groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    totals = {True: [0.0, 0, 0], False: [0.0, 0, 0]}
    equal = True
    timed(model, groups[0][:2], method, True, 8)  # warm-up
    for _ in range(reps):
        for group in groups:
            outs = {}
            for batched in (True, False):  # taking turns per group
                seconds, tokens, forwards, ids = timed(model, group, method, batched, max_new)
                totals[batched][0] += seconds
                totals[batched][1] += tokens
                totals[batched][2] += forwards
                outs[batched] = ids
            equal = equal and outs[True] == outs[False]
    rate = {b: totals[b][1] / totals[b][0] for b in totals}
    return {
        "method": method, "batch": batch, "prompts": len(prompts), "reps": reps, "max_new_tokens": max_new,
        "tokens_per_s_batched": round(rate[True], 2), "tokens_per_s_one_by_one": round(rate[False], 2),
        "speedup": round(rate[True] / rate[False], 3),
        "forwards_batched": totals[True][2], "forwards_one_by_one": totals[False][2],
        "equal_outputs": equal,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--suite", default="code")
    ap.add_argument("--limit", type=int, default=8, help="items per task of the suite")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--methods", nargs="+", default=["ar.greedy", "spec.suffix", "spec.pld"])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model)
    prompts = prompts_of(args.suite, args.limit)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for method in args.methods:
            row = {"model": args.model, "suite": args.suite, "threads": args.threads, "machine": machine(model.device),
                   **measure(model, prompts, method, args.batch, args.max_new_tokens, args.reps)}
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps(row))


if __name__ == "__main__":
    main()
