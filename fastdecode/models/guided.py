"""An image model's adapter: class-label prompts, code-only logits and classifier-free guidance below every driver.

`ImageLM` is a `CausalLM` whose `.image` says its token layout (`models/image.py`). Its forward returns logits in
which only codebook codes can be picked (class and null ids masked at every position), so every driver writes
codes only. With a guidance scale s != 1 (`with_scale`), every row of a batch is run twice in one forward, once
with its class token and once with the null class, and the forward returns `u + s * (c - u)`: the guided logits.
The cache it makes holds both rows per batch row (`GuidedCache`, a view of a cache of 2B rows), so rollback,
joining and leaving move both. Every driver (ar.*, spec.*, the image family's own) thus sees one distribution, the
guided one; a lossless method stays lossless with respect to it, since the target and its verification read the
same forward.
"""

from __future__ import annotations

import copy
import math
from typing import Any, cast

import torch

from ..attention import Plan
from ..cache import DynamicKVCache, KVCache
from ..cache.base import CacheBase
from ..errors import ParameterError, PromptError
from ..types import PromptBatch
from .causal import CausalLM, CausalOutput
from .image import ImageSpec


def _pair(cond: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
    """Interleave two `[B, ...]` tensors into `[2B, ...]`: row 2b is cond row b, row 2b + 1 its uncond twin."""
    return torch.stack([cond, uncond], dim=1).reshape(2 * cond.shape[0], *cond.shape[1:])


def _twice(x: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    """A per-row tensor `[B, ...]` repeated for both rows of each pair (a shared `[1, ...]` one as it is)."""
    if x is None or x.shape[0] != batch:
        return x
    return x.repeat_interleave(2, dim=0)


class GuidedCache(CacheBase):
    """The cache of a guided forward: row b of the batch is rows 2b (conditional) and 2b + 1 (unconditional) of
    `inner`. Drivers see B rows; every rollback, resize and adoption moves both rows of a pair."""

    def __init__(self, inner: KVCache | DynamicKVCache) -> None:
        self.inner = inner

    @property
    def lengths(self) -> list[int]:
        return list(self.inner.lengths[::2])

    def can_rollback(self) -> bool:
        return self.inner.can_rollback()

    def ragged(self) -> bool:
        return self.inner.ragged()

    def plans_attention(self) -> bool:
        return self.inner.plans_attention()

    def crop_rows(self, lengths: list[int]) -> None:
        self.inner.crop_rows([n for n in lengths for _ in range(2)])

    def begin(self, positions: torch.Tensor, visible: torch.Tensor, real: torch.Tensor,
              past: torch.Tensor | None = None) -> Plan:
        raise TypeError("a guided cache is placed by its image model's forward (ImageLM), which runs both rows of "
                        "each pair; pass it to that model's forward only")

    def resize(self, batch: int) -> None:
        self.inner.resize(2 * batch)

    def adopt(self, slot: int, other: CacheBase, row: int) -> None:
        if not isinstance(other, GuidedCache):
            raise TypeError(f"a guided cache adopts rows of another guided cache, not {type(other).__name__}")
        self.inner.adopt(2 * slot, other.inner, 2 * row)
        self.inner.adopt(2 * slot + 1, other.inner, 2 * row + 1)


class ImageLM(CausalLM):
    """A class-conditional image model: prompt = class label, output = `image.tokens` codes, optional guidance."""

    def __init__(self, *args: Any, image: ImageSpec, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.image: ImageSpec = image
        self.scale = 1.0  # classifier-free guidance of this adapter's forward (1 = off): `with_scale`
        if self.vocab_size < image.vocab_size:
            raise ValueError(f"the model has {self.vocab_size} token ids, fewer than its image layout needs "
                             f"({image.K} codes + {image.C} classes + null = {image.vocab_size})")
        self._noncode = torch.arange(self.vocab_size) >= image.K  # [V] ids never generated

    def with_scale(self, scale: float) -> ImageLM:
        """The same model (same module, no copy of weights) whose forward guides at `scale`."""
        if scale == self.scale:
            return self
        guided = copy.copy(self)
        guided.scale = float(scale)
        return guided

    # -- text <-> tokens ----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return [self.image.label_token(text)]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset()  # an image is exactly image.tokens codes: no end token

    @property
    def pad_token_id(self) -> int:
        return self.image.null_token

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image": self.image.config()}

    # -- the forward --------------------------------------------------------------------------------------------
    def new_cache(self, batch: int = 1, capacity: int = 0) -> KVCache | DynamicKVCache:
        if self.scale == 1.0:
            return super().new_cache(batch, capacity)
        # drivers ask only the CacheBase contract of a cache (docs/architecture.md), which the pair view answers
        return cast(KVCache, GuidedCache(super().new_cache(2 * batch, capacity)))

    def _forward(self, input_ids, positions, cache, attention_mask, num_logits, visible, hidden,
                 sparse) -> torch.Tensor | CausalOutput:
        if self.scale == 1.0:
            return self._codes_only(super()._forward(input_ids, positions, cache, attention_mask, num_logits,
                                                     visible, hidden, sparse))
        if cache is not None and not isinstance(cache, GuidedCache):
            raise TypeError(f"a guided image model runs on the cache it makes (model.new_cache()), not "
                            f"{type(cache).__name__}")
        B = input_ids.shape[0]
        image = self.image
        classes = (input_ids >= image.K) & (input_ids < image.null_token)
        uncond = input_ids.masked_fill(classes, image.null_token)  # [B, T]
        out = super()._forward(_pair(input_ids, uncond), _twice(positions, B), None if cache is None else cache.inner,
                               _twice(attention_mask, B), num_logits, visible if visible is None or visible.dim() == 2
                               else _twice(visible, B), hidden, sparse)
        logits = out.logits if isinstance(out, CausalOutput) else out  # [2B, T', V]
        c, u = logits[0::2], logits[1::2]
        guided = u + self.scale * (c - u)  # [B, T', V]
        if isinstance(out, CausalOutput):
            return self._codes_only(CausalOutput(guided, out.hidden[0::2], tuple(x[0::2] for x in out.layers)))
        return self._codes_only(guided)

    def _codes_only(self, out: torch.Tensor | CausalOutput) -> torch.Tensor | CausalOutput:
        """Class and null ids get -inf: only codes are ever generated."""
        logits = out.logits if isinstance(out, CausalOutput) else out
        mask = self._noncode.to(logits.device)
        masked = logits.masked_fill(mask, float("-inf"))  # [B, T', V]
        if isinstance(out, CausalOutput):
            return CausalOutput(masked, out.hidden, out.layers)
        return masked


def guide(model: Any, cfg_scale: Any) -> Any:
    """The adapter a generation runs on: an image model at `cfg_scale` (its image.json's default when None); a
    text model as it is, refusing a guidance scale other than 1."""
    image = getattr(model, "image", None)
    if image is None:
        if cfg_scale is not None and _scale(cfg_scale) != 1.0:
            name = getattr(model, "name", "this model")
            raise ParameterError(f"cfg_scale={cfg_scale!r} is classifier-free guidance, which only image models "
                                 f"have; {name!r} is a text model: leave cfg_scale out.")
        return model
    return model.with_scale(image.cfg_scale if cfg_scale is None else _scale(cfg_scale))


def _scale(value: Any) -> float:
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"cfg_scale={value!r} is not a number: pass e.g. cfg_scale=2 (1 = no guidance).") from None
    if not math.isfinite(scale) or scale < 0:
        raise ParameterError(f"cfg_scale={value!r} is invalid: it must be a number >= 0 (1 = no guidance, "
                             "0 = unconditional).")
    return scale


def image_params(model: Any, params: dict[str, Any]) -> dict[str, Any]:
    """An image model's generation writes exactly one image: max_new_tokens is `image.tokens` (refused otherwise)."""
    image = getattr(model, "image", None)
    if image is None:
        return params
    given = params.get("max_new_tokens")
    if given is not None and int(given) != image.tokens:
        raise ParameterError(f"max_new_tokens={given!r}: an image of {model.name!r} is exactly {image.tokens} tokens "
                             f"({image.h}x{image.w} codes); leave max_new_tokens out.")
    return {**params, "max_new_tokens": image.tokens}


def check_image_prompts(model: Any, batch: PromptBatch) -> None:
    """Each prompt of an image model is one class (or null) token."""
    image = getattr(model, "image", None)
    if image is None:
        return
    for b in range(batch.size):
        row = batch.row(b)
        if len(row) != 1 or not image.K <= row[0] <= image.null_token:
            raise PromptError(f"Prompt {b} of the image model {model.name!r} is {row}: a prompt is one class label "
                              f"({', '.join(image.labels)}, or 'null'), or its token id "
                              f"({image.K} to {image.null_token}).")
