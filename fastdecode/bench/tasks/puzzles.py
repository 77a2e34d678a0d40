"""4x4 puzzles (`puzzles.*`), after ParallelBench's `sudoku_n4_12` and `latin_square_n4`.

Sudoku puzzles are generated here (not Dream's 108), with 4-10 blanks and a unique solution.
"""

from __future__ import annotations

import random
import string
from functools import lru_cache
from itertools import islice
from typing import Iterator, Optional, Sequence

from .base import Item, Task, token_budget

SIZE = 4  # side of both puzzles
CELLS = SIZE * SIZE
MIN_BLANKS, MAX_BLANKS = 4, 10
LATIN_SYMBOLS = string.ascii_uppercase + string.digits

Grid = tuple[int, ...]  # 16 cells, row-major, 0 = blank


def _peers(cell: int) -> frozenset[int]:
    """Cells sharing a row, column or 2x2 box with `cell`."""
    r, c = divmod(cell, SIZE)
    box = {(r // 2 * 2 + i) * SIZE + c // 2 * 2 + j for i in range(2) for j in range(2)}
    row = {r * SIZE + j for j in range(SIZE)}
    col = {i * SIZE + c for i in range(SIZE)}
    return frozenset((box | row | col) - {cell})


PEERS = tuple(_peers(cell) for cell in range(CELLS))


def iter_solutions(grid: Sequence[int]) -> Iterator[Grid]:
    """Every completion of `grid` (0 = blank) by depth-first search. Givens are assumed consistent."""
    cells = list(grid)
    blank = next((i for i, v in enumerate(cells) if v == 0), None)
    if blank is None:
        yield tuple(cells)
        return
    used = {cells[j] for j in PEERS[blank]}
    for digit in range(1, SIZE + 1):
        if digit not in used:
            cells[blank] = digit
            yield from iter_solutions(cells)


def count_solutions(grid: Sequence[int], limit: int = 2) -> int:
    """Number of completions of `grid`, counting at most `limit`."""
    return sum(1 for _ in islice(iter_solutions(grid), limit))


@lru_cache(maxsize=1)
def solved_grids() -> tuple[Grid, ...]:
    """All 288 valid 4x4 sudoku grids."""
    return tuple(iter_solutions([0] * CELLS))


def grid_to_text(grid: Sequence[int]) -> str:
    """Four lines of four digits."""
    return "\n".join("".join(map(str, grid[r * SIZE : (r + 1) * SIZE])) for r in range(SIZE))


def parse_grid(text: str) -> Optional[Grid]:
    """First four lines that hold exactly four digits once spaces and commas are dropped."""
    rows = [line.replace(" ", "").replace(",", "").strip() for line in text.splitlines()]
    rows = [row for row in rows if len(row) == SIZE and row.isdigit()]
    if len(rows) < SIZE:
        return None
    return tuple(int(ch) for row in rows[:SIZE] for ch in row)


def make_sudoku(rng: random.Random) -> tuple[Grid, Grid]:
    """(puzzle, solution): blank random cells while the solution stays unique."""
    while True:
        solution = rng.choice(solved_grids())
        target = rng.randint(MIN_BLANKS, MAX_BLANKS)
        puzzle = list(solution)
        blanks = 0
        for cell in rng.sample(range(CELLS), CELLS):
            if blanks == target:
                break
            puzzle[cell] = 0
            if count_solutions(puzzle) == 1:
                blanks += 1
            else:
                puzzle[cell] = solution[cell]
        if blanks >= MIN_BLANKS:
            return tuple(puzzle), solution


class SudokuTask(Task):
    """Fill a 4x4 sudoku; the unique solution is the only right answer."""

    def __init__(self) -> None:
        # 4 lines of 4 digits; digits may be single tokens, so budget one token per character.
        budget = token_budget(2 * (CELLS + SIZE))
        super().__init__("puzzles.sudoku", deterministic=True, max_new_tokens=budget)

    def make_item(self, rng: random.Random) -> Item:
        puzzle, solution = make_sudoku(rng)
        prompt = (
            "Solve this 4x4 sudoku (0 = blank; each row, column and 2x2 box holds 1-4 once):\n"
            + grid_to_text(puzzle)
        )
        return self.item(prompt, grid_to_text(solution), puzzle=list(puzzle), solution=list(solution))

    def score(self, item: Item, output: str) -> float:
        grid = parse_grid(output)
        return float(grid is not None and list(grid) == list(item.data["solution"]))


def square_rows(text: str, symbols: Sequence[str]) -> Optional[list[list[str]]]:
    """First four CSV lines whose cells are exactly `symbols` in some order."""
    wanted = set(symbols)
    rows = []
    for line in text.splitlines():
        cells = [cell.strip().strip("\"'") for cell in line.split(",")]
        if len(cells) == len(wanted) and set(cells) == wanted:
            rows.append(cells)
    return rows[: len(wanted)] if len(rows) >= len(wanted) else None


def is_latin(rows: Sequence[Sequence[str]], symbols: Sequence[str]) -> bool:
    """True when every row and every column holds each symbol exactly once."""
    wanted = set(symbols)
    lines = [*rows, *zip(*rows, strict=False)]  # ragged rows (any caller's) fail the length check below
    return len(rows) == len(wanted) and all(
        len(line) == len(wanted) and set(line) == wanted for line in lines
    )


class LatinSquareTask(Task):
    """Any 4x4 Latin square over four given symbols is right."""

    def __init__(self) -> None:
        chars = SIZE * (2 * SIZE - 1) + SIZE - 1  # 4 lines "H,4,A,C" and their newlines
        # Single-character cells rarely merge into one token: budget one token per character.
        super().__init__("puzzles.latin_square", deterministic=False, max_new_tokens=token_budget(2 * chars))

    def make_item(self, rng: random.Random) -> Item:
        symbols = rng.sample(LATIN_SYMBOLS, SIZE)
        rows, cols = rng.sample(range(SIZE), SIZE), rng.sample(range(SIZE), SIZE)
        square = [[symbols[(r + c) % SIZE] for c in cols] for r in rows]
        prompt = (
            f"Write a 4x4 Latin square with the symbols [{', '.join(symbols)}] "
            "(each once per row and column), one CSV row per line."
        )
        return self.item(prompt, "\n".join(",".join(row) for row in square), symbols=symbols)

    def score(self, item: Item, output: str) -> float:
        rows = square_rows(output, item.data["symbols"])
        return float(rows is not None and is_latin(rows, item.data["symbols"]))


TASKS = (SudokuTask(), LatinSquareTask())
