"""Storage that outlives a generation: a finished cache's tensors and CUDA graphs, handed to the next cache.

Every generation makes a new `KVCache`, and a new cache pays twice before its forwards replay a captured graph
(models/graphs.py): an eager first forward (which allocates the storage) and a capture. On an H200 that was 80 ms per
generation of a 1.1B model, 15 decode steps (issue #30). The graphs read the storage in place, so they stay valid as
long as the same tensors do: a `Storage` bundles a cache's tensors with the graphs captured over them, and a
`StoragePool` (one per graphed model) keeps the bundles of dead caches for the next cache of the same key.

Ownership: a bundle belongs to one live cache at a time. `take` removes it from the pool; it comes back only when its
cache dies (a `weakref.finalize` callback that holds the bundle, never the cache) or hands it back (`KVCache.release`).
A cache that reallocates its storage (`KVCache.moved`) empties its bundle and retires the graphs, so a bundle in the
pool never holds graphs over tensors other than its own (a resize hands the old rows' bundle to the pool first). The
pool keeps at most `limit` bundles (4 by default), the oldest dropped first: its memory is at most that of `limit`
caches of the model; `limit = 0` keeps none, `clear()` frees them.

Graphs are never destroyed here: a bundle dropped from the pool has its graphs retired (`retire_graphs`) and the
next graphed forward destroys them (`free_retired_graphs`), since a cache can die while another stream captures.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

# Graphs no longer used (their cache moved its storage, or their bundle left the pool), kept alive until the graph
# code's next call frees them (`free_retired_graphs`). Destroying a CUDA graph is not allowed while any stream captures
# one, and a cache can die at any moment (Python's garbage collector), e.g. while torch.compile's own CUDA graphs are
# being captured.
_RETIRED: list[Any] = []


def retire_graphs(graphs: dict[Any, Any]) -> None:
    """Move every graph of `graphs` to the retired list (no CUDA call: safe at any moment) and empty it."""
    _RETIRED.extend(graphs.values())
    graphs.clear()


def free_retired_graphs() -> int:
    """Destroy the retired graphs (call where no capture is under way); returns how many there were."""
    n = len(_RETIRED)
    _RETIRED.clear()
    return n


# what a bundle must match to serve a new cache: for a model's, (rows, capacity, layer types, full width, device);
# the layers' head counts and dtype are the model's, and a pool belongs to one model. (A pool of other storage keys
# it as it needs: EAGLE-3's head caches by capacity, speculative/drafters/eagle3.py.)
Key = tuple[Any, ...]


@dataclass(eq=False)
class Storage:
    """One cache's storage: each layer's keys and values `[B, H, cap, D]`, the positions and valid flags `[B, cap]`,
    and the graphs captured over them (by (batch, width, key width)). `key` is None until `fill` records the
    tensors (at a capture or a resize: a bundle whose storage is not allocated yet is not worth keeping), and again
    after `clear`."""

    graphs: dict[Any, Any] = field(default_factory=dict)
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    key: Key | None = None

    def fill(self, key: Key, keys: list[torch.Tensor], values: list[torch.Tensor], positions: torch.Tensor,
             valid: torch.Tensor) -> None:
        """Record the tensors the graphs read (the cache's current storage)."""
        self.key, self.keys, self.values, self.positions, self.valid = key, keys, values, positions, valid

    def clear(self) -> None:
        """The cache reallocated (or gave up) these tensors: forget them and retire the graphs that read them."""
        retire_graphs(self.graphs)
        self.key, self.keys, self.values, self.positions, self.valid = None, [], [], None, None


class StoragePool:
    """Bundles of dead caches of one model, at most `limit` of them (the oldest dropped first; several may share a
    key: a target and a draft of the same model live at once); see the module docstring. Thread-safe: a cache may die
    in any thread, whenever the garbage collector runs."""

    def __init__(self, limit: int = 4) -> None:
        if limit < 0:
            raise ValueError(f"a storage pool keeps limit >= 0 bundles (0 keeps none), not {limit}")
        self.limit = limit
        self._free: list[Storage] = []  # oldest first
        self._lock = threading.RLock()  # re-entrant: a finalizer may run inside `take` on the same thread
        self._taking = False
        weakref.finalize(self, _retire_all, self._free)

    def __len__(self) -> int:
        return len(self._free)

    def take(self, key: Key) -> Storage | None:
        """The newest kept bundle of `key`, removed from the pool (its new cache owns it alone), or None."""
        with self._lock:
            # a cache dying inside this loop (on this thread) only appends: the indices stay, the oldest go after
            self._taking = True
            try:
                for i in range(len(self._free) - 1, -1, -1):
                    if self._free[i].key == key:
                        return self._free.pop(i)
                return None
            finally:
                self._taking = False
                self._trim()

    def give(self, storage: Storage) -> None:
        """Keep a dead cache's bundle; an unfilled one (moved storage, never allocated) is only cleared."""
        if storage.key is None or self.limit == 0:
            storage.clear()
            return
        with self._lock:
            if any(kept is storage for kept in self._free):
                return
            self._free.append(storage)
            if not self._taking:
                self._trim()

    def _trim(self) -> None:
        """Drop the oldest bundles past `limit` (their graphs retired)."""
        while len(self._free) > self.limit:
            self._free.pop(0).clear()

    def clear(self) -> None:
        """Drop every kept bundle (their memory is freed, their graphs retired)."""
        with self._lock:
            _retire_all(self._free)


def _retire_all(free: list[Storage]) -> None:
    for storage in free:
        storage.clear()
    free.clear()


def recycle(storage: Storage, pool: StoragePool | None) -> None:
    """A cache's finalizer: its bundle goes back to `pool` (if filled), else its graphs are retired."""
    if pool is None:
        storage.clear()
    else:
        pool.give(storage)
