"""The report's PNGs (`fastdecode report --plots`), one set per (suite, model).

- accuracy against tokens per forward (the speed–quality frontier); configurations on the same point are spread
  a few points apart around it and drawn hollow, so none hides another;
- speed-up bars, with the spread of the per-run ratios (each bench run's tokens/s over the baseline's in the same
  run) as an error bar where a configuration was measured in several runs: one pooled ratio hides how far the
  machine drifted between them;
- for the long-context suites (`longctx`, `longctx-*`), accuracy and K/V bytes read per token against the sparse
  budget instead of the frontier: every sparse rule decodes one token per forward, so TPF tells them apart not at all.

Long labels are wrapped and shortened and legends sit outside the axes, saved with a tight bounding box, so a long
method name never squeezes the plot.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .summary import Summary, config_id, config_labels, rate

LABEL_WIDTH = 28  # characters per line of a tick or legend label
LABEL_LINES = 3  # lines at most; the rest is cut with an ellipsis
LEGEND_BESIDE = 14  # configurations whose legend fits beside the axes; more go under them in columns
SPREAD_PT = 6.0  # how far apart (points) coinciding markers are drawn
BUDGET = re.compile(r"budget=(\d+)")


def slug(text: str) -> str:
    text = text.removeprefix("zoo:") if text.startswith("zoo:") else Path(text).name or text
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def wrap(label: str, width: int = LABEL_WIDTH, lines: int = LABEL_LINES) -> str:
    """A label wrapped at `width` characters (at commas and spaces) and cut to `lines` lines."""
    return "\n".join(textwrap.wrap(label, width=width, max_lines=lines, placeholder="…",
                                   break_long_words=True, break_on_hyphens=False)) or label


def is_longctx(suite: str) -> bool:
    return suite == "longctx" or suite.startswith("longctx-")


def plot(group: Sequence[Summary], folder: Path, rows: Sequence[dict[str, Any]] = ()) -> list[Path]:
    """The PNGs of one (suite, model) group; `rows` are the group's result rows (for per-run spreads and budgets)."""
    import matplotlib

    matplotlib.use("Agg")

    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{slug(group[0].suite)}-{slug(group[0].model)}"
    first = (budget_plot(group, rows, folder / f"budget-{stem}.png") if is_longctx(group[0].suite)
             else frontier_plot(group, folder / f"frontier-{stem}.png"))
    return [first, speedup_plot(group, run_speedups(rows), folder / f"speedup-{stem}.png")]


# -- the frontier ------------------------------------------------------------------------------------

def offsets(points: Sequence[tuple[float, float]], x_tol: float = 0.0, y_tol: float = 0.0) -> list[tuple[float, float]]:
    """Per point, an offset in points: 0 for a point alone, a small circle around the spot for points that coincide
    (within `x_tol` / `y_tol` of a group's first point, or equal to 3 decimals), so that each stays visible near
    where it was measured."""
    groups: list[tuple[tuple[float, float], list[int]]] = []
    for i, (x, y) in enumerate(points):
        x_near, y_near = max(x_tol, 5e-4), max(y_tol, 5e-4)
        home = next((g for g in groups if abs(g[0][0] - x) <= x_near and abs(g[0][1] - y) <= y_near), None)
        if home is None:
            groups.append(((x, y), [i]))
        else:
            home[1].append(i)
    out = [(0.0, 0.0)] * len(points)
    for _, members in groups:
        if len(members) < 2:
            continue
        for k, i in enumerate(members):
            angle = 2 * math.pi * k / len(members) + math.pi / 2
            out[i] = (SPREAD_PT * math.cos(angle), SPREAD_PT * math.sin(angle))
    return out


