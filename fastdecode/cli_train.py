"""What every `fastdecode train ...` command shares: its progress display and its `--set NAME=VALUE` settings.

The display has one bar per phase of the run.
A trainer reports `report(phase, done, total, metrics)` ("data", "train", "measure", or a phase of its own); the bar
of a phase appears at its first report, titled from `titles`. A redirected log (no terminal, no live bar) gets a
plain line every `every` steps and at the end of each phase instead, with the mean loss since the previous line
(one step's loss is noisy). Trainers that report `progress(step, total, loss or metrics)` for one phase are adapted
by `one_phase`. `settings` turns `--set` pairs into a trainer's settings dataclass.
"""

from __future__ import annotations

import dataclasses
import time
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

Report = Callable[[str, int, int, dict[str, float]], None]
T = TypeVar("T")


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


def settings(cls: type[T], pairs: list[str], what: str, steps: int | None = None) -> T:
    """`cls` (a settings dataclass) from `--set NAME=VALUE` pairs (and `--steps`), each value coerced to its field's
    type as method parameters are ("false" is False); an unknown name is refused with the names there are."""
    from .config import coerce_value, parse_param_strings
    from .errors import ArgumentError

    values: dict[str, Any] = dict(parse_param_strings(pairs))
    if steps is not None:
        values["steps"] = steps
    hints = typing.get_type_hints(cls)
    names = sorted(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ArgumentError(f"--set {unknown[0]}: not a setting of {what}; choose from {', '.join(names)}.")
    return cls(**{k: coerce_value(k, v, hints[k]) for k, v in values.items()})
