"""Adapter around any `transformers` causal LM: explicit positions, a preallocated KV cache, one attention path."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from transformers import DynamicCache

from .. import attention
from ..cache import DynamicKVCache, KVCache
from ..errors import ParameterError
from . import native as _native
from .base import ModelAdapter
from .capabilities import check_sparse_attention, layer_types
from .exact import Exact, chunk_past, pad_block
from .graphs import Graphs, Mode
from .hidden import captured, collect, layer_list, wanted
from .native import check_fused, native_forward

# layer types the preallocated cache serves (a sliding window is applied by the attention plan, keys are kept)
_PREALLOCATED_LAYERS = {"full_attention", "sliding_attention"}


@dataclass(frozen=True)
class CausalOutput:
    """What `CausalLM.forward(..., hidden=True)` returns: the logits and the features the LM head read.

    `hidden` is transformers' `hidden_states[-1]`, which for language models is tied to `last_hidden_state`: the
    last decoder layer's output *after* the model's final norm (Llama's `model.norm`, GPT-2's `ln_f`), so that
    `lm_head(hidden)` gives the logits (before any logit scaling or soft-capping the architecture applies). It
    covers every input position, also where `num_logits` kept fewer logits, in the model's dtype.

    `layers` holds, for `hidden=(i, ...)`, the output of each decoder layer asked, in the order asked (see
    `models/hidden.py`): before the final norm, every input position, in the model's dtype; empty for `hidden=True`.
    """

    logits: torch.Tensor  # [B, T', V] float32, T' = num_logits or T
    hidden: torch.Tensor  # [B, T, H] in the model's dtype
    layers: tuple[torch.Tensor, ...] = ()  # one [B, T, H] per layer index asked


# the forward argument that takes the cache, newest name first: transformers 5.24 renamed `past_key_values` to `cache`
# (the old name warns); before that, the state-space models (Mamba, Mamba2) took theirs as `cache_params`, and a
# cache passed under another name went into their **kwargs unread: every forward then started from an empty state
CACHE_ARGUMENTS = ("cache", "past_key_values", "cache_params")


def cache_argument(params: Mapping[str, Any]) -> str:
    """The name under which a model's forward (its signature's `params`) takes the cache."""
    return next((name for name in CACHE_ARGUMENTS if name in params), "past_key_values")


class CausalLM(ModelAdapter):
    kind = "causal"

    def __init__(self, *args, native: bool = True, exact: Exact | None = None, graphs: Mode | None = None,
                 fused: bool | None = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        params = inspect.signature(self.model.forward).parameters
        self._has_logits_to_keep = "logits_to_keep" in params
        self._cache_arg = cache_argument(params)
        types = layer_types(self.model)
        # fastdecode's attention function and preallocated cache serve models whose attention goes through
        # transformers' attention interface and whose layers all hold keys and values; others keep transformers'
        # own cache and 2-D / 4-D masks (`DynamicKVCache`)
        self.layer_types = types
        self.preallocated = bool(
            getattr(type(self.model), "_supports_attention_backend", False)
            and types
            and set(types) <= _PREALLOCATED_LAYERS
        )
        # the direct forward (models/native.py) for Llama-shaped decoders: the same operations on the same weights
        # without transformers' module plumbing; `native=False` keeps transformers' forward
        self.native = native_forward(self.model) if native and self.preallocated else None
        # exact mode (models/exact.py): every cached forward at one width over the whole storage; None = off
        self.exact: Exact | None = exact if self.preallocated else None
        # CUDA graphs of the direct forward in exact mode (models/graphs.py); None = every forward eager
        self.graphs: Graphs | None = (Graphs(self.native, graphs) if graphs and self.native is not None
                                      and self.exact is not None else None)
        # the direct forward's elementwise runs compiled into fused kernels (models/native.py `fuse`); None = on with
        # CUDA graphs on a CUDA device
        fused = check_fused(fused)
        if fused and self.native is None:
            raise ParameterError(f"fused=True compiles the direct forward's kernels, which {type(self.model).__name__} "
                                 "does not run (Llama-shaped decoders only): leave fused=None or False.")
        if fused or (fused is None and self.native is not None
                     and _native.fused_default(self.device, self.graphs.mode if self.graphs else None)):
            assert self.native is not None
            self.native.fuse()

    @property
    def fused(self) -> bool:
        """Whether the direct forward runs the fused kernels (`NativeForward.fuse`)."""
        return self.native is not None and self.native.fused

    def new_cache(self, batch: int = 1, capacity: int = 0) -> KVCache | DynamicKVCache:
        """A cache for `batch` rows; `capacity` columns are allocated at once (more are added in chunks)."""
        if self.preallocated and self.exact is not None:
            # with CUDA graphs, a dead cache's storage and graphs serve the next cache of its rows and capacity
            return KVCache(self.layer_types, batch=batch, capacity=self.exact.capacity(capacity), device=self.device,
                           chunk=self.exact.block, full_width=True,
                           pool=self.graphs.pool if self.graphs is not None else None)
        if self.preallocated:
            return KVCache(self.layer_types, batch=batch, capacity=capacity, device=self.device)
        return DynamicKVCache(DynamicCache(config=self.config))

    @contextlib.contextmanager
    def _attention(self) -> Iterator[None]:
        """Route this model's attention through fastdecode's function for one forward, then restore it (so that
        transformers' own `generate()` on the same module keeps its own masks)."""
        name = attention.register()
        before = self.config._attn_implementation
        self.config._attn_implementation = name
        try:
            yield
        finally:
            self.config._attn_implementation = before

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | DynamicKVCache | None = None,
                attention_mask: torch.Tensor | None = None, num_logits: int | None = None,
                visible: torch.Tensor | None = None, hidden: Literal[False] = False,
                sparse: attention.SparseSelector | None = None) -> torch.Tensor: ...

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | DynamicKVCache | None = None,
                attention_mask: torch.Tensor | None = None, num_logits: int | None = None,
                visible: torch.Tensor | None = None, *, hidden: Literal[True],
                sparse: attention.SparseSelector | None = None) -> CausalOutput: ...

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | DynamicKVCache | None = None,
                attention_mask: torch.Tensor | None = None, num_logits: int | None = None,
                visible: torch.Tensor | None = None, *, hidden: Sequence[int],
                sparse: attention.SparseSelector | None = None) -> CausalOutput: ...

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | DynamicKVCache | None = None,
                attention_mask: torch.Tensor | None = None, num_logits: int | None = None,
                visible: torch.Tensor | None = None, *, hidden: bool,
                sparse: attention.SparseSelector | None = None) -> torch.Tensor | CausalOutput: ...

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        cache: KVCache | DynamicKVCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B, cache.length + T] 0 = padding, or a 4-D mask (see below)
        num_logits: int | None = None,  # keep logits of only the last num_logits positions
        visible: torch.Tensor | None = None,  # [T, T] or [B, T, T] bool: new token i may see new token j
        hidden: bool | Sequence[int] = False,  # also return the last hidden states (and these layers' outputs)
        # a sparse attention rule (an `attention=` value's selector): which cached columns each layer reads
        sparse: attention.SparseSelector | None = None,
    ) -> torch.Tensor | CausalOutput:
        """Run the model over `input_ids` appended after `cache`; returns float32 logits `[B, T', V]`, or with
        `hidden=True` a `CausalOutput` holding them and the last hidden states `[B, T, H]`; with layer indices
        `hidden=(i, ...)` also the outputs `[B, T, H]` of those decoder layers (0-based, negative from the end, before
        the final norm) for every position, also where `num_logits` keeps fewer logits. Nothing is kept when False.

        The new tokens see every real token stored before them, and each other as `visible` says (default: causal).
        A 4-D `attention_mask` `[B|1, 1, T, C + T]` (additive or bool) is read for its last T columns as `visible`.
        """
        return self._forward(input_ids, positions, cache, attention_mask, num_logits, visible, hidden, sparse)

    def _forward(self, input_ids, positions, cache, attention_mask, num_logits, visible, hidden,
                 sparse) -> torch.Tensor | CausalOutput:
        """`forward`'s work, which an adapter that changes the logits (`models/guided.ImageLM`) wraps."""
        kwargs = {}
        if num_logits is not None and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = num_logits
        picked = None if isinstance(hidden, bool) else wanted(hidden, len(layer_list(self.model)))
        asked = picked is not None or bool(hidden)
        if asked:
            kwargs["output_hidden_states"] = True
        if self.preallocated and self.exact is not None and cache is not None:
            kwargs.pop("logits_to_keep", None)  # every position's logits: the LM head's shape is fixed too
            logits, states, layers = self._exact(input_ids, positions, cache, attention_mask, visible, kwargs,
                                                 sparse, picked)
        elif self.preallocated:
            logits, states, layers = self._planned(input_ids, positions, cache, attention_mask, visible, kwargs,
                                                   num_logits, sparse, picked)
        else:
            if sparse is not None:
                check_sparse_attention(self)
            out, layers = self._legacy(input_ids, positions, cache, attention_mask, visible, kwargs, picked)
            logits, states = out.logits, out.hidden_states[-1] if asked else None
        if num_logits is not None:
            logits = logits[:, -num_logits:]
        if logits.dtype != torch.float32:  # (exact mode's graphs return float32 logits: no operation then)
            logits = logits.float()
        if asked:
            return CausalOutput(logits, states, layers)
        return logits

    def _exact(self, input_ids, positions, cache, attention_mask, visible, kwargs, sparse, picked):
        """The forward in exact mode: chunks of `exact.width` tokens from the block's start, the last padded to the
        width and its padding dropped from the cache; outputs cover the block's own tokens only. With CUDA graphs a
        chunk runs captured (`Graphs.run`, which pads it inside the graph); a plain causal block of real tokens (no
        mask, no `visible`: a decode step) then builds no mask tensor on the host at all."""
        assert self.exact is not None
        B, T = input_ids.shape
        W = self.exact.width
        graphed = self.graphs is not None and sparse is None and cache.graphable()
        want_hidden = "output_hidden_states" in kwargs
        plain = attention_mask is None and visible is None
        block = None if graphed and plain else _new_block(attention_mask, visible, B, T, input_ids.device)
        lengths = list(cache.lengths)
        parts: list[tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]] = []
        try:
            for start in range(0, T, W):
                end = min(start + W, T)
                n = end - start
                out = None
                if graphed:
                    assert self.graphs is not None
                    chunk = None if block is None else (
                        block[0][:, start:end], block[1][:, start:end, start:end],
                        chunk_past(lengths, start, end, block[1], block[2]))
                    one = T <= W  # (a whole block needs no slice: a decode step runs no view either)
                    out = self.graphs.run(input_ids if one else input_ids[:, start:end],
                                          positions if one else positions[:, start:end], cache, chunk, W,
                                          self.pad_token_id, want_hidden, tuple(picked or ()))
                if out is not None:
                    logits, states, layers = out
                else:
                    if block is None:
                        block = _new_block(attention_mask, visible, B, T, input_ids.device)
                    real, vis, past = block
                    seen = chunk_past(lengths, start, end, vis, past)
                    ids, pos, rl, vs, ps = pad_block(self.exact, input_ids[:, start:end], positions[:, start:end],
                                                     real[:, start:end], vis[:, start:end, start:end], seen,
                                                     self.pad_token_id)
                    logits, states, layers = self._planned(ids, pos, cache, None, None, kwargs, None, sparse, picked,
                                                           block=(rl, vs, ps))
                    states = states if want_hidden else None  # (as the graphed chunks: chunks concatenate)
                    if n < W:
                        logits, states = logits[:, :n], None if states is None else states[:, :n]
                        layers = tuple(x[:, :n] for x in layers)
                if n < W:
                    cache.crop_rows([length - (W - n) for length in cache.lengths])
                parts.append((logits, states, layers))
        except BaseException:
            cache.crop_rows(lengths)  # the chunks written before the failure go too
            raise
        if len(parts) == 1:
            return parts[0]
        logits = torch.cat([p[0] for p in parts], dim=1)
        states = None if parts[0][1] is None else torch.cat([p[1] for p in parts], dim=1)
        layers = tuple(torch.cat([p[2][i] for p in parts], dim=1) for i in range(len(parts[0][2])))
        return logits, states, layers

    def _planned(self, input_ids, positions, cache, attention_mask, visible, kwargs, num_logits, sparse=None,
                 picked=None, block=None):
        B, T = input_ids.shape
        # block: (real, visible, past) already read from the mask arguments (exact mode pads them)
        real, vis, past = block if block is not None else _new_block(attention_mask, visible, B, T, input_ids.device)
        if cache is None:
            if sparse is not None:
                raise ValueError("sparse attention selects among cached columns: pass a cache (model.new_cache())")
            eye = torch.eye(T, dtype=torch.bool, device=input_ids.device)
            plan = attention.Plan(allow=(vis & real[:, None, :]) | eye, q_pos=positions, k_pos=positions)
        else:
            if not cache.plans_attention():
                raise TypeError(f"{self.name!r} runs on a cache that plans attention, fastdecode's KVCache "
                                f"(model.new_cache()), not {type(cache).__name__}")
            before = list(cache.lengths)
            plan = cache.begin(positions, vis, real, past)
            if sparse is not None:
                sparse.begin(cache, plan)
        try:
            if self.native is not None:
                logits, states, layers = self.native(input_ids, positions, cache, plan, num_logits, picked)
            else:
                with self._attention(), attention.planned(plan), self._capture(picked) as found:
                    out = self.model(input_ids=input_ids, position_ids=positions, attention_mask=None,
                                     use_cache=cache is not None, **{self._cache_arg: cache}, **kwargs)
                logits, states = out.logits, out.hidden_states[-1] if "output_hidden_states" in kwargs else None
                layers = collect(found, picked or (), self.name)
        except BaseException:
            if cache is not None:  # nothing half-written stays in the cache
                cache.crop_rows(before)
                cache.end()
            raise
        if cache is not None:
            cache.end()
        return logits, states, layers

    @contextlib.contextmanager
    def _capture(self, picked: tuple[int, ...] | None) -> Iterator[list[torch.Tensor | None]]:
        """Hooks recording the outputs of the layers `picked` during one transformers forward (none if None)."""
        if not picked:
            yield []
            return
        with captured(layer_list(self.model), picked) as found:
            yield found

    def _legacy(self, input_ids, positions, cache, attention_mask, visible, kwargs, picked=None):
        if visible is not None:  # a verification block: `attention_mask`, if any, flags its new tokens as real
            if attention_mask is not None and not bool(attention_mask.all()):
                raise ValueError(f"{self.name!r} runs on transformers' own cache, which cannot pad a forward's rows")
            T = input_ids.shape[1]
            causal = torch.ones(T, T, dtype=torch.bool, device=visible.device).tril()
            # plain causal: transformers' own mask (the only one ALiBi models such as Bloom take); else 4-D additive
            attention_mask = None if bool((visible.bool() == causal).all()) else _additive(
                visible, input_ids.shape[0], cache.length if cache is not None else 0, self.dtype, input_ids.device)
        with self._capture(picked) as found:
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=attention_mask,
                use_cache=cache is not None,
                **{self._cache_arg: cache.hf if cache is not None else None},
                **kwargs,
            )
        return out, collect(found, picked or (), self.name)


