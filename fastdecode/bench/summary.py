"""Summaries of benchmark rows: one `Summary` per method configuration on a (suite, model), what the report's tables
and the plots (`plots.py`) both read."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .tasks import LONG_TASKS, TASKS


@dataclass
class Summary:
    """One method configuration on one (suite, model)."""

    suite: str
    model: str
    method: str
    label: str  # the method plus whatever tells its configurations apart
    is_baseline: bool
    items: int
    accuracy: float
    tpf: float
    forwards_per_item: float
    draft_forwards_per_item: float
    tokens_per_s: float
    speedup: float | None  # tokens_per_s / baseline_tokens_per_s
    equal_rate: float | None
    peak_rss_mb: float
    acceptance_rate: float | None
    by_task: dict[str, float] = field(default_factory=dict)  # accuracy per task
    tpf_by_task: dict[str, float] = field(default_factory=dict)  # TPF per task (where drafting or unmasking pays)
    draft_share: float | None = None  # of wall time, drafting (speculative methods; None when not timed)
    verify_share: float | None = None  # of wall time, the target's verification forward + accept rule
    sources: tuple[str, ...] = ()  # the result files its rows came from (each bench run measures its own baseline)
    baseline_other_run: bool = False  # its runs measured no baseline: the speed-up is against other runs' rows
    # the baseline's tokens/s over the rows the speed-up compares with (its own runs'), pooled as tokens_per_s is;
    # the baseline's own row pools all its runs, so this may differ from that row's tokens/s
    baseline_tokens_per_s: float | None = None
    # speculative methods: the share of target forwards whose draft token at position k (0-based) was accepted
    accept_per_position: tuple[float, ...] = ()


def uses_default_budget(row: dict[str, Any]) -> bool:
    """The row's max_new_tokens is the harness's default for its task and model (the task's budget, or a
    diffusion model's canvas), not a value a run set; rows written before `default_budget` existed compare it
    with the task's budget."""
    task = TASKS.get(row.get("task", "")) or LONG_TASKS.get(row.get("task", ""))
    budget = (row.get("params") or {}).get("max_new_tokens")
    return bool(row.get("default_budget")) or task is None or budget == task.max_new_tokens


def config_id(row: dict[str, Any]) -> tuple[str, str, str]:
    # a parameter left at its default names the same configuration as one that states it: rows record every
    # parameter today, older rows only those a run set
    params = {**method_defaults(row["method"]), **(row.get("params") or {})}
    # each task sets its own budget, so max_new_tokens names a configuration only where a run overrode it
    if uses_default_budget(row):
        params.pop("max_new_tokens", None)
    draft = "" if row.get("is_baseline") else (row.get("draft") or "")
    return row["method"], json.dumps(params, sort_keys=True), draft


@functools.cache
def _defaults(method: str) -> tuple[tuple[str, Any], ...]:
    from ..registry import get_method  # the registry loads every family: only when a summary is asked for

    try:
        config = get_method(method).config
    except Exception:  # a method this version no longer has: its rows keep the parameters they recorded
        return ()
    return tuple((f.name, f.default) for f in dataclasses.fields(config)
                 if f.default is not dataclasses.MISSING and _plain(f.default))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def method_defaults(method: str) -> dict[str, Any]:
    """The defaults of `method`'s parameters that a results row can record (numbers, strings, booleans, None)."""
    return dict(_defaults(method))


def config_labels(configs: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], str]:
    """A method's name, plus the parameters (and draft) that differ between its configurations."""
    by_method: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for c in configs:
        by_method[c[0]].append(c)
    labels = {}
    for method, group in by_method.items():
        for c in group:
            if len(group) == 1:
                labels[c] = method
                continue
            params = json.loads(c[1])
            keys = list(dict.fromkeys(k for g in group for k in json.loads(g[1])))
            varying = [k for k in keys if len({json.dumps(json.loads(g[1]).get(k)) for g in group}) > 1]
            # only max_new_tokens can be absent: each task's own budget
            bits = [f"{k}={params.get(k, 'per-task')}" for k in varying]
            if len({g[2] for g in group}) > 1:
                bits.append(f"draft={c[2] or '-'}")
            labels[c] = f"{method} ({', '.join(bits)})"
    return labels


