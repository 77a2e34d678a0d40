"""The report of `make results-sparse`: tables and a figure from DIR/accuracy.jsonl and DIR/speed.jsonl.

    python tools/sparse_report.py docs/results/sparse      # writes DIR/report.md and DIR/sparse.png
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean, median


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def key(row: dict) -> tuple[str, int]:
    return row["method"], row["budget"] or 0


def table_accuracy(rows: list[dict]) -> list[str]:
    contexts = sorted({r["context"] for r in rows}, key=lambda c: int(c[:-1]))
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[key(r)][r["context"]].append(r)
    head = "| method | budget | " + " | ".join(
        f"{c}: score / agree / KV read MB/token" for c in contexts) + " | KV held, MB (longest context) |"
    out = [head, "|" + "---|" * (3 + len(contexts))]
    for (m, b), per in sorted(groups.items(), key=lambda kv: (kv[0][0] != "ar.greedy", kv[0])):
        cells = []
        for c in contexts:
            rs = per.get(c, [])
            if not rs:
                cells.append("")
                continue
            cells.append(f"{mean(r['score'] for r in rs):.2f} / {mean(r['agree'] for r in rs):.2f} / "
                         f"{mean(r['kv_read_bytes_per_token'] for r in rs) / 1e6:.1f}")
        held = per.get(contexts[-1], [])
        out.append(f"| {m} | {b or '—'} | " + " | ".join(cells)
                   + f" | {mean(r['kv_held_bytes'] for r in held) / 1e6:.1f} |" if held else " |")
    return out


def table_speed(rows: list[dict]) -> list[str]:
    contexts = sorted({r["context"] for r in rows}, key=lambda c: int(c[:-1]))
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[key(r)][r["context"]].append(r)
    out = ["| method | budget | " + " | ".join(f"{c}: tokens/s / speed-up / KV read MB/token" for c in contexts)
           + " |", "|" + "---|" * (2 + len(contexts))]
    for (m, b), per in sorted(groups.items(), key=lambda kv: (kv[0][0] != "ar.greedy", kv[0])):
        cells = []
        for c in contexts:
            rs = per.get(c, [])
            cells.append(f"{median(r['tokens_per_s'] for r in rs):.1f} / {median(r['speedup'] for r in rs):.2f}x / "
                         f"{mean(r['kv_read_bytes_per_token'] for r in rs) / 1e6:.1f}" if rs else "")
        out.append(f"| {m} | {b or '—'} | " + " | ".join(cells) + " |")
    return out


def figure(acc: list[dict], speed: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    solved = solved_tasks(acc)
    methods = sorted({r["method"] for r in acc + speed if r["method"] != "ar.greedy"})
    for m in methods:
        pts = defaultdict(list)
        for r in acc:
            if r["method"] == m:
                pts[r["budget"]].append(r)
        bs = sorted(pts)
        if bs:
            axes[0].plot(bs, [mean([r["score"] for r in pts[b] if r["task"] in solved] or [0.0]) for b in bs],
                         marker="o", label=m)
            axes[1].plot(bs, [mean(r["agree"] for r in pts[b]) for b in bs], marker="o", label=m)
            axes[2].plot(bs, [mean(r["kv_read_bytes_per_token"] / r["kv_dense_read_bytes_per_token"]
                                   for r in pts[b]) for b in bs], marker="o", label=m)
        sp = defaultdict(list)
        for r in speed:
            if r["method"] == m and r["context"] == max((x["context"] for x in speed), key=lambda c: int(c[:-1])):
                sp[r["budget"]].append(r["speedup"])
        bs = sorted(sp)
        if bs:
            axes[3].plot(bs, [median(sp[b]) for b in bs], marker="o", label=m)
    dense = [r["score"] for r in acc if r["method"] == "ar.greedy" and r["task"] in solved]
    if dense:
        axes[0].axhline(mean(dense), color="black", lw=1.0, ls="--", label="dense greedy")
    for ax, title in zip(axes, ("task accuracy on the tasks dense greedy solves (1k-4k)",
                                "agreement with dense greedy (1k-4k)", "KV bytes read / dense (1k-4k)",
                                "decode speed-up over dense (longest context)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget (tokens per head)")
        ax.set_title(title, fontsize=10)
    axes[3].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_ylim(0.0, 1.05)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def solved_tasks(acc: list[dict]) -> set[str]:
    """The tasks (at a length) on which dense greedy scores above zero: where a rule's accuracy can be read."""
    return {r["task"] for r in acc if r["method"] == "ar.greedy" and r["score"] > 0}


def table_tasks(rows: list[dict]) -> list[str]:
    """Accuracy per task (all lengths) of every method and budget."""
    ops = sorted({r["task"].split("@")[0] for r in rows})
    groups: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[key(r)][r["task"].split("@")[0]].append(r["score"])
    out = ["| method | budget | " + " | ".join(o.removeprefix("longctx.") for o in ops) + " |",
           "|" + "---|" * (2 + len(ops))]
    for (m, b), per in sorted(groups.items(), key=lambda kv: (kv[0][0] != "ar.greedy", kv[0])):
        out.append(f"| {m} | {b or '—'} | " + " | ".join(f"{mean(per[o]):.2f}" if per[o] else "" for o in ops) + " |")
    return out


def describe(rows: list[dict]) -> str:
    if not rows:
        return ""
    r = rows[0]
    rope = "" if r.get("rope") in (None, "none") else f", positions stretched `{r['rope']}`"
    return f"`{r.get('model')}`{rope}, {r.get('dtype')}, {r.get('threads')} thread(s)"


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/sparse")
    acc, speed = load(folder / "accuracy.jsonl"), load(folder / "speed.jsonl")
    selfspec = load(folder / "selfspec.jsonl")
    lines = ["# Sparse decoding results", "",
             "Made by `make results-sparse` (tools/sparse_results.py). score: the task's exact scorer; agree: the "
             "share of the dense greedy answer reproduced before the first differing token; KV read: key and value "
             "bytes read per generated token (all layers, what a rule reads to choose included); KV held: what the "
             "rule must keep (this cache keeps everything).", ""]
    if acc:
        items = sum(r["method"] == "ar.greedy" for r in acc)
        lines += [f"## Accuracy and bytes ({describe(acc)}; {items} test items over the longctx tasks and lengths)",
                  "", "Mean over every task at each length:", "", *table_accuracy(acc), "",
                  "Accuracy per task (1k, 2k and 4k together):", "", *table_tasks(acc), ""]
    if speed:
        lines += [f"## Decode speed ({describe(speed)}; longctx.passkey, decode steps only; medians over interleaved "
                  "repeats, each speed-up against the dense run of its own repeat)", "",
                  *table_speed(speed), ""]
    if selfspec:
        lines += [f"## spec.sparse_self against ar.greedy ({describe(selfspec)}; longctx.passkey, 48 tokens; decode "
                  "time after the first step, which holds the prefill)", "",
                  "| context | method | budget | identical to ar.greedy | accepted / proposed | decode s | speed-up |",
                  "|---|---|---|---|---|---|---|"]
        for r in selfspec:
            lines.append(f"| {r['context']} | {r['method']} | {r['budget'] or '—'} | {r.get('identical', True)} | "
                         f"{r.get('accepted', '—')} / {r.get('proposed', '—')} | {r['decode_s']} | {r['speedup']}x |")
        lines.append("")
    if figure(acc, speed, folder / "sparse.png"):
        lines += ["![accuracy, agreement, bytes and speed-up against the budget](sparse.png)", ""]
    (folder / "report.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