def _new_block(mask: torch.Tensor | None, visible: torch.Tensor | None, B: int, T: int, device: torch.device):
    """(real `[B, T]`, visible `[B, T, T]`, past `[B, T, C]` or None) of the new tokens from the adapter's mask
    arguments; a 4-D mask gives both which new tokens and which stored columns each new token sees."""
    real = torch.ones(B, T, dtype=torch.bool, device=device)
    past = None
    if mask is not None and mask.dim() == 2:
        real = mask[:, -T:].to(device=device, dtype=torch.bool)
    if visible is None and mask is not None and mask.dim() == 4:
        allow = (mask if mask.dtype == torch.bool else mask == 0)[:, 0].to(device).expand(B, T, mask.shape[-1])
        visible, past = allow[:, :, -T:], allow[:, :, :-T]
    if visible is None:
        visible = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    visible = visible.to(device=device, dtype=torch.bool)
    return real, (visible if visible.dim() == 3 else visible[None]).expand(B, T, T), past


def _additive(visible: torch.Tensor, B: int, C: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`[B, 1, T, C + T]` additive mask: every cached position visible, the new block as `visible` says."""
    visible = visible if visible.dim() == 3 else visible[None].expand(B, -1, -1)
    T = visible.shape[-1]
    allow = torch.ones(visible.shape[0], T, C + T, dtype=torch.bool, device=device)
    allow[:, :, C:] = visible.to(device)
    return torch.zeros(allow.shape, dtype=dtype, device=device).masked_fill(~allow, torch.finfo(dtype).min)[:, None]
