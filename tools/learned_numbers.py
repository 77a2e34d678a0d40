"""The numbers a learned-drafter doc quotes, from a bench results file: per suite, run and method, τ (tokens per target
forward), the speed-up over the same run's ar.greedy rows (wall time summed over the run's items), the acceptance
rate per draft position (the share of target forwards whose position-k draft token was accepted), and the draft
cost c (seconds per draft forward over seconds per ar.greedy step of the same run).

    python tools/learned_numbers.py docs/results/learned/dflash.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Any

import fastdecode


def _changed(row: dict[str, Any]) -> dict[str, Any]:
    """The row's parameters that differ from its method's defaults (max_new_tokens aside)."""
    defaults = fastdecode.get_method(row["method"]).config()
    return {k: v for k, v in row["params"].items() if k != "max_new_tokens" and getattr(defaults, k, v) != v}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (suite, run, method configuration), baselines included."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        label = r["method"] + "".join(f":{k}={v}" for k, v in sorted(_changed(r).items()))
        groups[(r["suite"], r["run"], label)].append(r)
    out = []
    for (suite, run, label), rs in sorted(groups.items()):
        base = [b for (s, u, _), bs in groups.items() if (s, u) == (suite, run) for b in bs if b["is_baseline"]]
        step = sum(b["wall_s"] for b in base) / max(1, sum(b["forwards"] for b in base))
        forwards = sum(r["forwards"] for r in rs)
        drafts = sum(r["draft_forwards"] for r in rs)
        depth = max((len(r["accepted_per_position"]) for r in rs), default=0)
        per = [sum(r["accepted_per_position"][k] for r in rs if k < len(r["accepted_per_position"])) / forwards
               for k in range(depth)]
        out.append({
            "suite": suite, "run": run, "method": label, "items": len(rs),
            "equal_to_baseline": all(r["equal_to_baseline"] for r in rs),
            "tau": sum(r["new_tokens"] for r in rs) / forwards,
            "speedup": sum(b["wall_s"] for b in base) / sum(r["wall_s"] for r in rs) if base else None,
            "accept_per_position": [round(p, 3) for p in per],
            "draft_cost_c": (sum(r["draft_s"] for r in rs) / drafts) / step if drafts and step else None,
            "verify_steps": (sum(r["verify_s"] for r in rs) / forwards) / step if drafts and step else None,
        })
    return out


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    for s in summarise(rows):
        speed = f"{s['speedup']:.2f}x" if s["speedup"] else "-"
        cost = f" c={s['draft_cost_c']:.2f} v={s['verify_steps']:.2f}" if s["draft_cost_c"] else ""
        print(f"{s['suite']:15} {s['run']} {s['method']:28} items={s['items']:3} tau={s['tau']:.2f} "
              f"speedup={speed} equal={s['equal_to_baseline']}{cost} per-position={s['accept_per_position']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/learned/dflash.jsonl")
