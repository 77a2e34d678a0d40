"""Benchmark tasks: seeded item generators with exact scorers.

Families: `lists.*` (waiting lines of names), `letters.*` (letter lists), `puzzles.*`
(4x4 sudoku, Latin square) and `code.*` (stdlib code completion).

>>> task = get_task("lists.sort")
>>> item = task.items(DEFAULT_TEST_SEED, 1)[0]
>>> task.score(item, item.reference)
1.0
"""

from __future__ import annotations

import difflib
from typing import Iterable, Optional

from . import code, letters, lists, longctx, puzzles
from .base import (
    DEFAULT_TEST_SEED,
    FAMILIES,
    PROMPT_TEMPLATE,
    TEST_SEED_START,
    TRAIN_SEEDS,
    Item,
    Task,
    format_prompt,
    is_test_seed,
)

__all__ = [
    "DEFAULT_TEST_SEED",
    "FAMILIES",
    "PROMPT_TEMPLATE",
    "LONG_TASKS",
    "TASKS",
    "TEST_SEED_START",
    "TRAIN_SEEDS",
    "Item",
    "Task",
    "UnknownTaskError",
    "format_prompt",
    "get_task",
    "is_test_seed",
    "list_tasks",
]


class UnknownTaskError(KeyError, ValueError):
    """Raised by `get_task` for a name that is not registered."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


def _registry(tasks: Iterable[Task]) -> dict[str, Task]:
    registry: dict[str, Task] = {}
    for task in tasks:
        if task.name in registry:
            raise ValueError(f"task {task.name!r} is registered twice")
        registry[task.name] = task
    return registry


TASKS: dict[str, Task] = _registry((*lists.TASKS, *letters.TASKS, *puzzles.TASKS, *code.TASKS))
# long-context tasks (`longctx.<op>@<size>`): apart from TASKS, which the zoo's training reads item by item
LONG_TASKS: dict[str, Task] = _registry(longctx.TASKS)


def get_task(name: str) -> Task:
    """The registered task called `name`; raises `UnknownTaskError` listing close names."""
    if name in TASKS:
        return TASKS[name]
    if name in LONG_TASKS:
        return LONG_TASKS[name]
    close = difflib.get_close_matches(name, [*TASKS, *LONG_TASKS], n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known tasks: {', '.join(TASKS)}"
    raise UnknownTaskError(f"unknown task {name!r}{hint}")


def list_tasks(family: Optional[str] = None) -> list[str]:
    """Registered task names in registration order, optionally of one family (the long-context tasks, kept apart
    from the rest, only when asked for by their family, "longctx")."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families are {', '.join(FAMILIES)}")
    if family == "longctx":
        return list(LONG_TASKS)
    return [name for name, task in TASKS.items() if family is None or task.family == family]
