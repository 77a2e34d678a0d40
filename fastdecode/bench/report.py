"""`fastdecode report`: bench JSONL rows -> Markdown tables, the ParallelBench leaderboard figure and PNG plots
(drawn by `plots.py`).

Per suite and model, each method configuration gets: accuracy (mean score), TPF (sum new tokens / sum
forwards), forwards per item, tokens/s (sum tokens / sum wall time over its rows, pooled over its runs), the
baseline's tokens/s computed the same way over the baseline rows of the same bench runs (the same file for rows
from before runs were named), the speed-up (the one divided by the other, so that a row's three columns agree
whatever the other runs of the file measured), and the share of items whose tokens equal the baseline's.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import read_rows
from .suites import BenchError
from .summary import Summary, model_label, summarize

LEADERBOARD_FRACTIONS = (0.80, 0.90, 0.95)  # of the baseline's accuracy (ParallelBench reports absolute 80/75/70 %)


@dataclass
class Report:
    markdown: str
    summaries: list[Summary]
    plots: list[Path]


def leaderboard(summaries: Sequence[Summary]) -> list[tuple[str, str, Summary, dict[float, Summary | None]]]:
    """Per (suite, model) and baseline configuration: per fraction, the highest-TPF configuration whose accuracy is
    at least that fraction of the baseline's (ParallelBench's leaderboard metric).

    A configuration is compared only with a baseline measured in the same file, as speed-ups are: two files on
    one suite may differ in what the baseline could reach (a longer canvas, another budget), so pooling them
    would rank a method against a baseline it never ran beside.
    """
    out = []
    for (suite, model), group in _grouped(summaries).items():
        for base in (s for s in group if s.is_baseline):
            mine = [s for s in group if not base.sources or set(s.sources) & set(base.sources)]
            best: dict[float, Summary | None] = {}
            for frac in LEADERBOARD_FRACTIONS:
                fit = [s for s in mine if s.accuracy >= frac * base.accuracy - 1e-12]
                best[frac] = max(fit, key=lambda s: s.tpf, default=None)
            out.append((suite, model, base, best))
    return out


def _grouped(summaries: Sequence[Summary]) -> dict[tuple[str, str], list[Summary]]:
    groups: dict[tuple[str, str], list[Summary]] = defaultdict(list)
    for s in summaries:
        groups[(s.suite, s.model)].append(s)
    return dict(groups)


# -- Markdown --------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def method_table(group: Sequence[Summary]) -> list[str]:
    lines = [
        "| method | accuracy | TPF (tokens/forward) | forwards/item | draft forwards/item | tokens/s "
        "| baseline tokens/s (same runs) | speed-up | = baseline | acceptance | items | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in group:
        name = f"**{s.label}** (baseline)" if s.is_baseline else s.label
        lines.append(
            f"| {name} | {_pct(s.accuracy)} | {s.tpf:.2f} | {s.forwards_per_item:.1f} "
            f"| {s.draft_forwards_per_item:.1f} "
            f"| {s.tokens_per_s:.1f} | {_num(s.baseline_tokens_per_s, 1)} "
            f"| {_num(s.speedup, 2, '×')}{' †' if s.baseline_other_run else ''} "
            f"| {_pct(s.equal_rate)} | {_pct(s.acceptance_rate)} | {s.items} | {s.peak_rss_mb:.0f} |"
        )
    if any(s.baseline_other_run for s in group):
        lines += ["", "† its bench runs measured no baseline rows (a later run added it to a file that had them): the "
                  "speed-up is against the baseline rows of the file's other runs, on a machine whose speed may "
                  "have moved since."]
    return lines


def time_table(group: Sequence[Summary]) -> list[str]:
    """Where a speculative method's wall time goes: drafting, verification, the rest (empty if nothing was timed)."""
    timed = [s for s in group if s.draft_share is not None]
    if not timed:
        return []
    lines = ["| method | drafting | verification | other (roll-back, bookkeeping) |", "|---|---:|---:|---:|"]
    for s in timed:
        assert s.draft_share is not None and s.verify_share is not None  # a timed run sets both
        other = max(0.0, 1 - s.draft_share - s.verify_share)
        lines.append(f"| {s.label} | {_pct(s.draft_share)} | {_pct(s.verify_share)} | {_pct(other)} |")
    return lines


def task_table(group: Sequence[Summary], tpf: bool = False) -> list[str]:
    """Accuracy (or, with `tpf`, tokens per forward) per task and configuration."""
    tasks = list(dict.fromkeys(t for s in group for t in s.by_task))
    lines = ["| task | " + " | ".join(s.label for s in group) + " |", "|---|" + "---:|" * len(group)]
    for t in tasks:
        cells = [(f"{s.tpf_by_task[t]:.2f}" if t in s.tpf_by_task else "—") if tpf else _pct(s.by_task.get(t))
                 for s in group]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return lines


