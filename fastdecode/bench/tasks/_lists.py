"""List rendering, parsing and scoring, and the list-in/list-out operations shared by
the `lists.*` (waiting line) and `letters.*` families."""

from __future__ import annotations

import random
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .base import Item, Task, token_budget

ListEdit = tuple[str, list[str], dict[str, Any]]  # (instruction, answer list, extra data)


def render_list(items: Sequence[str], quote: bool = True) -> str:
    """`["Ann Lee", "Bob Moss"]` (quoted) or `[A, B]` (bare)."""
    cells = [f'"{x}"' if quote else x for x in items]
    return "[" + ", ".join(cells) + "]"


def parse_list(text: str) -> Optional[list[str]]:
    """Parse the last bracketed list in `text`; None when there is no `[`.

    Takes the text after the last `[` up to the next `]` (or the end), splits on commas,
    strips quotes and whitespace, and drops empty cells.
    """
    start = text.rfind("[")
    if start < 0:
        return None
    body = text[start + 1 :].split("]", 1)[0]
    cells = (cell.strip().strip("\"'").strip() for cell in body.split(","))
    return [cell for cell in cells if cell]


def exact_score(reference: str, output: str) -> float:
    """1 when the parsed output list equals the parsed reference list."""
    pred = parse_list(output)
    return float(pred is not None and pred == parse_list(reference))


def shuffle_score(original: Sequence[str], output: str) -> float:
    """1 for any permutation of `original` that differs from it."""
    pred = parse_list(output)
    return float(pred is not None and sorted(pred) == sorted(original) and pred != list(original))


def insert_random_score(original: Sequence[str], word: str, output: str) -> float:
    """1 when removing the first `word` from the output leaves `original`."""
    pred = parse_list(output)
    if pred is None or word not in pred:
        return 0.0
    pred.remove(word)
    return float(pred == list(original))


def remove_random_score(original: Sequence[str], output: str) -> float:
    """1 when the output is `original` with exactly one item removed."""
    pred = parse_list(output)
    if pred is None or len(pred) != len(original) - 1:
        return 0.0
    return float(any(pred == [*original[:i], *original[i + 1 :]] for i in range(len(original))))


def replace_random_score(original: Sequence[str], word: str, output: str) -> float:
    """1 when exactly one position differs from `original` and it now holds `word`."""
    pred = parse_list(output)
    if pred is None or len(pred) != len(original):
        return 0.0
    diffs = [i for i, (a, b) in enumerate(zip(original, pred, strict=True)) if a != b]
    return float(len(diffs) == 1 and pred[diffs[0]] == word)


@dataclass(frozen=True)
class ListSource:
    """What a list family is made of and how its prompts talk about it."""

    family: str  # "lists" | "letters"
    noun: str  # "waiting line", "list"
    item_noun: str  # "person", "letter"
    quote: bool  # render items in double quotes
    sort_phrase: str  # e.g. "alphabetically by last name"
    sort_key: Callable[[str], str]
    sample: Callable[[random.Random], list[str]]  # a fresh input list
    fresh: Optional[Callable[[random.Random, Sequence[str]], str]]  # a new item not in the list
    max_len: int  # longest input list
    max_item_chars: int  # longest item, unquoted

    def render(self, items: Sequence[str]) -> str:
        return render_list(items, self.quote)

    def show(self, word: str) -> str:
        """An item as written inside an instruction."""
        return f'"{word}"' if self.quote else word

    def rendered_chars(self, n_items: int) -> int:
        """Length of the longest rendering of `n_items` items."""
        cell = self.max_item_chars + (2 if self.quote else 0)
        return 2 + n_items * cell + 2 * max(n_items - 1, 0)


