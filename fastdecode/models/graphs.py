"""CUDA graphs of the direct forward in exact mode: one captured forward per cache and batch, replayed every step.

On a GPU a decode step of a small or mid-sized model is launch-bound: a 1.1B Llama runs ~300 kernels per forward, and
launching them from Python costs about 12 ms while the weights take about 0.5 ms to read (issue #30). A CUDA graph
records the kernels of one forward once and launches them all with one call. Capturing needs fixed shapes and fixed
addresses, which exact mode (models/exact.py) already gives: every cached forward of a generation runs `width`
query tokens over the cache's whole storage, so a decode step, a verification block and a chunk of a prefill are one
computation on different inputs, and one graph serves them all.

What a graph holds fixed, and what each replay copies in (kept small: every operation outside the graph is host
work per step; on an H200 the step is now bound by the replay itself, docs/gpu.md):

- copied into static buffers before each replay: the block's token ids and positions `[B, T]` (unpadded: exact
  mode's padding to `W` is made inside the graph) and `meta` `[B, 2]`, each row's first new cache column and the
  block's length T, in one small host-to-device copy;
- the attention plan is built inside the graph (`KVCache.place`) from `meta` and the block's `real` `[B, W]`,
  `visible` `[B, W, W]` and `past` `[B, W, K]` buffers; a plain causal block of real tokens (a decode step, a chain
  verification, a prefill without padding) copies none of them: the buffers keep the plain block's values, and the
  graph masks what lies past T;
- read in place: the cache's key/value storage, positions and valid flags, whose addresses stay the same until the
  cache reallocates them (`KVCache.moved`: a grown, resized or newly initialised cache drops its graphs and captures
  again); the new keys are always scattered (the start column of a plain slice would be baked into the graph);
- outputs: the float32 logits `[B, W, V]` and the last hidden states; the block's T rows are cloned after the
  replay (the next replay overwrites the static ones).

Padding rows (T to W) differ from the eager path's in their position (the eager path repeats the last one) only
where a row's own output is concerned: no real row sees a padding column, and every row of a block is computed
independently, so the real rows' outputs are the eager ones.

The graphs live on the cache (`KVCache.graphs`), in its storage bundle (cache/pool.py); each has its own memory
pool. A cache that moves its storage retires them, and the next graphed forward destroys them: destroying a graph
while another stream captures one (the garbage collector can free a cache during torch.compile's own captures)
invalidates that capture. The first forward over a new cache runs eagerly (it allocates the storage); the second
captures (a warm-up run on a side stream, then the capture) and every later one replays. A cache that dies hands its
bundle (storage and graphs) to `Graphs.pool`, and the model's next cache of the same rows and capacity takes it: its
first forward already replays. A forward that asks for the outputs of some decoder layers (a trained head reads
them: EAGLE-3, DFlash) has a graph of its own per set of layers, the layers among its outputs. What is not graphed
runs the direct forward as before: sparse attention rules, models without the direct forward, exact mode off.

`mode="replay"` runs the same static-buffer path without capturing (the body is called again at each replay), so the
CPU tests check everything but the capture itself; `mode="cuda"` captures. `load(graphs=None)` turns CUDA graphs on
where exact mode is on CUDA; `model.graphs = None` turns them off after loading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import attention
from ..cache.kv import free_retired_graphs
from ..cache.pool import StoragePool
from ..errors import ParameterError
from .canvas_graphs import Mode, canvas_graphs_mode


@dataclass
class _Entry:
    """One captured forward: its static inputs and outputs, and how to run it again."""

    meta: torch.Tensor  # [B, 2] long: each row's first new column, the block's length T
    ids: torch.Tensor  # [B, W] long (the first T are the block's)
    positions: torch.Tensor  # [B, W] long (the first T are the block's)
    real: torch.Tensor  # [B, W] bool
    visible: torch.Tensor  # [B, W, W] bool
    past: torch.Tensor  # [B, W, K] bool: all True when the block has no `past`
    plain: bool = True  # `real` and `visible` hold a plain causal block of real tokens
    past_all: bool = True  # `past` is all True
    # (logits [B, W, V] float32, hidden [B, W, H], the outputs of the layers asked for, each [B, W, H])
    outputs: tuple[torch.Tensor, ...] | None = None
    graph: Any = None  # torch.cuda.CUDAGraph (mode "cuda")
    body: Callable[[Any], tuple[torch.Tensor, ...]] | None = None  # mode "replay": run(cache)

    @staticmethod
    def empty(B: int, W: int, K: int, device: torch.device) -> _Entry:
        causal = torch.ones(W, W, dtype=torch.bool, device=device).tril()
        return _Entry(meta=torch.ones(B, 2, dtype=torch.long, device=device),
                      ids=torch.zeros(B, W, dtype=torch.long, device=device),
                      positions=torch.zeros(B, W, dtype=torch.long, device=device),
                      real=torch.ones(B, W, dtype=torch.bool, device=device),
                      visible=causal[None].expand(B, W, W).clone(),
                      past=torch.ones(B, W, K, dtype=torch.bool, device=device))


Block = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # (real [B, T], visible [B, T, T], past [B, T, C])


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
        # the storage and graphs of this model's dead caches, for its next caches of the same key (cache/pool.py)
        self.pool = StoragePool()

    def run(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any, block: Block | None, width: int,
            pad_id: int, hidden: bool, picked: tuple[int, ...] = ()
            ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]] | None:
        """One exact-mode forward of `ids` `[B, T]` (T <= `width`) after `cache`'s rows, padded to `width` inside the
        graph: the float32 logits `[B, T, V]`, (if `hidden`) the last hidden states `[B, T, H]` and the outputs of
        the decoder layers `picked` `[B, T, H]` each (a trained head reads them: EAGLE-3, DFlash). `block` None
        is a plain causal block of real tokens seeing every stored column, else `(real, visible, past)` as
        `KVCache.begin` takes them. The cache holds `width` new columns per row afterwards (the caller crops the
        padding). None, with the cache untouched, where the storage is not allocated yet: the caller runs the
        eager forward (which allocates it), and the next call captures."""
        free_retired_graphs()
        B, T = ids.shape
        if not cache.ready_for(width):
            self.stats["eager"] += 1
            return None
        base = cache.advance(B, width)
        K = cache.key_width
        key = (B, width, K, picked, *self.settings())
        entry = cache.graphs.get(key)  # (a cache that moved its storage has retired its graphs: `KVCache.moved`)
        try:
            fresh = entry is None
            if entry is None:
                entry = _Entry.empty(B, width, K, ids.device)
            self._load(entry, ids, positions, base, block)
            if fresh:
                self._capture(entry, cache, key, pad_id, picked)
            else:
                self._replay(entry, cache)
        except BaseException:
            cache.crop_rows(base)
            raise
        finally:
            cache.end()
        assert entry.outputs is not None
        logits, states, *layers = entry.outputs
        return (logits[:, :T].clone(), states[:, :T].clone() if hidden else None,
                tuple(t[:, :T].clone() for t in layers))

    def settings(self) -> tuple[bool, bool]:
        """What a graph's key records beside its shapes: a graph records the kernels of the settings it was captured
        under (fused kernels, grouped attention), so a bundle reused after a setting changed captures anew rather
        than replay the other setting's kernels."""
        return bool(getattr(self.native, "fused", False)), attention.grouped_attention_on()

    @staticmethod
    def _load(entry: _Entry, ids: torch.Tensor, positions: torch.Tensor, base: list[int], block: Block | None) -> None:
        """Copy one block into the entry's static buffers; a plain block after a plain one copies ids, positions
        and `meta` only. Copies from the host do not wait for the device (`non_blocking`: CUDA takes a pageable
        source in before it returns, and the replay follows them on the same stream), so a step's one
        synchronisation is its driver's read of the result."""
        T = ids.shape[1]
        entry.meta.copy_(torch.tensor([[n, T] for n in base], dtype=torch.long), non_blocking=True)
        if T == entry.ids.shape[1]:
            entry.ids.copy_(ids, non_blocking=True)
            entry.positions.copy_(positions, non_blocking=True)
        else:
            entry.ids[:, :T].copy_(ids, non_blocking=True)
            entry.positions[:, :T].copy_(positions, non_blocking=True)
        if block is None:
            if not entry.plain:
                entry.real.fill_(True)
                entry.visible.copy_(torch.ones_like(entry.visible[0]).tril())
                entry.plain = True
            if not entry.past_all:
                entry.past.fill_(True)
                entry.past_all = True
            return
        real, visible, past = block
        entry.real[:, :T].copy_(real, non_blocking=True)
        entry.visible[:, :T, :T].copy_(visible, non_blocking=True)
        entry.plain = False
        if past is not None or not entry.past_all:
            entry.past.fill_(True)
        if past is not None:
            entry.past[:, :T, : past.shape[-1]].copy_(past, non_blocking=True)
        entry.past_all = past is None

    def _body(self, entry: _Entry, K: int, pad_id: int, picked: tuple[int, ...]
              ) -> Callable[[Any], tuple[torch.Tensor, ...]]:
        """One forward over the entry's static buffers: the block padded to W, its attention plan and cache columns
        (`KVCache.place`), the forward. The cache is an argument, not a closure variable: the cache holds its
        entries, which must not hold it back."""
        native = self.native

        def run(cache: Any) -> tuple[torch.Tensor, ...]:
            logits, hidden, layers = static_forward(native, cache, entry.meta, entry.ids, entry.positions, entry.real,
                                                    entry.visible, entry.past, K, pad_id, picked)
            return logits, hidden, *layers
        return run

    def _capture(self, entry: _Entry, cache: Any, key: tuple[Any, ...], pad_id: int, picked: tuple[int, ...]) -> None:
        body = self._body(entry, key[2], pad_id, picked)
        if self.mode == "replay":
            entry.body = body
            entry.outputs = body(cache)
        else:
            entry.graph, entry.outputs = capture(body, cache, entry.ids.device)
        self.stats["captures"] += 1
        cache.add_graph(key, entry)  # (its storage bundle records the tensors the graph reads: cache/pool.py)

    def _replay(self, entry: _Entry, cache: Any) -> None:
        if entry.graph is not None:
            entry.graph.replay()
        else:
            assert entry.body is not None
            entry.outputs = entry.body(cache)
        self.stats["replays"] += 1