def render(rows: Sequence[dict[str, Any]], summaries: Sequence[Summary], sources: Sequence[Path],
           command: str | None, plots: dict[tuple[str, str], list[Path]], out_dir: Path | None) -> str:
    lines = ["# fastdecode benchmark report", ""]
    if command:
        lines += [f"Reproduce this report: `{command}`", ""]
    lines += ["Sources:", ""]
    for src in sources:
        mine = [r for r in rows if r.get("_source") == str(src)]
        commands = sorted({r["command"] for r in mine if r.get("command")})
        made_by = "; made by " + "; ".join(f"`{c}`" for c in commands) if commands else ""
        lines.append(f"- `{src}`: {len(mine)} rows{made_by}")
    lines += ["", "TPF = generated tokens ÷ target forward passes (hardware independent); tokens/s = the row's "
              "generated tokens ÷ its wall time, summed over its items (all its bench runs pooled), batch size 1; "
              "baseline tokens/s (same runs) = the same sums over the baseline's items in the row's own bench runs "
              "(same machine, rows interleaved item by item), which is what the row is compared with; speed-up = "
              "tokens/s ÷ baseline tokens/s (same runs), the two columns before it. The baseline's own row pools "
              "every run of the file, so its tokens/s can differ from another row's baseline tokens/s; "
              ""
              "= baseline: share of items whose tokens equal the baseline's exactly; acceptance: accepted ÷ drafted "
              "tokens (diffusion: committed ÷ masked positions offered).", ""]
    for (suite, model), group in _grouped(summaries).items():
        mine = [r for r in rows if r["suite"] == suite and model_label(r) == model]
        lines += [f"## {suite} · {model}", ""]
        lines += [_environment(mine), ""]
        lines += method_table(group) + [""]
        if split := time_table(group):
            lines += ["Where the time goes (share of wall time):", ""] + split + [""]
        lines += ["Accuracy by task:", ""] + task_table(group) + [""]
        lines += ["TPF by task:", ""] + task_table(group, tpf=True) + [""]
        for png in plots.get((suite, model), []):
            link = os.path.relpath(png, out_dir) if out_dir else str(png)
            lines += [f"![{png.stem}]({link})", ""]
    board = leaderboard(summaries)
    if board:
        lines += ["## Leaderboard: highest TPF at ≥ 80 / 90 / 95 % of the baseline's accuracy", "",
                  "After ParallelBench's leaderboard (the most tokens per forward a method reaches while keeping its "
                  "accuracy); here relative to the baseline measured in the same run.", "",
                  "| suite | model | baseline | baseline accuracy | "
                  + " | ".join(f"≥ {int(f * 100)}%" for f in LEADERBOARD_FRACTIONS) + " |",
                  "|---|---|---|---:|" + "---|" * len(LEADERBOARD_FRACTIONS)]
        for suite, model, base, best in board:
            cells = [f"{b.tpf:.2f} ({b.label})" if b else "—" for b in best.values()]
            if base.accuracy == 0:  # every method keeps 80 % of nothing
                cells = ["n/a (the baseline scores 0)"] * len(cells)
            lines.append(f"| {suite} | {model} | {base.label} | {_pct(base.accuracy)} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _environment(rows: Sequence[dict[str, Any]]) -> str:
    def values(key: str) -> str:
        return ", ".join(sorted({str(r.get(key)) for r in rows if r.get(key) is not None})) or "—"

    found = [r["machine"] for r in rows if isinstance(r.get("machine"), dict)]
    machines = sorted({f"{m.get('device_name')} ({m.get('device')}, {m.get('cores')} cores, "
                       f"{m.get('torch_threads')} torch thread{'' if m.get('torch_threads') == 1 else 's'})"
                       for m in found})
    drafts = values("draft")
    parts = [f"baseline `{values('baseline')}`", f"seeds {values('seed')}", f"machine: {'; '.join(machines) or '—'}",
             f"fastdecode {values('fastdecode_version')}, torch {values('torch_version')}, "
             f"transformers {values('transformers_version')}"]
    if drafts != "—":
        parts.insert(1, f"draft `{drafts}`")
    text = " · ".join(parts)
    if len(machines) > 1:
        text += ("\n\n**Warning:** these rows were measured under more than one machine or thread setting, so their "
                 "tokens/s and speed-ups are not comparable.")
    return text


# -- entry point -----------------------------------------------------------------------------------

NUMBER_FIELDS = ("score", "new_tokens", "forwards", "wall_s")  # what the tables add up and divide


def check_numbers(row: dict[str, Any], source: Path) -> None:
    """Refuse a row whose score or counts are not numbers (a hand-edited file), naming the row, before any sum."""
    for name in NUMBER_FIELDS:
        value = row[name]
        if not isinstance(value, (int, float)):  # a bool is a 0/1 score
            raise BenchError(f"{source}: the row of task {row['task']} item {row['item']} (method {row['method']}) "
                             f"has {name} {json.dumps(value)}, not a number; fix or remove that row.")


def build_report(paths: Sequence[str | Path], out: str | Path | None = None, plots_dir: str | Path | None = None,
                 command: str | None = None) -> Report:
    """Read results files, write the Markdown (to `out` if given) and the PNGs (to `plots_dir` if given)."""
    sources = [Path(p) for p in paths]
    if out is not None and Path(out).is_dir():
        raise BenchError(f"{out} is a folder: pass a file path for the Markdown, "
                         f"e.g. --out {Path(out) / 'RESULTS.md'}.")
    rows = []
    for src in sources:
        if src.is_dir():
            raise BenchError(f"{src} is a folder, not a results file: pass the .jsonl files in it.")
        if not src.is_file():
            raise BenchError(f"Results file {src} does not exist; make it with `fastdecode bench ... --out {src}`.")
        for row in read_rows(src):
            check_numbers(row, src)
            row["_source"] = str(src)
            rows.append(row)
    summaries = summarize(rows)
    plots: dict[tuple[str, str], list[Path]] = {}
    if plots_dir is not None:
        from .plots import plot  # matplotlib only when plots are asked for

        for key, group in _grouped(summaries).items():
            plots[key] = plot(group, Path(plots_dir), [r for r in rows if (r["suite"], model_label(r)) == key])
    out_dir = Path(out).parent if out is not None else None
    markdown = render(rows, summaries, sources, command, plots, out_dir)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(markdown + "\n", encoding="utf-8")
    return Report(markdown, summaries, [p for ps in plots.values() for p in ps])
