"""τ, acceptance per draft position and the draft cost c of each speculative configuration in bench rows: c is the
time of one draft forward in target steps (draft_s / draft_forwards over the baseline's wall_s / forwards, pooled over
the same suite), the term of the speed model S = τ / (k·c + v(n)) in docs/learned-eagle3.md.

    python tools/draft_cost.py docs/results/learned/eagle3.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        params = {k: v for k, v in (r.get("params") or {}).items() if k != "max_new_tokens"}  # a task's budget
        groups[(r["suite"], r["method"], json.dumps(params, sort_keys=True))].append(r)
    for (suite, method, params), rs in sorted(groups.items()):
        base = [r for (s, m, _), g in groups.items() if s == suite and m == "ar.greedy" for r in g]
        step = sum(r["wall_s"] for r in base) / max(1, sum(r["forwards"] for r in base))
        forwards = sum(r["forwards"] for r in rs)
        tau = sum(r["new_tokens"] for r in rs) / forwards
        depth = max((len(r.get("accepted_per_position") or []) for r in rs), default=0)
        per = [sum((r.get("accepted_per_position") or [0] * depth)[k] if k < len(r.get("accepted_per_position") or [])
                   else 0 for r in rs) / forwards for k in range(depth)]
        drafts = sum(r.get("draft_forwards") or 0 for r in rs)
        c = (sum(r.get("draft_s") or 0 for r in rs) / drafts) / step if drafts and step else 0.0
        speed = (sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)) / (
            sum(r["new_tokens"] for r in base) / sum(r["wall_s"] for r in base)) if base else 0.0
        v = sum(r.get("verify_s") or 0 for r in rs) / forwards / step if step else 0.0
        shown = {k: v for k, v in json.loads(params).items() if k in ("tree", "num_draft_tokens", "total_tokens")}
        print(json.dumps({"suite": suite, "method": method, "params": shown, "items": len(rs), "v": round(v, 2),
                          "tau": round(tau, 3), "speedup": round(speed, 3), "draft_forwards_per_step":
                          round(drafts / forwards, 2), "c": round(c, 3),
                          "accept_per_position": [round(a, 3) for a in per]}))


if __name__ == "__main__":
    main(sys.argv[1])
