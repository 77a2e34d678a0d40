"""The progress display of every `fastdecode train ...` command: one bar per phase of the run.

A trainer reports `report(phase, done, total, metrics)` ("data", "train", "measure", or a phase of its own); the bar
of a phase appears at its first report, titled from `titles`. A redirected log (no terminal, no live bar) gets a
plain line every `every` steps and at the end of each phase instead, with the mean loss since the previous line
(one step's loss is noisy). Trainers that report `progress(step, total, loss or metrics)` for one phase are adapted
by `one_phase`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

Report = Callable[[str, int, int, dict[str, float]], None]


def _value(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() and abs(value) >= 10 else f"{value:.4g}"


def training_bar(err: Console, titles: dict[str, str] | None = None, *, every: int = 50,
                 shown: Iterable[str] | None = None) -> tuple[Progress, Report]:
    """The bar (enter it with `with`) and the report callback to hand the trainer. `shown`: the metrics printed
    (default all)."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn())
    bar = Progress(*columns, console=err)
    titles = titles or {}
    keep = set(shown) if shown is not None else None
    tasks: dict[str, Any] = {}
    losses: list[float] = []
    started = time.perf_counter()

    def report(phase: str, done: int, total: int, metrics: dict[str, float]) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(titles.get(phase, phase), total=total, info="")
        info = " ".join(f"{k} {_value(v)}" for k, v in metrics.items() if keep is None or k in keep)
        bar.update(tasks[phase], completed=done, info=info)
        if "loss" in metrics:
            losses.append(float(metrics["loss"]))
        if not err.is_terminal and (done % every == 0 or done == total):
            mean = f" (mean loss since the last line {sum(losses) / len(losses):.4g})" if len(losses) > 1 else ""
            losses.clear()
            bar.console.print(f"{phase} {done}/{total} {info}{mean} elapsed {time.perf_counter() - started:.0f}s",
                              highlight=False)

    return bar, report


def one_phase(report: Report, phase: str = "train") -> Callable[[int, int, Any], None]:
    """`progress(step, total, loss_or_metrics)` of a one-phase trainer, as a report of `phase`."""

    def progress(step: int, total: int, value: Any) -> None:
        report(phase, step, total, value if isinstance(value, dict) else {"loss": float(value)})

    return progress
