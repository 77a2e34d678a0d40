"""Benchmark suites: named lists of (task, items) drawn from the test split only.

A suite is what `fastdecode bench --suite NAME` runs. `--limit` caps the items of every task and
`--seeds` picks which test draws to take (each seed gives a fresh set of items).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FastDecodeError, close_names
from .tasks import DEFAULT_TEST_SEED, TASKS, TEST_SEED_START, Task, get_task, is_test_seed
from .tasks.longctx import CONTEXTS, OPS


class BenchError(FastDecodeError, ValueError):
    """A bench request that cannot run: unknown suite, training seed, bad limit, missing draft."""


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    tasks: tuple[tuple[str, int], ...]  # (task name, items per seed)
    seeds: tuple[int, ...] = (DEFAULT_TEST_SEED,)

    def plan(self, seeds: list[int] | None = None, limit: int | None = None) -> list[tuple[Task, int, int]]:
        """(task, seed, items) for every task and seed; items capped by `limit`."""
        seeds = list(seeds) if seeds else list(self.seeds)
        for seed in seeds:
            check_test_seed(seed)
        if limit is not None and limit < 1:
            raise BenchError(f"--limit must be at least 1 item per task, not {limit}.")
        return [(get_task(name), seed, min(n, limit) if limit else n) for name, n in self.tasks for seed in seeds]


def check_test_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 or not is_test_seed(seed):
        raise BenchError(
            f"Seed {seed} is not a test seed: seeds below {TEST_SEED_START:,} draw training items, which the zoo "
            f"models were trained on. Use a seed >= {TEST_SEED_START} (the default is {DEFAULT_TEST_SEED})."
        )
    return seed


def _family(*families: str) -> tuple[str, ...]:
    return tuple(name for name, task in TASKS.items() if task.family in families)


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("parallel-lists", "ParallelBench-style list edits: every lists.* and letters.* task",
              tuple((name, 50) for name in _family("lists", "letters"))),
        Suite("puzzles", "4x4 sudoku and Latin squares", (("puzzles.sudoku", 50), ("puzzles.latin_square", 50))),
        Suite("code", "completion of held-out standard-library code", (("code.complete", 50),)),
        Suite("structured", "zoo tasks whose answers have a format (JSON array, regex, grammar), run with and "
              "without the constraint (tools/structured.py adds the JSON-schema feature classes)",
              (("lists.sort", 8), ("lists.insert_index", 8), ("letters.sort", 8), ("puzzles.sudoku", 8),
               ("puzzles.latin_square", 8))),
        Suite("longctx", "RULER-style long-context retrieval at 1k, 2k and 4k tokens (accuracy)",
              tuple((f"longctx.{op.op}@{size}", 20) for size in ("1k", "2k", "4k") for op in OPS)),
        *(Suite(f"longctx-{size}", f"the longctx tasks at {size} tokens",
                tuple((f"longctx.{op.op}@{size}", 20) for op in OPS)) for size in CONTEXTS),
        Suite("quick", "a small mixed subset for the demo and CI smoke runs",
              (("lists.sort", 4), ("lists.insert_index", 3), ("letters.reverse", 4), ("puzzles.sudoku", 3),
               ("code.complete", 2))),
    )
}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise BenchError(f"Unknown suite {name!r}. {close_names(name, SUITES)}")
    return SUITES[name]