class ListTask(Task):
    """A list in, a list out. Subclasses set `op` and implement `edit`; scoring is exact."""

    op: str = ""
    deterministic_op: bool = True

    def __init__(self, source: ListSource) -> None:
        self.source = source
        super().__init__(
            f"{source.family}.{self.op}",
            deterministic=self.deterministic_op,
            max_new_tokens=self._budget(),
        )

    def _budget(self) -> int:
        """Token budget for the longest answer, counting each item as at least two tokens."""
        n = self.max_answer_len()
        return token_budget(max(self.source.rendered_chars(n), 4 * n))

    def max_answer_len(self) -> int:
        """Longest possible answer list (sets the generation budget)."""
        return self.source.max_len

    def make_item(self, rng: random.Random) -> Item:
        items = self.source.sample(rng)
        instruction, answer, extra = self.edit(rng, items)
        prompt = f"{instruction}: {self.source.render(items)}"
        return self.item(prompt, self.source.render(answer), input=items, **extra)

    @abstractmethod
    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        """The instruction, the reference answer and extra scorer data for `items`."""

    def score(self, item: Item, output: str) -> float:
        return exact_score(item.reference, output)


class CopyTask(ListTask):
    op = "copy"

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        return f"Copy this {self.source.noun} exactly", list(items), {}


class ReverseTask(ListTask):
    op = "reverse"

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        return f"Reverse this {self.source.noun}", items[::-1], {}


class SortTask(ListTask):
    op = "sort"

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        src = self.source
        return f"Sort this {src.noun} {src.sort_phrase}", sorted(items, key=src.sort_key), {}


class ShuffleTask(ListTask):
    """Any order different from the input is right."""

    op = "shuffle"
    deterministic_op = False

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        if len(set(items)) < 2:
            raise ValueError("shuffle needs at least two distinct items")
        answer = list(items)
        while answer == items:
            rng.shuffle(answer)
        return f"Shuffle this {self.source.noun} into a different order", answer, {}

    def score(self, item: Item, output: str) -> float:
        return shuffle_score(item.data["input"], output)


def _needs_fresh(source: ListSource) -> Callable[[random.Random, Sequence[str]], str]:
    if source.fresh is None:
        raise ValueError(f"{source.family} lists have no way to draw new items")
    return source.fresh


class InsertIndexTask(ListTask):
    op = "insert_index"

    def max_answer_len(self) -> int:
        return self.source.max_len + 1

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        word, index = _needs_fresh(self.source)(rng, items), rng.randint(0, len(items))
        src = self.source
        text = f"Insert {src.show(word)} at position {index} (counting from 0) in this {src.noun}"
        return text, [*items[:index], word, *items[index:]], {"word": word, "index": index}


class RemoveIndexTask(ListTask):
    op = "remove_index"

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        index = rng.randrange(len(items))
        src = self.source
        text = f"Remove the {src.item_noun} at position {index} (counting from 0) from this {src.noun}"
        return text, [*items[:index], *items[index + 1 :]], {"index": index}


class ReplaceIndexTask(ListTask):
    op = "replace_index"

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        word, index = _needs_fresh(self.source)(rng, items), rng.randrange(len(items))
        src = self.source
        text = (
            f"Replace the {src.item_noun} at position {index} (counting from 0) "
            f"with {src.show(word)} in this {src.noun}"
        )
        return text, [*items[:index], word, *items[index + 1 :]], {"word": word, "index": index}


class InsertRandomTask(InsertIndexTask):
    """`word` at any position is right; the reference puts it at a random one."""

    op = "insert_random"
    deterministic_op = False

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        _, answer, extra = super().edit(rng, items)
        word = extra["word"]
        return f"Insert {self.source.show(word)} anywhere in this {self.source.noun}", answer, {"word": word}

    def score(self, item: Item, output: str) -> float:
        return insert_random_score(item.data["input"], item.data["word"], output)


class RemoveRandomTask(RemoveIndexTask):
    """Removing any one item is right."""

    op = "remove_random"
    deterministic_op = False

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        _, answer, _ = super().edit(rng, items)
        return f"Remove any one {self.source.item_noun} from this {self.source.noun}", answer, {}

    def score(self, item: Item, output: str) -> float:
        return remove_random_score(item.data["input"], output)


class ReplaceRandomTask(ReplaceIndexTask):
    """Replacing any one item by `word` is right."""

    op = "replace_random"
    deterministic_op = False

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        _, answer, extra = super().edit(rng, items)
        word, src = extra["word"], self.source
        text = f"Replace any one {src.item_noun} with {src.show(word)} in this {src.noun}"
        return text, answer, {"word": word}

    def score(self, item: Item, output: str) -> float:
        return replace_random_score(item.data["input"], item.data["word"], output)
