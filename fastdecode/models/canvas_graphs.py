"""CUDA graphs of a masked-diffusion model's whole-canvas forwards: one captured forward per input shape.

A diffusion step runs the model over the whole canvas, `[B, L]`, and the canvas keeps its shape from step to step
of a generation (the rows, the prompt plus the generated region, the block whose logits are read). On a GPU a small
model's step is launch-bound: zoo:dlm-small's forward is 1318 torch operations a step in float32 and 1426 in
bfloat16 (the casts around its float32 norms and rotary tables, which float32 skips; `tools/diffusion_host_ops.py
--dtype`), which is how the H200 came to run it slower in bfloat16 than in float32 (docs/gpu.md). A CUDA graph
replays all of them with one launch, in either dtype.

Unlike the causal graphs (models/graphs.py), nothing here depends on a cache's addresses: the forward reads its
inputs (token ids, attention mask, the columns whose logits are wanted) and the weights, and writes its outputs. So
a graph is keyed by its inputs' shapes and dtypes alone, and each replay copies the inputs into the graph's static
buffers and clones the outputs (the next replay overwrites them; a caller may keep the logits of an earlier step).

The adapter (`MaskedDiffusionLM._graphed`) rounds the shapes up first: a canvas with an attention mask is padded on
the right to a multiple of 16 columns that the mask hides, and the columns whose logits are read to a multiple of 8
(the last one repeated); the outputs are cut back. So prompts of nearby lengths, and a canvas cut at its settled
end, share a graph, and a generation of a few steps (a confident model's) replays one captured by an earlier
generation. A shape seen for the first time runs eagerly; the second time it is captured (a warm-up run on a side
stream, then the capture) and every later time replayed, so a shape seen once is never captured. A model keeps at
most `limit` graphs (8; the least recently used go first), all in one memory pool: the outputs of each stay
allocated while it lives, and only one graph runs at a time. A capture that fails (a model
whose code reads a tensor on the host, which a capture forbids) turns the graphs off for that model with a
`FastDecodeWarning`; its forwards run eagerly from then on, with the same results.

What is graphed: `MaskedDiffusionLM.forward`, the full forward of `forward_columns` (a cache refresh, whose keys
and values are outputs too) and its cached forward of some columns (the others' keys and values are static inputs,
copied in like the canvas; the columns recomputed are rounded up to a multiple of 8 by repeating a needed one).
`mode="replay"` runs the same static-buffer path without capturing, so the CPU tests check everything but the
capture itself.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ..cache.pool import _RETIRED, free_retired_graphs
from ..errors import FastDecodeWarning, ParameterError

Mode = Literal["cuda", "replay"]
Inputs = dict[str, torch.Tensor | None]
Body = Callable[..., tuple[torch.Tensor, ...]]
Key = tuple[Any, ...]

LIMIT = 8  # graphs kept per model
BUCKET = 16  # canvas lengths are rounded up to a multiple of this (masked padding columns)
BUCKET_COLUMNS = 8  # and the read columns' count to a multiple of this
SEEN = 256  # shapes remembered as seen once; past that the record starts afresh


@dataclass
class _Entry:
    """One captured forward: its static inputs and outputs, and how to run it again."""

    inputs: Inputs  # static copies, same shapes and dtypes as the key says
    body: Body  # the forward over `inputs` (called again at each replay in mode "replay")
    outputs: tuple[torch.Tensor, ...] = ()
    graph: Any = None  # torch.cuda.CUDAGraph (mode "cuda")

    def load(self, inputs: Inputs) -> None:
        for name, value in inputs.items():
            static = self.inputs[name]
            if value is not None and static is not None:
                static.copy_(value)


@dataclass
class CanvasGraphs:
    """The captured forwards of one diffusion model (see the module docstring). `stats` counts eager forwards,
    captures and replays, for tests and reports."""

    mode: Mode = "cuda"
    limit: int = LIMIT
    bucket: int = BUCKET  # the adapter pads a masked canvas to a multiple of this many columns (1: never)
    bucket_columns: int = BUCKET_COLUMNS  # and the columns whose logits are read to a multiple of this many
    stats: dict[str, int] = field(default_factory=lambda: {"eager": 0, "captures": 0, "replays": 0})
    entries: OrderedDict[Key, _Entry] = field(default_factory=OrderedDict)
    seen: set[Key] = field(default_factory=set)
    failed: str | None = None  # why a capture failed; the graphs are off from then on
    _pool: Any = None  # the memory pool the graphs share (mode "cuda")

    def __post_init__(self) -> None:
        if self.mode not in ("cuda", "replay"):
            raise ParameterError(f"graphs mode {self.mode!r}: 'cuda' (capture CUDA graphs) or 'replay' (the same "
                                 "static buffers without capturing, for the CPU)")

    def run(self, what: str, body: Body, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        """`body(**inputs)`, replayed from a graph where one was captured for these shapes, else eagerly (and
        captured the second time the shapes come). `what` names the forward (two forwards of the same inputs
        may return different outputs). The outputs never alias a graph's buffers."""
        free_retired_graphs()
        key = (what, *(_signature(name, value) for name, value in inputs.items()))
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            entry.load(inputs)
            self._replay(entry)
            return tuple(t.clone() for t in entry.outputs)
        if self.failed is not None or key not in self.seen:
            if len(self.seen) >= SEEN:
                self.seen.clear()
            self.seen.add(key)
            self.stats["eager"] += 1
            return body(**inputs)
        entry = _Entry({name: None if v is None else v.clone() for name, v in inputs.items()}, body)
        if not self._capture(entry):
            self.stats["eager"] += 1
            return body(**inputs)
        self.entries[key] = entry
        while len(self.entries) > self.limit:
            _, old = self.entries.popitem(last=False)
            _RETIRED.append(old)  # destroyed at the next run, never while a capture is under way
        return tuple(t.clone() for t in entry.outputs)

    def clear(self) -> None:
        """Drop every graph (their memory is freed at the next run) and the record of shapes seen."""
        _RETIRED.extend(self.entries.values())
        self.entries.clear()
        self.seen.clear()

    def _capture(self, entry: _Entry) -> bool:
        """Capture `entry` and run it once; False (with a warning, the graphs off) where the model cannot be
        captured."""
        if self.mode == "replay":
            entry.outputs = entry.body(**entry.inputs)
            self.stats["captures"] += 1
            return True
        device = next(t for t in entry.inputs.values() if t is not None).device
        try:
            # warm up on a side stream: lazy initialisations (cuBLAS workspaces, kernel selection) must not be captured
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                entry.body(**entry.inputs)
            torch.cuda.current_stream(device).wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                entry.outputs = entry.body(**entry.inputs)
        except Exception as e:  # e.g. "operation not permitted when stream is capturing": a host read (the same
            # shapes ran eagerly before, so what fails here is the capture)
            self.failed = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.clear()
            warnings.warn(f"CUDA graphs of the diffusion forward are off for this model: its forward could not be "
                          f"captured ({self.failed}); it runs eagerly, with the same results", FastDecodeWarning,
                          stacklevel=4)
            return False
        entry.graph = graph
        graph.replay()  # the capture recorded the kernels without running them
        self.stats["captures"] += 1
        return True

    def _replay(self, entry: _Entry) -> None:
        if entry.graph is not None:
            entry.graph.replay()
        else:
            entry.outputs = entry.body(**entry.inputs)
        self.stats["replays"] += 1


def _signature(name: str, value: torch.Tensor | None) -> tuple[Any, ...]:
    return (name, None) if value is None else (name, tuple(value.shape), value.dtype, str(value.device))


def canvas_graphs_mode(value: bool | str | None, device: torch.device) -> Mode | None:
    """What `load(graphs=...)` means for a diffusion model: None turns CUDA graphs on on a CUDA device (any dtype:
    the canvas forward has one shape per generation without exact mode), False off, True or "cuda" on (a CUDA
    device needed), "replay" the capture-free path (any device, for tests)."""
    if value is None:
        return "cuda" if device.type == "cuda" else None
    if value is False:
        return None
    if value is True or value == "cuda":
        if device.type != "cuda":
            raise ParameterError(f"graphs=True captures CUDA graphs, but the model is on {device}: load it on a CUDA "
                                 "device, or leave graphs=None (on where they apply).")
        return "cuda"
    if value == "replay":
        return "replay"
    raise ParameterError(f"graphs={value!r}: pass None (on where they apply), True, False or 'replay'.")
