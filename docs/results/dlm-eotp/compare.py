"""Each configuration of options.jsonl beside its method's plain configuration on the same items: accuracy, TPF,
forwards per item (the plain method's in brackets) and how many answers are token for token the plain method's.

Run from the repository root: `python docs/results/dlm-eotp/compare.py docs/results/dlm-eotp/options.jsonl`.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

DEFAULTS = {"eotp": False, "eotp_keep": False, "recap": None, "recap_warmup": 0, "cache": "none",
            "fallback": "top1", "block_steps": None, "threshold": 0.9, "confidence_eos_eot_inf": False,
            "window_tokens": 64, "active_tokens": 16}


def label(row: dict) -> str:
    bits = [f"{k}={row['params'][k]}" for k in DEFAULTS if k in row["params"] and row["params"][k] != DEFAULTS[k]]
    return row["method"] + (":" + ",".join(bits) if bits else "")


def figures(rows: list[dict]) -> tuple[float, float, float]:
    forwards = sum(r["forwards"] for r in rows)
    return (100 * sum(r["score"] for r in rows) / len(rows), sum(r["new_tokens"] for r in rows) / forwards,
            forwards / len(rows))


def main(path: str) -> None:
    configs: dict[str, dict] = defaultdict(dict)
    for line in open(path):
        row = json.loads(line)
        if "method" in row:
            configs[label(row)][(row["task"], row["item"])] = row  # the plain baseline of both runs: same tokens
    print("| configuration | items | accuracy | TPF | forwards/item | same tokens as plain |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in sorted(configs.items()):
        plain = configs[name.split(":")[0]]
        keys = [k for k in rows if k in plain]
        a, t, f = figures([rows[k] for k in keys])
        pa, pt, pf = figures([plain[k] for k in keys])
        same = sum(rows[k]["token_ids"] == plain[k]["token_ids"] for k in keys)
        print(f"| `{name}` | {len(keys)} | {a:.1f} % ({pa:.1f} %) | {t:.2f} ({pt:.2f}) | {f:.1f} ({pf:.1f}) "
              f"| {same}/{len(keys)} |")


if __name__ == "__main__":
    main(sys.argv[1])