def model_label(row: dict[str, Any]) -> str:
    """The model a row's table is headed by: its name, plus its dtype where that is not float32 (and "exact" in exact
    mode), so that bfloat16 and float32 rows of one model never pool (rows from before the dtype was recorded: the
    name alone)."""
    dtype = row.get("dtype")
    if dtype in (None, "float32") and not row.get("exact"):
        return str(row["model"])
    return f"{row['model']} · {dtype}" + (" exact" if row.get("exact") else "")


def summarize(rows: Sequence[dict[str, Any]]) -> list[Summary]:
    """One Summary per (suite, model, method configuration), baseline first within each group."""
    groups: dict[tuple[str, str], dict[tuple[str, str, str], list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for row in rows:
        groups[(row["suite"], model_label(row))][config_id(row)].append(row)
    out = []
    for (suite, model), configs in groups.items():
        labels = config_labels(list(configs))
        base_rows = [r for rows_ in configs.values() for r in rows_ if r.get("is_baseline")]
        group = []
        for config, rs in configs.items():
            speed = rate(rs)
            # speed-ups are against the baseline rows of the same bench runs (interleaved with this configuration's
            # rows item by item); where a run measured no baseline (a later run added a method to a file whose
            # baseline rows were there) or the rows predate run ids, against the baseline rows of the same file(s)
            sources = {r.get("_source") for r in rs}
            runs = {r.get("run") for r in rs}
            in_file = [r for r in base_rows if r.get("_source") in sources] or base_rows
            same_run = in_file if None in runs else [r for r in in_file if r.get("run") in runs]
            base_speed = rate(same_run or in_file)
            equal = [r["equal_to_baseline"] for r in rs if r.get("equal_to_baseline") is not None]
            proposed = sum(r.get("proposed", 0) for r in rs)
            per_task: dict[str, list[float]] = defaultdict(list)
            task_counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # new tokens, forwards
            wall = sum(r["wall_s"] for r in rs)
            timed = wall > 0 and any(r.get("draft_s", 0) or r.get("verify_s", 0) for r in rs)
            for r in rs:
                per_task[r["task"]].append(r["score"])
                task_counts[r["task"]][0] += r["new_tokens"]
                task_counts[r["task"]][1] += r["forwards"]
            group.append(Summary(
                suite=suite, model=model, method=config[0], label=labels[config],
                is_baseline=any(r.get("is_baseline") for r in rs), items=len(rs),
                accuracy=_mean([r["score"] for r in rs]),
                tpf=_ratio(sum(r["new_tokens"] for r in rs), sum(r["forwards"] for r in rs)),
                forwards_per_item=_mean([r["forwards"] for r in rs]),
                draft_forwards_per_item=_mean([r.get("draft_forwards", 0) for r in rs]),
                tokens_per_s=speed,
                speedup=speed / base_speed if base_speed else None,
                baseline_tokens_per_s=base_speed or None,
                equal_rate=_mean(equal) if equal else None,
                peak_rss_mb=max(r.get("peak_rss_mb", 0.0) for r in rs),
                acceptance_rate=sum(r.get("accepted", 0) for r in rs) / proposed if proposed else None,
                by_task={t: _mean(s) for t, s in per_task.items()},
                tpf_by_task={t: _ratio(*c) for t, c in task_counts.items()},
                draft_share=sum(r.get("draft_s", 0.0) for r in rs) / wall if timed else None,
                verify_share=sum(r.get("verify_s", 0.0) for r in rs) / wall if timed else None,
                sources=tuple(sorted(str(x) for x in sources if x is not None)),
                baseline_other_run=bool(in_file) and not same_run,
                accept_per_position=_per_position(rs),
            ))
        group.sort(key=lambda s: (not s.is_baseline, s.label))
        out.extend(group)
    return out


def _per_position(rows: Sequence[dict[str, Any]]) -> tuple[float, ...]:
    """Accepted draft tokens at each draft position over the rows' target forwards (rows record the counts)."""
    counts = [r.get("accepted_per_position") or [] for r in rows]
    depth = max((len(c) for c in counts), default=0)
    forwards = sum(r["forwards"] for r in rows)
    if not depth or not forwards:
        return ()
    return tuple(sum(c[k] for c in counts if k < len(c)) / forwards for k in range(depth))


def rate(rows: Sequence[dict[str, Any]]) -> float:
    return _ratio(sum(r["new_tokens"] for r in rows), sum(r["wall_s"] for r in rows))


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