def frontier_plot(group: Sequence[Summary], png: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    colors = plt.get_cmap("tab10")
    markers = "osD^vPXph<>"
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    points = [(s.tpf, 100 * s.accuracy) for s in group]
    x_max = max([p[0] for p in points] + [1.0]) * 1.1
    shifts = offsets(points, x_tol=x_max / 80, y_tol=1.5)  # closer than about a marker's width
    for i, (s, (x, y), (dx, dy)) in enumerate(zip(group, points, shifts, strict=True)):
        shared = (dx, dy) != (0.0, 0.0)
        where = offset_copy(ax.transData, fig=fig, x=dx, y=dy, units="points")
        color = colors(i % 10)
        ax.scatter(x, y, s=200 if s.is_baseline else 70, transform=where,
                   marker="*" if s.is_baseline else markers[i % len(markers)],
                   facecolor="none" if shared and not s.is_baseline else color, edgecolor=color if shared else "black",
                   linewidth=1.6 if shared else 0.6, zorder=4 if s.is_baseline else 3,
                   label=wrap(f"{s.label} (baseline)" if s.is_baseline else s.label))
    front = _frontier(group)
    if len(front) > 1:
        ax.plot([s.tpf for s in front], [100 * s.accuracy for s in front], color="grey", linestyle="--",
                linewidth=1, zorder=2, label="frontier")
    ax.set_xlabel("tokens per forward (TPF, generated tokens / target forward)")
    ax.set_ylabel("accuracy (% mean task score)")
    ax.set_ylim(-5, 105)
    ax.set_xlim(left=0, right=x_max)
    ax.grid(alpha=0.3)
    ax.set_title(f"Speed–quality frontier · {group[0].suite} · {group[0].model}", fontsize=10)
    if any(shift != (0.0, 0.0) for shift in shifts):
        ax.text(0.01, 0.01, "hollow markers: configurations on the same point, drawn around it",
                transform=ax.transAxes, fontsize=7, color="dimgrey")
    fig.tight_layout()  # the axes first; the legend then goes outside them and the saved figure grows to hold it
    if len(group) <= LEGEND_BESIDE:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    else:  # a long list goes under the axes in columns, so the figure grows down, not sideways
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, borderaxespad=0)
    return _save(fig, png, layout=False)


def _frontier(group: Sequence[Summary]) -> list[Summary]:
    """Configurations no other beats on both accuracy and TPF, by increasing TPF."""
    front = [s for s in group if not any(o.tpf >= s.tpf and o.accuracy >= s.accuracy and
                                         (o.tpf > s.tpf or o.accuracy > s.accuracy) for o in group)]
    return sorted(front, key=lambda s: s.tpf)


# -- speed-ups -------------------------------------------------------------------------------------

