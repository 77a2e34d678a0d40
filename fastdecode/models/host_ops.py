"""Count the host work of a decode step: the torch operations dispatched outside a captured forward, and the reads
from the device to the host (issue #30: on a GPU each operation is a launch or a dispatch around the graph's
replay, and each read a synchronisation). Shared by `tools/host_ops.py` (the per-line report docs/gpu.md quotes) and
the regression guard `tests/invariants/test_host_ops.py`.

    with HostOps() as count:
        session.step()
    count.ops, count.launches, count.reads, count.by_line
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .base import on_host
from .graphs import REPLAYS

_SCALAR = torch.ops.aten._local_scalar_dense.default  # .item(), int(t), bool(t)
_COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)
_METADATA = (torch.ops.aten.detach_.default, torch.ops.aten.detach.default)  # no kernel, though not views


class HostOps(TorchDispatchMode):
    """Every dispatched operation while counting, by the fastdecode line that issued it (`by_line`: "file:line
    op"), and the device-to-host reads (`reads`): `.item()` and the like, copies from another device to the CPU, and
    `.tolist()` (which on a CPU tensor dispatches nothing, so it is counted where it is called). The body of a
    captured graph (`graphs.REPLAYS`: `Graphs._replay`, a forward; `StepGraph.replay`, a drafter's step: one launch
    each on a GPU) is not counted. `launches`: the operations that run a kernel or a copy on a GPU, the others
    being views and metadata (`slice`, `expand`, `detach_`: host work only)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_line: Counter[str] = Counter()
        self.launches = 0
        self.reads = 0
        self._paused = 0
        self._stack = contextlib.ExitStack()

    @property
    def ops(self) -> int:
        return sum(self.by_line.values())

    def __enter__(self) -> HostOps:
        super().__enter__()
        self._stack.enter_context(self._tolist_counted())
        self._stack.enter_context(self._replays_uncounted())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._paused:
            ours = [f for f in traceback.extract_stack() if "/fastdecode/" in f.filename and f.filename != __file__]
            where = f"{ours[-1].filename.split('fastdecode/')[-1]}:{ours[-1].lineno}" if ours else "?"
            self.by_line[f"{where} {func}"] += 1
            if not func.is_view and func not in _METADATA and func is not _SCALAR:
                self.launches += 1
            if func is _SCALAR or (func in _COPIES and _to_host(args, out)):
                self.reads += 1
        return out

    @contextlib.contextmanager
    def _tolist_counted(self) -> Iterator[None]:
        original = torch.Tensor.tolist

        def tolist(tensor: torch.Tensor) -> Any:
            if not self._paused:
                self.reads += 1
            self._paused += 1  # (its own dispatches, if any, are the read)
            try:
                return original(tensor)
            finally:
                self._paused -= 1

        torch.Tensor.tolist = tolist  # type: ignore[assignment]
        try:
            yield
        finally:
            torch.Tensor.tolist = original  # type: ignore[method-assign]

    @contextlib.contextmanager
    def _replays_uncounted(self) -> Iterator[None]:
        replays = list(REPLAYS)
        originals = [getattr(owner, name) for owner, name in replays]

        def uncounted(original: Any) -> Any:
            def replay(*args: Any) -> None:
                self._paused += 1
                try:
                    original(*args)
                finally:
                    self._paused -= 1
            return replay

        for (owner, name), original in zip(replays, originals, strict=True):
            setattr(owner, name, uncounted(original))
        try:
            yield
        finally:
            for (owner, name), original in zip(replays, originals, strict=True):
                setattr(owner, name, original)


def _to_host(args: tuple[Any, ...], out: Any) -> bool:
    """A copy whose result is on the CPU and whose source is not."""
    if not isinstance(out, torch.Tensor) or not on_host(out.device):
        return False
    return any(isinstance(a, torch.Tensor) and not on_host(a.device) for a in args)
