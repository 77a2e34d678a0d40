"""Acceptance per draft position of the trained drafters (docs/results/learned/*.jsonl) as one plot and a table.

For each method and suite: the share of target forwards whose draft position k was accepted (position 1 = the
first drafted token), summed over the rows of the runs, and τ (tokens per target forward). Usage:
    python tools/learned_plot.py docs/results/learned/*.jsonl --out docs/results/learned/acceptance.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def label(row: dict) -> str:
    """The method with the parameters its row sets away from their defaults (e.g. `spec.medusa:hydra=True`)."""
    import dataclasses

    import fastdecode

    defaults = dataclasses.asdict(fastdecode.get_method(row["method"]).config())
    params = {k: v for k, v in row.get("params", {}).items() if k != "max_new_tokens" and defaults.get(k) != v}
    return row["method"] + (":" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) if params else "")


def acceptance(paths: list[Path]) -> dict[tuple[str, str], dict]:
    """(suite, method label) -> {"tau", "per_position", "items"} over every row of `paths` that drafts."""
    sums: dict[tuple[str, str], dict] = defaultdict(lambda: {"tokens": 0, "forwards": 0, "pos": [], "items": 0})
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if not row.get("accepted_per_position") and not row.get("proposed"):
                continue
            s = sums[(row["suite"], label(row))]
            s["tokens"] += row["new_tokens"]
            s["forwards"] += row["forwards"]
            s["items"] += 1
            for k, a in enumerate(row["accepted_per_position"]):
                if k == len(s["pos"]):
                    s["pos"].append(0)
                s["pos"][k] += a
    return {key: {"tau": s["tokens"] / s["forwards"], "items": s["items"],
                  "per_position": [a / s["forwards"] for a in s["pos"]]}
            for key, s in sorted(sums.items()) if s["forwards"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/results/learned/acceptance.png"))
    parser.add_argument("--positions", type=int, default=6, help="draft positions shown")
    args = parser.parse_args()
    table = acceptance(args.results)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = sorted({suite for suite, _ in table})
    fig, axes = plt.subplots(1, len(suites), figsize=(5.5 * len(suites), 4), squeeze=False)
    for ax, suite in zip(axes[0], suites, strict=True):
        for (s, method), m in table.items():
            if s != suite:
                continue
            ys = m["per_position"][: args.positions]
            ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{method} (τ {m['tau']:.2f})")
        ax.set_title(f"zoo:ar-small, {suite}")
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted, share of target forwards")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print("| suite | method | τ | accepted at draft position 1, 2, 3, ... | items |")
    print("|---|---|---|---|---|")
    for (suite, method), m in table.items():
        pos = ", ".join(f"{a:.2f}" for a in m["per_position"][: args.positions])
        print(f"| {suite} | `{method}` | {m['tau']:.2f} | {pos} | {m['items']} |")
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
