"""The demo: every bundled zoo model, a few test items per task, each fitting method, one table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..engine import generate
from ..errors import ModelLoadError
from ..models.loading import load, zoo_names
from ..registry import list_methods
from .tasks import DEFAULT_TEST_SEED, TASKS, format_prompt

DEMO_TASKS = ["lists.sort", "lists.insert_index", "letters.reverse", "puzzles.sudoku", "code.complete"]
DEMO_PARAMS = {"ar.sample": {"temperature": 0.7, "seed": 0}, "dlm.baseline": {"block_length": 16}}


@dataclass(frozen=True)
class DemoRow:
    model: str
    method: str
    task: str
    accuracy: float
    tokens_per_forward: float
    tokens_per_s: float
    new_tokens: int


def demo_rows(items_per_task: int = 8) -> Iterator[DemoRow]:
    names = zoo_names()
    if not names:
        raise ModelLoadError("No zoo models are bundled; build them with `fastdecode train ar-small` (see README).")
    for name in names:
        model = load(f"zoo:{name}")
        for method in list_methods(model.kind):
            for task_name in DEMO_TASKS:
                task = TASKS[task_name]
                items = task.items(DEFAULT_TEST_SEED, items_per_task)
                params = {"max_new_tokens": task.max_new_tokens, **DEMO_PARAMS.get(method.name, {})}
                results = generate(model, [format_prompt(i.prompt) for i in items], method.name, **params)
                new = sum(r.stats.new_tokens for r in results)
                forwards = sum(r.stats.forwards for r in results)
                yield DemoRow(
                    name, method.name, task_name,
                    accuracy=sum(task.score(i, r.text) for i, r in zip(items, results)) / len(items),
                    tokens_per_forward=new / forwards,
                    tokens_per_s=new / results[0].stats.wall_s,
                    new_tokens=new,
                )
