"""A step's drafting in one captured graph: the draft model's best-first tree (`model_tree.TreeGraph`), EAGLE-3's
chain or tree (`drafters/eagle3.HeadGraph`). On a GPU each of these steps was tens of small launches a level from the
host; with fixed shapes (exact mode's cache, a head cache kept in blocks) and nothing read, the whole step is one
computation that a CUDA graph records once and replays (docs/gpu.md, "A best-first tree in one graph").

`StepGraph` holds a body (device operations only, its static inputs its own) and its outputs; `StepGraphs` runs one
for a drafter: it captures it the first time on CUDA (elsewhere the body runs again at each replay, the same
arithmetic without the capture: the CPU tests), replays it after, counts both, hands out copies of the outputs (the
next replay overwrites them), and where a capture fails (a checkpoint's code that reads a value while capturing)
warns once and says so, for the drafter to go on without graphs."""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..cache.pool import retire_graphs
from ..errors import FastDecodeWarning
from ..models.graphs import REPLAYS, capture


class StepGraph:
    """One step's body and its outputs; `graph` once captured (else `replay` runs the body again)."""

    def __init__(self) -> None:
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.graph: Any = None  # torch.cuda.CUDAGraph

    def body(self, arg: Any) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def replay(self, arg: Any) -> None:
        """The captured graph (one launch on a GPU: `HostOps` counts nothing inside it), or the body again."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.outputs = self.body(arg)


REPLAYS.append((StepGraph, "replay"))


class StepGraphs:
    """Runs a drafter's step graphs (`run`); `stats`: captures and replays; `failed`: why a capture failed, if one
    did (the drafter then drafts without graphs). A drafter's own is `shared` with its owner's (`of`: its head, its
    draft model), where a failure is recorded, so that the owner's later drafters try no capture again and warn no
    more; the owner's also keeps graphs that need no storage of a drafter's (`kept`: Hydra's), retired when it dies."""

    _owned: weakref.WeakKeyDictionary[Any, StepGraphs] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, what: str, shared: StepGraphs | None = None) -> None:
        self.what = what  # the drafter, as its warning names it
        self.stats = {"captures": 0, "replays": 0}
        self.shared = shared
        self._failed: str | None = None
        self.kept: dict[tuple[Any, ...], StepGraph] = {}

    @classmethod
    def of(cls, owner: Any, what: str) -> StepGraphs:
        """The step graphs of `owner` (a head, a draft model), one per owner while it lives."""
        with cls._lock:
            found = cls._owned.get(owner)
            if found is None:
                found = cls._owned[owner] = StepGraphs(what)
                weakref.finalize(owner, retire_graphs, found.kept)  # (destroyed at the next graphed call, not by GC)
            return found

    @property
    def failed(self) -> str | None:
        return self.shared.failed if self.shared is not None else self._failed

    @failed.setter
    def failed(self, why: str | None) -> None:
        if self.shared is not None:
            self.shared.failed = why
        else:
            self._failed = why

    def run(self, entry: StepGraph, fresh: bool, arg: Any, capturing: bool, device: torch.device,
            undo: Callable[[], None]) -> tuple[torch.Tensor, ...] | None:
        """The outputs of `entry` run on `arg` (copies): captured where it is `fresh` and `capturing`, else run
        (replayed, or its body run again). On an error `undo` puts back what the caller prepared; a failed capture
        warns and gives None, any other error is raised."""
        try:
            if fresh and capturing:
                entry.graph, entry.outputs = capture(entry.body, arg, device)
            else:
                entry.replay(arg)
        except Exception as e:
            undo()
            if not (fresh and capturing):
                raise
            self.failed = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"{self.what} drafts without graphs from now on: its step could not be captured in a CUDA "
                          f"graph ({self.failed}); the same drafts, more host work", FastDecodeWarning, stacklevel=4)
            return None
        self.stats["captures" if fresh else "replays"] += 1
        assert entry.outputs is not None
        return tuple(t.clone() for t in entry.outputs)
