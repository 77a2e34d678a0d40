"""Drafter state that outlives a request: a `DrafterMemory` object carried in the run context.

spec.suffix keeps a global tree of earlier outputs and spec.recycling its adjacency matrix across requests, as
their authors' code does. They keep them in the run's memory, `generate(..., memory=...)`; without one, a run
uses its target model's own memory (`memory_of(model)`), so successive calls to `generate` on one model share
what they learnt, as before; a seeded sampled run neither reads nor extends it (`learns_across_requests`), so
that its seed repeats. `memory.clear()` (or `forget(model)` for a model's own) empties it, e.g. so that a
warm-up run does not hand the first measured request its own answer; a benchmark keeps one memory per method
configuration and passes it to that configuration's runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..registry import RunContext

T = TypeVar("T")


class DrafterMemory:
    """What drafters keep across requests: one object per key (e.g. `("spec.suffix", max_depth)`), made on first use.

    A memory belongs to one target model: the state in it (token trees, a `[V, k]` matrix) is about that model's
    outputs. Not thread-safe: runs that share a memory must not run at the same time.
    """

    def __init__(self) -> None:
        self._items: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The object kept under `key`; `make()` makes it the first time."""
        if key not in self._items:
            self._items[key] = make()
        return self._items[key]

    def clear(self) -> None:
        """Forget everything drafters learnt from earlier requests."""
        self._items.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"DrafterMemory({sorted(map(repr, self._items))})"


# each model's own memory, used by runs that pass none; dropped with the model
_OWN: weakref.WeakKeyDictionary[Any, DrafterMemory] = weakref.WeakKeyDictionary()


def memory_of(model: Any) -> DrafterMemory:
    """The memory runs on `model` use when they are given none."""
    memory = _OWN.get(model)
    if memory is None:
        memory = _OWN[model] = DrafterMemory()
    return memory


def run_memory(ctx: RunContext, model: Any) -> DrafterMemory:
    """The memory of a run: the run context's (`generate(..., memory=...)`), else the target model's own."""
    return ctx.memory if ctx.memory is not None else memory_of(model)


def learns_across_requests(cfg: Any, generator: Any = None) -> bool:
    """Whether a run may read and extend the memory of earlier requests: every run but a seeded sampled one (a
    `seed`, or the caller's own `generator=`, at a temperature above 0).

    At a temperature above 0 the drafts decide which random numbers the accept rule draws, so a seeded run that
    drafted from what earlier requests left would give another text each time; it drafts from its own prompt and
    output only, and leaves the memory as it found it, so that its seed repeats. Greedy runs never depend on their
    drafts' tokens, and unseeded ones draw from torch's global RNG, so both keep learning.
    """
    seeded = getattr(cfg, "seed", None) is not None or generator is not None
    return not seeded or float(getattr(cfg, "temperature", 0.0)) == 0


def forget(model: Any) -> None:
    """Drop everything drafters remember from earlier requests on `model` (its own memory: `memory_of(model)`)."""
    memory_of(model).clear()
