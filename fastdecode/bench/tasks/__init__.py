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

from . import code, letters, lists, puzzles
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


def get_task(name: str) -> Task:
    """The registered task called `name`; raises `UnknownTaskError` listing close names."""
    try:
        return TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known tasks: {', '.join(TASKS)}"
        raise UnknownTaskError(f"unknown task {name!r}{hint}") from None


def list_tasks(family: Optional[str] = None) -> list[str]:
    """Registered task names in registration order, optionally of one family."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families are {', '.join(FAMILIES)}")
    return [name for name, task in TASKS.items() if family is None or task.family == family]
