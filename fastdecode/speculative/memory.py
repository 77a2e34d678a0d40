"""Drafter state that outlives a request: one store per drafter kind, keyed weakly by the target model.

spec.suffix keeps a global tree of earlier outputs and spec.recycling its adjacency matrix across requests, as
their authors' code does. `forget(model)` empties every store for a model, e.g. so that a benchmark's warm-up
run does not hand the first measured request its own answer. `recall` and `restore` hand a model's memories out
and back, so that a benchmark can keep one memory per method configuration while it interleaves their requests.
"""

from __future__ import annotations

import weakref
from typing import Any

_STORES: list[weakref.WeakKeyDictionary] = []


def store() -> weakref.WeakKeyDictionary:
    """A new per-model store that `forget` empties."""
    new: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _STORES.append(new)
    return new


def remembers(model: Any) -> bool:
    """Whether any drafter keeps state from earlier requests on `model`."""
    return any(model in s for s in _STORES)


def forget(model: Any) -> None:
    """Drop everything drafters remember from earlier requests on `model`."""
    for s in _STORES:
        s.pop(model, None)


def recall(model: Any) -> dict[int, Any]:
    """Everything drafters remember about `model`, for `restore`."""
    return {i: s[model] for i, s in enumerate(_STORES) if model in s}


def restore(model: Any, memory: dict[int, Any]) -> None:
    """Make `memory` (from `recall`; {} for nothing) what drafters remember about `model`."""
    forget(model)
    for i, value in memory.items():
        _STORES[i][model] = value
