"""Shared pieces of the task suite: seed ranges, the prompt format, `Item` and `Task`."""

from __future__ import annotations

import hashlib
import math
import random
import weakref
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

TRAIN_SEEDS = range(0, 1_000_000)  # seeds the trainer may use
TEST_SEED_START = 1_000_000  # every seed >= this is a test seed
DEFAULT_TEST_SEED = TEST_SEED_START
PROMPT_TEMPLATE = "Q: {prompt}\nA: "  # the one prompt format every zoo model is trained on
FAMILIES = ("lists", "letters", "puzzles", "code", "longctx")
CANVAS_ITEMS = 1000  # training items whose answers size a diffusion canvas
CANVAS_MARGIN = 4  # tokens of slack beyond the longest of them
# tokenizer -> task -> canvas
_canvas_cache: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def format_prompt(prompt: str) -> str:
    """Wrap a task prompt in the zoo's question/answer template."""
    return PROMPT_TEMPLATE.format(prompt=prompt)


def check_seed(seed: int) -> int:
    """Return `seed` if it is a non-negative int, else raise."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(
            f"seed must be >= 0, got {seed}; train seeds are {TRAIN_SEEDS.start}..{TRAIN_SEEDS.stop - 1}, "
            f"test seeds start at {TEST_SEED_START}"
        )
    return seed


def check_count(n: int) -> int:
    """Return `n` if it is a positive int, else raise."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (number of items) must be a positive int, got {n!r}")
    return n


def is_test_seed(seed: int) -> bool:
    """True for held-out evaluation seeds (>= TEST_SEED_START)."""
    return check_seed(seed) >= TEST_SEED_START


def task_rng(name: str, seed: int) -> random.Random:
    """A generator seeded from sha256 of "name:seed" (stable across runs and Python versions)."""
    digest = hashlib.sha256(f"{name}:{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def token_budget(max_chars: int) -> int:
    """Generation budget for answers of up to `max_chars` characters.

    Assumes a worst case of one token per two characters, adds 8 tokens of slack and rounds up
    to a multiple of 16.
    """
    return 16 * math.ceil((max_chars / 2 + 8) / 16)


@dataclass(frozen=True)
class Item:
    """One task instance. `data` holds the JSON-serialisable facts the scorer needs."""

    task: str  # task name, e.g. "lists.sort"
    prompt: str  # task text shown to the model (before `format_prompt`)
    reference: str  # one canonical correct answer (the training target)
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (inverse of `from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Item:
        """Rebuild an item from `to_dict` output."""
        return cls(row["task"], row["prompt"], row["reference"], dict(row.get("data", {})))


class Task(ABC):
    """A generator of items plus an exact scorer.

    `items(seed, n)` is deterministic in (name, seed, n) and prefix-stable:
    `items(s, n)[:m] == items(s, m)` for m <= n.
    """

    def __init__(self, name: str, *, deterministic: bool, max_new_tokens: int) -> None:
        family = name.split(".", 1)[0]
        if family not in FAMILIES or "." not in name:
            raise ValueError(f"task name {name!r} must look like '<family>.<op>' with family in {FAMILIES}")
        self.name = name
        self.family = family
        self.deterministic = deterministic  # True when the reference is the only correct answer
        self.max_new_tokens = max_new_tokens

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def canvas_length(self, tokenizer: Any) -> int:
        """The diffusion canvas (masks to decode) for this task and a model's tokenizer.

        `max_new_tokens` assumes the worst tokenizer (one token per two characters); a masked-diffusion model
        computes every canvas position at every step and is trained on answers padded with EOS to its canvas, so
        its canvas is fitted to its tokenizer instead: the longest answer plus EOS among the first CANVAS_ITEMS
        training items, plus CANVAS_MARGIN, rounded up to a multiple of 16, never above `max_new_tokens`. Only
        training items are read, so the test split decides nothing. Code answers are cut by characters rather
        than drawn from a closed set, so code keeps `max_new_tokens`.
        """
        if self.family == "code":
            return self.max_new_tokens
        known = _canvas_cache.setdefault(tokenizer, {})  # per tokenizer object: two with one name may differ
        if self.name not in known:
            answers = [i.reference for i in self.items(TRAIN_SEEDS.start, CANVAS_ITEMS)]
            longest = max(len(ids) for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]) + 1
            known[self.name] = min(self.max_new_tokens, 16 * math.ceil((longest + CANVAS_MARGIN) / 16))
        return known[self.name]

    def items(self, seed: int, n: int) -> list[Item]:
        """`n` items drawn from one random stream seeded by (task name, seed)."""
        check_seed(seed)
        check_count(n)
        rng = task_rng(self.name, seed)
        return [self.make_item(rng) for _ in range(n)]

    @abstractmethod
    def make_item(self, rng: random.Random) -> Item:
        """Draw one item from `rng`."""

    @abstractmethod
    def score(self, item: Item, output: str) -> float:
        """Score a model output for `item` in [0, 1] (1 = correct)."""

    def item(self, prompt: str, reference: str, **data: Any) -> Item:
        """Build an `Item` of this task."""
        return Item(self.name, prompt, reference, data)
