"""What bounds the tokens per forward of zoo:dlm-small and its dParallel student on parallel-lists (docs/diffusion.md,
"dParallel"), from the committed bench rows (`make results-dlm-dparallel`).

For each model and rule: accuracy and TPF per task, the share of the suite's forwards each task takes, and two
ceilings. `floor` is the TPF a block rule would reach committing every block in one forward (at least one forward per
block of 16 that holds answer tokens: ceil(tokens / 16) each item); `tpf_deterministic`, the TPF on the tasks with
one right answer, is what the suite would reach if the tasks with several (shuffle and the *_random edits) ran as
fast as they do.

    python tools/dparallel_bound.py docs/results/dparallel/dlm-dparallel.jsonl [--out FILE.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from pathlib import Path

BLOCK = 16


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bound(rows: list[dict], random_tasks: set[str]) -> dict:
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for r in rows:
        groups[(r["model"], r["method"])].append(r)
    out = {}
    for (model, method), rs in sorted(groups.items()):
        tokens = sum(r["new_tokens"] for r in rs)
        forwards = sum(r["forwards"] for r in rs)
        per_task: dict[str, dict] = {}
        for task in sorted({r["task"] for r in rs}):
            t = [r for r in rs if r["task"] == task]
            tt, ff = sum(r["new_tokens"] for r in t), sum(r["forwards"] for r in t)
            per_task[task] = {"acc": round(sum(r["score"] for r in t) / len(t), 3), "tpf": round(tt / ff, 2),
                              "forward_share": round(ff / forwards, 3)}
        det = [r for r in rs if r["task"] not in random_tasks]
        det_tpf = sum(r["new_tokens"] for r in det) / sum(r["forwards"] for r in det)
        rnd_tokens = sum(r["new_tokens"] for r in rs if r["task"] in random_tasks)
        floor = tokens / sum(math.ceil(r["new_tokens"] / BLOCK) for r in rs)
        out[f"{model} {method}"] = {
            "items": len(rs), "acc": round(sum(r["score"] for r in rs) / len(rs), 4),
            "tpf": round(tokens / forwards, 2),
            "tpf_deterministic": round(det_tpf, 2),
            "tpf_random": round(rnd_tokens / max(1, forwards - sum(r["forwards"] for r in det)), 2),
            "random_forward_share": round(1 - sum(r["forwards"] for r in det) / forwards, 3),
            "ceiling_floor": round(floor, 2), "per_task": per_task,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from fastdecode.bench.tasks import TASKS

    rows = _rows(args.results)
    random_tasks = {r["task"] for r in rows if not TASKS[r["task"]].deterministic}
    result = bound(rows, random_tasks)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    for key, v in result.items():
        print(f"{key}: acc {v['acc']:.3f} TPF {v['tpf']:.2f} (deterministic tasks {v['tpf_deterministic']:.2f}, "
              f"several-answer tasks {v['tpf_random']:.2f} taking {v['random_forward_share']:.0%} of the forwards; "
              f"one forward per block would give {v['ceiling_floor']:.2f})")


if __name__ == "__main__":
    main()
