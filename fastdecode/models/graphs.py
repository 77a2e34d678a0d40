"""CUDA graphs of the direct forward in exact mode: one captured forward per cache and batch, replayed every step.

On a GPU a decode step of a small or mid-sized model is launch-bound: a 1.1B Llama runs ~300 kernels per forward, and
launching them from Python costs about 12 ms while the weights take about 0.5 ms to read (issue #30). A CUDA graph
records the kernels of one forward once and launches them all with one call. Capturing needs fixed shapes and fixed
addresses, which exact mode (models/exact.py) already gives: every cached forward of a generation runs `width`
query tokens over the cache's whole storage, so a decode step, a verification block and a chunk of a prefill are one
computation on different inputs, and one graph serves them all.

What a graph holds fixed, and what each replay copies in:

- inputs copied into static buffers before each replay: the token ids and positions `[B, W]`, the attention plan's
  `allow` mask `[B, W, K]` and the cache columns the new keys are written to `[B, W]` (always scattered: the start
  column of a plain slice would be baked into the graph);
- read in place: the cache's key/value storage and its positions `[B, K]` (the plan's key positions), whose addresses
  stay the same until the cache reallocates them (`KVCache.moved`: a grown, resized or newly initialised cache drops
  its graphs and captures again);
- outputs: the logits `[B, W, V]` and the last hidden states, cloned after the replay (the next replay overwrites
  the static ones).

The graphs live on the cache (`KVCache.graphs`); each has its own memory pool. A cache that dies or moves its storage
retires them, and the next graphed forward destroys them: destroying a graph while another stream captures one (the
garbage collector can free a cache during torch.compile's own captures) invalidates that capture. The first
forward over a new cache runs eagerly (it allocates the storage); the second captures (a warm-up run on a side stream,
then the capture) and every later one replays. What is not graphed runs the direct forward as before: sparse
attention rules, forwards that ask for layer outputs, models without the direct forward, exact mode off.

`mode="replay"` runs the same static-buffer path without capturing (the body is called again at each replay), so the
CPU tests check everything but the capture itself; `mode="cuda"` captures. `load(graphs=None)` turns CUDA graphs on
where exact mode is on CUDA; `model.graphs = None` turns them off after loading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .. import attention
from ..cache.kv import free_retired_graphs
from ..errors import ParameterError

Mode = Literal["cuda", "replay"]


@dataclass
class _Entry:
    """One captured forward: its static inputs and outputs, and how to run it again."""

    ids: torch.Tensor  # [B, W] long
    positions: torch.Tensor  # [B, W] long
    allow: torch.Tensor  # [B, W, K] bool
    write: torch.Tensor  # [B, W] long: the cache columns of the new keys
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits [B, W, V], hidden [B, W, H])
    graph: Any = None  # torch.cuda.CUDAGraph (mode "cuda")
    body: Callable[[Any], tuple[torch.Tensor, torch.Tensor]] | None = None  # mode "replay": run(cache)


class Graphs:
    """Captured forwards of one model's `NativeForward` (see the module docstring). `stats` counts captures,
    replays and eager forwards, for tests and reports."""

    def __init__(self, native: Any, mode: Mode = "cuda") -> None:
        if mode not in ("cuda", "replay"):
            raise ParameterError(f"graphs mode {mode!r}: 'cuda' (capture CUDA graphs) or 'replay' (the same static "
                                 "buffers without capturing, for the CPU)")
        self.native = native
        self.mode: Mode = mode
        self.stats = {"captures": 0, "replays": 0, "eager": 0}

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any,
                 plan: attention.Plan) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits `[B, W, V]` and last hidden states `[B, W, H]` of one exact-mode forward whose plan the cache
        has just made (`KVCache.begin`); the new keys and values are written to the cache as the direct forward
        would."""
        free_retired_graphs()
        B, W = ids.shape
        K = plan.allow.shape[-1]
        key = (B, W, K)
        entry = cache.graphs.get(key)  # (a cache that moved its storage has retired its graphs: `KVCache.moved`)
        if entry is None:
            if not cache.storage_ready():
                # the first forward allocates the storage: run it eagerly, capture at the next one
                self.stats["eager"] += 1
                logits, hidden, _ = self.native(ids, positions, cache, plan, None, None)
                return logits, hidden
            entry = self._capture(ids, positions, cache, plan, key)
        else:
            entry.ids.copy_(ids)
            entry.positions.copy_(positions)
            entry.allow.copy_(plan.allow)
            entry.write.copy_(cache.write_columns())
            self._replay(entry, cache)
        assert entry.outputs is not None
        logits, hidden = entry.outputs
        return logits.clone(), hidden.clone()

    def _body(self, entry: _Entry, K: int) -> Callable[[Any], tuple[torch.Tensor, torch.Tensor]]:
        """One forward over the entry's static buffers: the cache writes at `entry.write` (scattered) and the plan
        reads the cache's positions in place. The cache is an argument, not a closure variable: the cache holds its
        entries, which must not hold it back."""
        native = self.native

        def run(cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
            plan = attention.Plan(allow=entry.allow, q_pos=entry.positions, k_pos=cache.positions[:, :K])
            with cache.scattered(entry.write):
                logits, hidden, _ = native(entry.ids, entry.positions, cache, plan, None, None)
            return logits, hidden
        return run

    def _capture(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any, plan: attention.Plan,
                 key: tuple[int, int, int]) -> _Entry:
        entry = _Entry(ids.clone(), positions.clone(), plan.allow.clone(), cache.write_columns().clone())
        body = self._body(entry, key[2])
        if self.mode == "replay":
            entry.body = body
            entry.outputs = body(cache)
        else:
            # warm up on a side stream (lazy initialisations such as cuBLAS workspaces must not be captured); the
            # warm-up writes the same keys and values to the same columns as the replay after the capture
            stream = torch.cuda.Stream(device=ids.device)
            stream.wait_stream(torch.cuda.current_stream(ids.device))
            with torch.cuda.stream(stream):
                body(cache)
            torch.cuda.current_stream(ids.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                entry.outputs = body(cache)
            entry.graph = graph
            graph.replay()  # the capture recorded the kernels without running them
        self.stats["captures"] += 1
        cache.graphs[key] = entry
        return entry

    def _replay(self, entry: _Entry, cache: Any) -> None:
        if entry.graph is not None:
            entry.graph.replay()
        else:
            assert entry.body is not None
            entry.outputs = entry.body(cache)
        self.stats["replays"] += 1


def graphs_mode(value: bool | str | None, device: torch.device, exact: object) -> Mode | None:
    """What `load(graphs=...)` means: None turns CUDA graphs on where they apply (exact mode on a CUDA device), False
    off, True or "cuda" on (a CUDA device and exact mode needed), "replay" the capture-free path (any device, for
    tests)."""
    if value is None:
        return "cuda" if device.type == "cuda" and exact is not None else None
    if value is False:
        return None
    if value is True or value == "cuda":
        if device.type != "cuda":
            raise ParameterError(f"graphs=True captures CUDA graphs, but the model is on {device}: load it on a CUDA "
                                 "device, or leave graphs=None (on where they apply).")
        if exact is None:
            raise ParameterError("CUDA graphs need exact mode's fixed shapes: load with exact=True (or exact=None in "
                                 "bfloat16/float16 on CUDA).")
        return "cuda"
    if value == "replay":
        if exact is None:
            raise ParameterError("graphs='replay' runs exact mode's fixed shapes: load with exact=True too.")
        return "replay"
    raise ParameterError(f"graphs={value!r}: pass None (on where they apply), True, False or 'replay'.")