def run_speedups(rows: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per configuration label, one speed-up per bench run that measured it and its baseline: the run's tokens/s
    over the baseline's in the same run (rows without a run id count as one run per file)."""
    configs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        configs[config_id(r)].append(r)
    labels = config_labels(list(configs))
    base: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("is_baseline"):
            base[(r.get("_source"), r.get("run"))].append(r)
    out: dict[str, list[float]] = {}
    for config, rs in configs.items():
        by_run: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
        for r in rs:
            by_run[(r.get("_source"), r.get("run"))].append(r)
        ratios = [rate(mine) / rate(base[run]) for run, mine in sorted(by_run.items(), key=str)
                  if base.get(run) and rate(base[run])]
        out[labels[config]] = ratios
    return out


def speedup_plot(group: Sequence[Summary], per_run: dict[str, list[float]], png: Path) -> Path:
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(6.4, 0.55 * len(group) + 1.6))
    speed = [s.speedup or 0.0 for s in group]
    low, high = [], []
    for s, x in zip(group, speed, strict=True):
        runs = per_run.get(s.label, [])
        spread = len(runs) > 1 and not s.is_baseline
        low.append(max(0.0, x - min(runs)) if spread else 0.0)
        high.append(max(0.0, max(runs) - x) if spread else 0.0)
    bars = ax.barh(range(len(group)), speed, color=[colors(i % 10) for i in range(len(group))], edgecolor="black",
                   linewidth=0.6)
    ranged = [i for i in range(len(group)) if low[i] or high[i]]
    if ranged:  # only where runs differ: a zero-width bar would still draw its caps
        ax.errorbar([speed[i] for i in ranged], ranged, xerr=[[low[i] for i in ranged], [high[i] for i in ranged]],
                    fmt="none", ecolor="black", elinewidth=1, capsize=3, zorder=3)
    for i, (bar, s) in enumerate(zip(bars, group, strict=True)):
        runs = per_run.get(s.label, [])
        if len(runs) > 1 and not s.is_baseline:
            ax.scatter(runs, [i] * len(runs), s=12, color="white", edgecolor="black", linewidth=0.6, zorder=4)
            note = f" {s.speedup or 0:.2f}× ({min(runs):.2f}–{max(runs):.2f} over {len(runs)} runs)"
        elif s.baseline_tokens_per_s and not s.is_baseline:  # the two rates it divides, as the table shows them
            note = f" {s.speedup or 0:.2f}× ({s.tokens_per_s:.0f} / {s.baseline_tokens_per_s:.0f} tok/s)"
        else:
            note = f" {s.speedup or 0:.2f}× ({s.tokens_per_s:.0f} tok/s)"
        gap = 0.02 * max(speed + [1.0])  # clear of the error bar's cap
        ax.text(bar.get_width() + high[i] + gap, bar.get_y() + bar.get_height() / 2, note, va="center", fontsize=8)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.text(1.0, 1.005, "baseline = 1×", transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
    ax.set_yticks(range(len(group)), [wrap(s.label) for s in group], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up over the baseline (× its tokens/s, same run, batch size 1)")
    ax.set_xlim(0, max([x + h for x, h in zip(speed, high, strict=True)] + [1.0]) * 1.6)
    ax.set_title(f"Speed-up · {group[0].suite} · {group[0].model}", fontsize=10, pad=14)
    return _save(fig, png)


# -- long contexts ---------------------------------------------------------------------------------

def row_budget(row: dict[str, Any]) -> int | None:
    """The K/V columns per head a row's sparse attention read: its `budget` parameter (a sparse.* method's, its
    default when not set, or the one in an `attention="rule:budget=N"` spec); None for dense attention."""
    params = row.get("params") or {}
    given = params.get("budget", row.get("budget"))
    if given is not None:
        return int(given)
    if (match := BUDGET.search(str(params.get("attention") or ""))) is not None:
        return int(match.group(1))
    if str(row.get("method", "")).startswith("sparse."):
        from ..registry import get_method

        default = dict(get_method(row["method"]).params()).get("budget")
        return int(default) if isinstance(default, int) else None
    return None


def _series(row: dict[str, Any]) -> str:
    """A method configuration without its budget: the line a budget sweep draws."""
    params = {k: v for k, v in (row.get("params") or {}).items() if k not in ("budget", "max_new_tokens")}
    if "attention" in params:
        params["attention"] = BUDGET.sub("budget=*", str(params["attention"]))
    return row["method"] + (f" {json.dumps(params, sort_keys=True)}" if params else "")


def budget_plot(group: Sequence[Summary], rows: Sequence[dict[str, Any]], png: Path) -> Path:
    """Accuracy and K/V bytes read per generated token against the budget, one line per sparse configuration; the
    dense rows as a horizontal reference."""
    import matplotlib.pyplot as plt

    score: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    kv: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    dense_score, dense_kv = [], []
    for r in rows:
        budget, read = row_budget(r), r.get("kv_read_bytes_per_token")
        if budget is None:
            dense_score.append(float(r["score"]))
            dense_kv += [float(read)] if isinstance(read, int | float) else []
            continue
        score[_series(r)][budget].append(float(r["score"]))
        if isinstance(read, int | float):
            kv[_series(r)][budget].append(float(read))
    colors = plt.get_cmap("tab10")
    fig, (acc_ax, kv_ax) = plt.subplots(1, 2, figsize=(10.0, 4.2))
    for i, name in enumerate(sorted(score)):
        # later lines hollow and smaller, and each a little apart in x: lines that coincide stay visible
        style = {"color": colors(i % 10), "marker": "osD^vPXph<>"[i % 11], "markersize": max(4.0, 8.0 - i),
                 "markerfacecolor": colors(i % 10) if i == 0 else "none", "markeredgewidth": 1.2,
                 "linewidth": max(0.8, 2.4 - 0.4 * i), "label": wrap(name)}
        budgets = sorted(score[name])
        jitter = 1 + 0.04 * (i - (len(score) - 1) / 2)
        acc_ax.plot([b * jitter for b in budgets], [100 * _avg(score[name][b]) for b in budgets], **style)
        if kv.get(name):
            kb = sorted(kv[name])
            kv_ax.plot([b * jitter for b in kb], [_avg(kv[name][b]) / 1e6 for b in kb], **style)
    if dense_score:
        acc_ax.axhline(100 * _avg(dense_score), color="black", linestyle="--", linewidth=1, label="dense")
    if dense_kv:
        kv_ax.axhline(_avg(dense_kv) / 1e6, color="black", linestyle="--", linewidth=1, label="dense")
    ticks = sorted({b for per in score.values() for b in per})
    for ax in (acc_ax, kv_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(b) for b in ticks])
        ax.minorticks_off()
        ax.set_xlabel("budget (K/V columns read per head)")
        ax.grid(alpha=0.3)
    acc_ax.set_ylabel("accuracy (% mean task score)")
    acc_ax.set_ylim(-5, 105)
    kv_ax.set_ylabel("K/V read per generated token (MB)")
    kv_ax.set_ylim(bottom=0)
    if not kv and not dense_kv:
        kv_ax.text(0.5, 0.5, "these rows record no K/V bytes read\n(`make results-sparse` measures them)",
                   transform=kv_ax.transAxes, ha="center", va="center", fontsize=8, color="dimgrey")
    fig.suptitle(f"Accuracy and K/V read against the budget · {group[0].suite} · {group[0].model}", fontsize=10)
    handles, labels = acc_ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.92))
    return _save(fig, png)


def _avg(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _save(fig: Any, png: Path, layout: bool = True) -> Path:
    import matplotlib.pyplot as plt

    if layout:
        fig.tight_layout()
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return png
