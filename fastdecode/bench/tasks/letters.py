"""Letter-list tasks (`letters.*`): lists of 4-16 uppercase letters (repeats allowed), after the
synthetic case studies of ParallelBench §1.3. Rendered bare: `[A, C, B]`."""

from __future__ import annotations

import random
import string

from ._lists import CopyTask, ListEdit, ListSource, ListTask, ReverseTask, SortTask

MIN_LETTERS, MAX_LETTERS = 4, 16
MIN_REPEAT, MAX_REPEAT = 2, 3


def sample_letters(rng: random.Random) -> list[str]:
    """4-16 uppercase letters drawn with replacement."""
    return [rng.choice(string.ascii_uppercase) for _ in range(rng.randint(MIN_LETTERS, MAX_LETTERS))]


LETTERS = ListSource(
    family="letters",
    noun="list",
    item_noun="letter",
    quote=False,
    sort_phrase="alphabetically",
    sort_key=str,
    sample=sample_letters,
    fresh=None,
    max_len=MAX_LETTERS,
    max_item_chars=1,
)


class RepeatTask(ListTask):
    """Each letter written k times in place (k in 2..3): [A, B] x2 -> [A, A, B, B]."""

    op = "repeat"

    def max_answer_len(self) -> int:
        return self.source.max_len * MAX_REPEAT

    def edit(self, rng: random.Random, items: list[str]) -> ListEdit:
        k = rng.randint(MIN_REPEAT, MAX_REPEAT)
        example = self.source.render(["A"] * k + ["B"] * k)
        text = f"Repeat each {self.source.item_noun} {k} times, so [A, B] becomes {example}"
        return text, [x for x in items for _ in range(k)], {"k": k}


TASKS = tuple(cls(LETTERS) for cls in (CopyTask, ReverseTask, SortTask, RepeatTask))