def capture(body: Callable[[Any], Any], cache: Any, device: torch.device) -> tuple[Any, Any]:
    """A CUDA graph of `body(cache)` (device operations only) and its outputs, run once: a warm-up on a side stream
    first (lazy initialisations such as cuBLAS workspaces must not be captured; it writes the same keys and values to
    the same columns as the replay after the capture), then the capture, then a replay (a capture records the kernels
    without running them)."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        body(cache)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = body(cache)
    graph.replay()
    return graph, outputs


def static_forward(native: Any, cache: Any, meta: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                   real: torch.Tensor, visible: torch.Tensor, past: torch.Tensor, K: int, pad_id: int,
                   picked: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """One exact-mode forward from static buffers, device operations only (what a graph captures): `ids` and
    `positions` `[B, W]` whose first `meta[:, 1]` columns are the block (the rest padding, made here: the pad token at
    the block's last position, seen by nobody), `meta[:, 0]` each row's first new cache column, `real` `[B, W]`,
    `visible` `[B, W, W]` and `past` `[B, W, K]` as `KVCache.begin` takes them (only the block's part is read). After
    the host's `cache.advance`; returns the float32 logits `[B, W, V]`, the last hidden states `[B, W, H]` and the
    outputs of the layers `picked`."""
    W = ids.shape[1]
    n = meta[:, 1:]  # [B, 1] the block's length
    inside = torch.arange(W, device=n.device)[None] < n  # [B, W] the block, not its padding
    ids = torch.where(inside, ids, pad_id)  # [B, W]
    positions = torch.where(inside, positions, positions.gather(1, n - 1))  # [B, W]
    real = real & inside
    visible = visible & inside[:, :, None] & inside[:, None, :]  # [B, W, W]
    allow, cols = cache.place(meta[:, 0], positions, visible, real, past)
    plan = attention.Plan(allow=allow, q_pos=positions, k_pos=cache.positions[:, :K])
    with cache.scattered(cols):
        logits, hidden, layers = native(ids, positions, cache, plan, None, picked or None)
    return logits.float(), hidden, layers


# the methods that replay a captured graph (one launch on a GPU), by class: `host_ops.HostOps` counts nothing inside
# them; a graph of more than a forward registers its own (`speculative/step_graph.StepGraph`)
REPLAYS: list[tuple[type, str]] = [(Graphs, "_replay")]


def graphs_mode(value: bool | str | None, device: torch.device, exact: object) -> Mode | None:
    """What `load(graphs=...)` means: None turns CUDA graphs on where they apply (exact mode on a CUDA device), False
    off, True or "cuda" on (a CUDA device and exact mode needed), "replay" the capture-free path (any device, for
    tests)."""
    if value is None:
        return "cuda" if device.type == "cuda" and exact is not None else None
    mode = canvas_graphs_mode(value, device)  # (the same values; a diffusion model needs no exact mode)
    if mode == "cuda" and exact is None:
        raise ParameterError("CUDA graphs need exact mode's fixed shapes: load with exact=True (or exact=None in "
                             "bfloat16/float16 on CUDA).")
    if mode == "replay" and exact is None:
        raise ParameterError("graphs='replay' runs exact mode's fixed shapes: load with exact=True too.")
    return mode
