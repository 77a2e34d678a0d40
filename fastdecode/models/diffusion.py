"""Adapter around a masked-diffusion LM (LLaDA, Dream, the zoo's dlm-small): logits for every canvas position."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch

from ..errors import ParameterError
from . import native as _native
from .base import ModelAdapter
from .canvas_graphs import CanvasGraphs, Mode
from .mdlm import LayerKV
from .native import check_fused

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), batch first, over the whole canvas


class DenoisingModel(Protocol):
    """What the diffusion driver calls: a `MaskedDiffusionLM`, or a wrapper around one that changes its logits
    (`diffusion.policies.baseline.Guided`)."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def mask_token_id(self) -> int: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def eos_token_ids(self) -> frozenset[int]: ...
    @property
    def supports_cache(self) -> bool: ...

    def forward(
        self, canvas: torch.Tensor, attention_mask: torch.Tensor | None = None, at: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def forward_columns(
        self, canvas: torch.Tensor, attention_mask: torch.Tensor, columns: torch.Tensor | None, kv: KV | None,
        at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KV]: ...


class MaskedDiffusionLM(ModelAdapter):
    """`forward(canvas)` returns logits aligned so that `logits[:, i]` scores the token at position i.

    Two conventions exist in the wild: LLaDA predicts position i at output i ("same"); Dream, adapted
    from an AR model, predicts position i at output i-1 ("shifted"), so the adapter realigns it.
    """

    kind = "diffusion"

    def __init__(
        self, model: torch.nn.Module, tokenizer=None, name: str = "", *, mask_token_id: int, shifted: bool,
        graphs: Mode | None = None, fused: bool | None = False,
    ) -> None:
        super().__init__(model, tokenizer, name)
        self.mask_token_id = mask_token_id
        self.shifted = shifted
        # CUDA graphs of the whole-canvas forwards (models/canvas_graphs.py); None: eager. `load(graphs=None)` turns
        # them on on CUDA; `model.graphs = None` turns them off
        self.graphs: CanvasGraphs | None = None if graphs is None else CanvasGraphs(graphs)
        # the zoo architecture's elementwise runs compiled into fused kernels (mdlm.py `fuse`); None = on with CUDA
        # graphs on a CUDA device
        fused = check_fused(fused)
        fuse = getattr(model, "fuse", None)
        if fused and fuse is None:
            raise ParameterError(f"fused=True compiles the zoo diffusion architecture's kernels, which "
                                 f"{type(model).__name__} does not run: leave fused=None or False.")
        if fuse is not None and (fused or (fused is None and _native.fused_default(self.device, graphs))):
            fuse()

    @property
    def fused(self) -> bool:
        """Whether the forward runs the fused kernels (`fuse` on the zoo architecture)."""
        return bool(getattr(self.model, "fused", False))

    @property
    def supports_cache(self) -> bool:
        """Whether the model can recompute a subset of columns against cached K/V (`forward_columns`) and run its
        output head on chosen outputs only (`logits_index`): the zoo MDLM's partial-forward protocol."""
        return bool(getattr(self.model, "supports_partial_forward", False))

    @torch.inference_mode()
    def forward(
        self,
        canvas: torch.Tensor,  # [B, L]
        attention_mask: torch.Tensor | None = None,  # [B, L], 0 = padding
        at: torch.Tensor | None = None,  # [B, W] canvas columns whose logits are wanted; None: all
    ) -> torch.Tensor:
        """Aligned logits `[B, L, V]`, or `[B, W, V]` at the columns `at` (the model's output head then runs on
        those columns only, where it can)."""
        body = partial(_canvas_logits, self.model, self.shifted, self.supports_cache)
        if self.graphs is None:
            return body(canvas, attention_mask, at)[0]
        return self._graphed("forward", body, canvas, attention_mask, at)[0]

    @torch.inference_mode()
    def forward_columns(
        self,
        canvas: torch.Tensor,  # [B, L]
        attention_mask: torch.Tensor,  # [B, L]
        columns: torch.Tensor | None,  # [B, Q] columns to recompute; None: all (and a fresh cache is returned)
        kv: KV | None,  # the cache to read the other columns from (required with columns)
        at: torch.Tensor | None = None,  # [B, W] columns whose logits are wanted; None: `columns` (all if None)
    ) -> tuple[torch.Tensor, KV]:
        """Aligned logits at `at` (`[B, W, V]`; without `at`, of `columns`, or `[B, L, V]` for all) and the cache,
        updated with the recomputed columns.

        A shifted model scores column c at output c-1, so c-1 is recomputed with c: the forward runs once over
        the union of `columns` and the outputs `at` needs, each column once (duplicates in `columns` are
        padding). Only the wanted outputs go through the output head.
        """
        if columns is None:
            body = partial(_canvas_logits_kv, self.model, self.shifted)
            if self.graphs is None:
                logits, *flat = body(canvas, attention_mask, at)
            else:
                logits, *flat = self._graphed("refresh", body, canvas, attention_mask, at)
            return logits, list(zip(flat[::2], flat[1::2], strict=True))
        at = columns if at is None else at
        assert kv is not None, "recomputing some columns needs the cache of the others"
        B, L = canvas.shape
        W = at.shape[1]
        if self.graphs is not None:  # the read columns rounded up as a whole-canvas forward rounds them
            at = _pad_columns(at, self.graphs.bucket_columns)
        out_pos = self._outputs(at)  # [B, W]
        need = torch.zeros(B, L, dtype=torch.bool, device=canvas.device)
        need.scatter_(1, columns, True).scatter_(1, out_pos, True)
        n = need.sum(-1, keepdim=True)
        Q = int(n.max())
        if self.graphs is not None:  # (more columns, each a needed one again: duplicates are padding)
            Q = min(L, _round_up(Q, self.graphs.bucket_columns))
        order = need.long().argsort(dim=-1, descending=True, stable=True)[:, :Q]  # needed columns first, in order
        query = torch.where(torch.arange(Q, device=canvas.device) < n, order, order[:, :1])  # pad with a needed one
        slot = torch.zeros(B, L, dtype=torch.long, device=canvas.device)
        slot.scatter_(1, order, torch.arange(Q, device=canvas.device).expand(B, Q))  # column -> its place in query
        inputs: dict[str, torch.Tensor | None] = {
            "ids": canvas.gather(1, query), "attention_mask": attention_mask, "query": query,
            "index": slot.gather(1, out_pos), **{f"kv{i}": t for i, t in enumerate(t for pair in kv for t in pair)}}
        cached: Callable[..., tuple[torch.Tensor, ...]] = partial(_columns_logits_kv, self.model)
        logits, *flat = cached(**inputs) if self.graphs is None else self.graphs.run("columns", cached, inputs)
        return logits[:, :W], list(zip(flat[::2], flat[1::2], strict=True))

    def _outputs(self, at: torch.Tensor) -> torch.Tensor:
        return _outputs(self.shifted, at)

    def _graphed(
        self, what: str, body: Callable[..., tuple[torch.Tensor, ...]], canvas: torch.Tensor,
        attention_mask: torch.Tensor | None, at: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        """A whole-canvas forward through the graphs, its shapes rounded up to the graphs' buckets so that canvases of
        nearby lengths (other prompts, a canvas cut at its settled end) share one graph: the canvas is padded on the
        right with columns the attention mask hides, the read columns `at` by repeating their last; the outputs are
        cut back. -> the logits, then (a refresh) each layer's keys and values `[B, KVH, L, D]`.

        The canvas is padded only for the zoo's architecture (`supports_cache`), whose mask hides keys and nothing
        else, and only where there is a mask (a forward without one takes another attention path): a checkpoint's
        own code may also hide the padded queries (Dream builds a query-by-key mask), and a query row with nothing
        to see can turn to NaN, which the next layer's values would carry into every row."""
        assert self.graphs is not None
        L, W = canvas.shape[1], None if at is None else at.shape[1]
        if attention_mask is not None and self.supports_cache:
            canvas, attention_mask = _pad_canvas(canvas, attention_mask, self.graphs.bucket, self.mask_token_id)
        if at is not None:
            at = _pad_columns(at, self.graphs.bucket_columns)
        logits, *kv = self.graphs.run(what, body, {"canvas": canvas, "attention_mask": attention_mask, "at": at})
        return (logits[:, :L] if W is None else logits[:, :W]), *(t[:, :, :L] for t in kv)

    def describe(self) -> dict:
        d = super().describe()
        logits = "shifted (Dream)" if self.shifted else "same position (LLaDA)"
        d.update(mask_token_id=self.mask_token_id, logits=logits)
        return d


def _outputs(shifted: bool, at: torch.Tensor) -> torch.Tensor:
    """The model outputs that score canvas columns `at`: the same columns, or one earlier for a shifted model
    (column 0, always prompt, takes output 0 as a placeholder)."""
    return (at - 1).clamp(min=0) if shifted else at


def _align(shifted: bool, logits: torch.Tensor) -> torch.Tensor:
    """`[B, L, V]` model outputs -> logits[:, i] scoring the token at column i."""
    if shifted:  # output i-1 predicts token i; position 0 is always prompt, so its row is a placeholder
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


# The whole-canvas forwards, as functions of the module (not of the adapter: a captured graph keeps its body, and
# the body must not keep the adapter alive)
def _canvas_logits(
    model: torch.nn.Module, shifted: bool, partial_head: bool, canvas: torch.Tensor,
    attention_mask: torch.Tensor | None, at: torch.Tensor | None,
) -> tuple[torch.Tensor]:
    """(aligned float32 logits `[B, L, V]`, or `[B, W, V]` at the columns `at`,)."""
    if at is not None and partial_head:
        out_pos = _outputs(shifted, at)
        return (model(input_ids=canvas, attention_mask=attention_mask, logits_index=out_pos).logits.float(),)
    logits = _align(shifted, model(input_ids=canvas, attention_mask=attention_mask).logits.float())
    return (logits if at is None else _gather(logits, at),)


def _canvas_logits_kv(
    model: torch.nn.Module, shifted: bool, canvas: torch.Tensor, attention_mask: torch.Tensor | None,
    at: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """(aligned float32 logits as `_canvas_logits` gives them, then each layer's keys and values)."""
    out_pos = None if at is None else _outputs(shifted, at)
    out = model(input_ids=canvas, attention_mask=attention_mask, use_cache=True, logits_index=out_pos)
    logits = out.logits.float()
    kv = [t for layer in out.cache for t in (layer.k, layer.v)]
    return (_align(shifted, logits) if at is None else logits, *kv)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_right(x: torch.Tensor, fill: torch.Tensor, multiple: int) -> torch.Tensor:
    """`[B, N]` -> `[B, N']`, N' the next multiple of `multiple`, the new columns `fill` `[B, 1]` repeated."""
    extra = _round_up(x.shape[1], multiple) - x.shape[1]
    return x if extra == 0 else torch.cat([x, fill.expand(-1, extra)], dim=1)


def _pad_columns(at: torch.Tensor, multiple: int) -> torch.Tensor:
    """Read columns `[B, W]` rounded up to a multiple of `multiple` by repeating the last (its logits are cut off)."""
    return _pad_right(at, at[:, -1:], multiple)


def _pad_canvas(
    canvas: torch.Tensor, attention_mask: torch.Tensor, multiple: int, fill: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canvas and mask `[B, L]` padded on the right to a multiple of `multiple` columns: `fill` tokens, hidden."""
    B = canvas.shape[0]
    return (_pad_right(canvas, canvas.new_full((B, 1), fill), multiple),
            _pad_right(attention_mask, attention_mask.new_zeros((B, 1)), multiple))


def _columns_logits_kv(
    model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, query: torch.Tensor,
    index: torch.Tensor, **kv: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The cached forward of the canvas columns `query` `[B, Q]` (their tokens `ids`), the others' keys and values
    from `kv` (`kv0`, `kv1`, ...: each layer's keys, then its values): (float32 logits at the outputs `index`
    `[B, W]`, then each layer's updated keys and values)."""
    flat = [kv[f"kv{i}"] for i in range(len(kv))]
    past = [LayerKV(k, v) for k, v in zip(flat[::2], flat[1::2], strict=True)]
    out = model(input_ids=ids, attention_mask=attention_mask, cache=past, query_index=query, use_cache=True,
                logits_index=index)
    return (out.logits.float(), *(t for layer in out.cache for t in (layer.k, layer.v)))


def _gather(logits: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """`[B, L, V]`, `[B, W]` -> `[B, W, V]`."""
    return logits.gather(1, cols[..., None].expand(-1, -1, logits.shape[-1]))
