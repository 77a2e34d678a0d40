"""EAGLE-3's draft head (Li et al. 2025, arXiv 2503.01840; SafeAILab/EAGLE `eagle/model/cnets.py`, SpecForge's
`LlamaForCausalLMEagle3`): one Llama decoder layer that drafts from the target's own features.

- `fc` (3H_t -> H, no bias) fuses the outputs of three target decoder layers (a low, a middle and a high one) at a
  token into one feature f.
- `midlayer` is one decoder layer whose attention reads `[input_layernorm(emb(next token)); hidden_norm(f)]` (2H
  wide q/k/v input); its residual stream is f. Its output is fed back as the next draft step's f, so the layer
  autoregresses on its own features (the "training-time test" teaches it to).
- `norm` + `lm_head` give logits over a reduced draft vocabulary; `d2t[i]` is the offset from draft id i to the target
  id (target = i + d2t[i]), `t2d` marks the target ids the draft vocabulary holds (SpecForge's convention).
- The token embeddings are the target's, frozen and not stored.

The module and buffer names are SpecForge's and vLLM's (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`), so a
checkpoint in their layout maps tensor for tensor (`eagle3_io.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..config import check
from ..models.layers import RMSNorm, SwiGLU
from .base import Head, HeadConfig, Target, register_head


@dataclass(frozen=True)
class Eagle3Config(HeadConfig):
    hidden_size: int = 0  # the draft layer's width; equals the target's (it adds the target's embeddings)
    target_hidden_size: int = 0  # width of each fused target layer output
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0  # the draft layer's MLP
    vocab_size: int = 0  # the target's vocabulary
    draft_vocab_size: int = 0  # the lm_head's rows: the most frequent target tokens
    layers: tuple[int, ...] = ()  # the three target decoder layers fused, 0-based outputs (CausalLM.forward(hidden=))
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    norm_before_residual: bool = False  # vLLM's option: the residual stream is hidden_norm(f) instead of f

    def __post_init__(self) -> None:
        for name in ("hidden_size", "target_hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "draft_vocab_size"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be at least 1")
        check(len(self.layers) == 3, "layers", self.layers, "must name three target layers (low, middle, high)")
        check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
              f"must divide num_heads ({self.num_heads})")
        check(self.draft_vocab_size <= self.vocab_size, "draft_vocab_size", self.draft_vocab_size,
              f"must not exceed the target's vocabulary ({self.vocab_size})")


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers fused by default: (1, L//2, L-1) (ar-small's 6 layers give 1, 3, 5). EAGLE's own rule
    (2, L//2, L-3) collides for shallow targets; below 4 layers the low one is layer 0."""
    low = 1 if num_layers >= 4 else 0
    return low, num_layers // 2, num_layers - 1


def vocab_maps(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(d2t [V'] long, t2d [V] bool)` keeping the `draft_vocab_size` most counted target tokens (ties to the lower
    id), in increasing id order, as SpecForge's preprocessing builds them. `counts` `[V]`."""
    V = counts.numel()
    order = torch.sort(-counts.double(), stable=True).indices[:draft_vocab_size]  # most counted first
    used = torch.sort(order).values  # [V'] increasing target ids
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


class Attention(nn.Module):
    """q/k/v read the 2H-wide concatenation; grouped-query heads; rotary positions."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)


class DecoderLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)


@dataclass
class Projected:
    """One draft step's attention inputs: the residual stream and rotated q, k, v."""

    residual: torch.Tensor  # [B, T, H]
    q: torch.Tensor  # [B, heads, T, head_dim]
    k: torch.Tensor  # [B, kv_heads, T, head_dim]
    v: torch.Tensor  # [B, kv_heads, T, head_dim]


class DraftCache:
    """The draft layer's own KV cache at decode time, one row: keys and values in entry order, cropped on rollback.

    `block` 0: the storage grows by doubling, so appending an entry copies only that entry, and a forward attends
    over the entries held. `block` > 0 (a device's, speculative/drafters/eagle3.py): the storage is a multiple of
    `block` entries, zeroed when made, and every forward attends over all of it (`attended`, the entries not held
    masked): one key length from forward to forward, so a graph captured over the storage (its address and
    `version`, bumped when it is made anew) replays for every step until it grows. `room`: the least capacity it
    makes (a generation's entries, all of them: it then never grows)."""

    def __init__(self, block: int = 0) -> None:
        self.block = block
        self.room = 0
        self._k: torch.Tensor | None = None  # [1, kv_heads, capacity, head_dim]
        self._v: torch.Tensor | None = None
        self.length = 0
        self.version = 0

    @property
    def k(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[2]

    def reserve(self, n: int) -> None:
        """Room for `n` entries (the storage exists: after a first `append`)."""
        if n > self.capacity:
            assert self._k is not None and self._v is not None
            self._grow(n, self._k, self._v)

    def _grow(self, n: int, k: torch.Tensor, v: torch.Tensor) -> None:
        size = max(-(-n // self.block) * self.block, self.room) if self.block else max(64, 2 * n)
        make = torch.Tensor.new_zeros if self.block else torch.Tensor.new_empty
        grown_k = make(k, (k.shape[0], k.shape[1], size, k.shape[3]))
        grown_v = make(v, (v.shape[0], v.shape[1], size, v.shape[3]))
        if self._k is not None and self._v is not None:
            grown_k[:, :, : self.length] = self._k[:, :, : self.length]
            grown_v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = grown_k, grown_v
        self.version += 1

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add `[1, kv_heads, T, hd]` entries; returns all keys and values held."""
        n = self.length + k.shape[2]
        if self._k is None or self._v is None or n > self._k.shape[2]:
            self._grow(n, k, v)
        assert self._k is not None and self._v is not None
        self._k[:, :, self.length : n] = k
        self._v[:, :, self.length : n] = v
        self.length = n
        return self._k[:, :, :n], self._v[:, :, :n]

    def write(self, columns: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """`append` at the entries `columns` `[T]` (a tensor: a captured graph's, computed on the device), the
        lengths kept by the caller."""
        assert self._k is not None and self._v is not None
        self._k.index_copy_(2, columns, k)
        self._v.index_copy_(2, columns, v)

    def attended(self, keys: torch.Tensor, values: torch.Tensor, allow: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a forward attends over: the entries held (`keys`, `values` `[1, kv, L, hd]`, `allow` `[T, L]`), or with
        `block` the whole storage, `allow` padded with False."""
        if not self.block:
            return keys, values, allow
        pad = torch.zeros(allow.shape[0], self.capacity - allow.shape[1], dtype=torch.bool, device=allow.device)
        return *self.storage(), torch.cat([allow, pad], 1)

    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value storage `[1, kv_heads, capacity, head_dim]` (after a first `append`)."""
        assert self._k is not None and self._v is not None
        return self._k, self._v

    def crop(self, n: int) -> None:
        self.length = min(self.length, n)


@register_head("eagle3")
class Eagle3Head(Head):
    """fc over three target layers, one decoder layer with its own KV cache, a norm and a reduced-vocab lm_head."""

    config_class = Eagle3Config
    config: Eagle3Config
    d2t: torch.Tensor  # [V'] long buffer
    t2d: torch.Tensor  # [V] bool buffer
    ttt_length = 5  # training-time-test steps the objective unrolls (a training option, not saved)

    def __init__(self, config: Eagle3Config, target: Target | None = None) -> None:
        super().__init__(config, target)
        c = config
        self.fc = nn.Linear(len(c.layers) * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = DecoderLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        d2t, t2d = vocab_maps(torch.zeros(c.vocab_size), c.draft_vocab_size)  # the first V' ids until set
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self._inverse_frequencies: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def for_target(cls, model: Any, **options: Any) -> Eagle3Head:
        """A freshly initialised head shaped for `model` (a loaded `CausalLM`): options `draft_vocab_size` (1024)
        and `layers` (`default_layers`); its draft vocabulary is the first ids until `set_vocab`."""
        layers = options.get("layers")
        config = eagle3_config_for(model, int(options.get("draft_vocab_size", 1024)),
                                   tuple(layers) if layers is not None else None)
        return cls(config, Target.of(model))

    @classmethod
    def untrained(cls, model: Any, seed: int = 0) -> Eagle3Head:
        """A seeded random head for `model` (what tests decode with: lossless, it only accepts less)."""
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls.for_target(model)

    def set_vocab(self, counts: torch.Tensor) -> None:
        """Keep the `draft_vocab_size` most frequent tokens of `counts` `[V]` (token counts of the training data)."""
        d2t, t2d = vocab_maps(counts.cpu(), self.config.draft_vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    @torch.no_grad()
    def pass_high_layer(self) -> None:
        """Initialise `fc` to pass the high target layer through (plus a tenth of its random init): with
        `copy_output`, the untrained head starts as the target's own next-token head on its residual stream and only
        has to learn the one-token shift (a deviation from the authors' random init that a short CPU budget needs)."""
        if self.config.hidden_size == self.config.target_hidden_size:
            H = self.config.hidden_size
            self.fc.weight.mul_(0.1)
            self.fc.weight[:, -H:] += torch.eye(H, dtype=self.fc.weight.dtype, device=self.fc.weight.device)

    @torch.no_grad()
    def copy_output(self, model: Any) -> None:
        """`lm_head` rows := the target's output embeddings of the draft vocabulary, `norm` := its final norm (where
        the target has them in these shapes). Call after `set_vocab`."""
        out = model.model.get_output_embeddings()
        used = self.to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))
        if out is not None and out.weight.shape[1] == self.config.hidden_size:
            self.lm_head.weight.copy_(out.weight.detach()[used.to(out.weight.device)].to(self.lm_head.weight))
        weight = getattr(getattr(getattr(model.model, "model", None), "norm", None), "weight", None)
        if isinstance(weight, torch.Tensor) and weight.shape == self.norm.weight.shape:
            self.norm.weight.copy_(weight.detach().to(self.norm.weight))

    # -- the pieces every step is made of -------------------------------------------------------------------------
    def fuse(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        """The target feature f from its three layer outputs, each `[..., H_t]` -> `[..., H]`."""
        return self.fc(torch.cat([t.to(self.fc.weight.dtype) for t in layers], dim=-1))

    def project(self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor) -> Projected:
        """q, k, v of draft entries: `emb` `[B, T, H]` embeddings of the next tokens, `h` `[B, T, H]` features
        (the target's fused ones, or the layer's own previous outputs), `positions` `[B, T]` rotary positions."""
        c, layer = self.config, self.midlayer
        normed = layer.hidden_norm(h)
        x = torch.cat([layer.input_layernorm(emb.to(h.dtype)), normed], dim=-1)  # [B, T, 2H]
        B, T, _ = x.shape
        attn = layer.self_attn
        q = attn.q_proj(x).view(B, T, c.num_heads, c.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._rotary(positions, x.dtype)  # [B, 1, T, head_dim]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        return Projected(normed if c.norm_before_residual else h, q, k, v)

    def finish(self, p: Projected, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output `[B, T, H]` (before the final norm) from the attention output `[B, heads, T, hd]`."""
        B, _, T, _ = attended.shape
        layer = self.midlayer
        h = p.residual + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(B, T, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits `[..., V']` of layer outputs `[..., H]`."""
        return self.lm_head(self.norm(out))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft-vocabulary ids."""
        # (index_select: indexing by a 0-dim tensor reads its value to the host, a synchronisation on a GPU)
        return draft_ids + self.d2t.index_select(0, draft_ids.reshape(-1)).view(draft_ids.shape)

    # -- decoding: entries appended to the head's own cache --------------------------------------------------------
    def step(self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, cache: DraftCache,
             allow: torch.Tensor) -> torch.Tensor:
        """Append T entries (`emb`, `h` `[1, T, H]`, `positions` `[1, T]`) to `cache`; `allow` `[T, L + T]` bool says
        which cached entries and new ones each new entry sees. Returns the layer's outputs `[1, T, H]`."""
        p = self.project(emb, h, positions)
        k, v, allow = cache.attended(*cache.append(p.k, p.v), allow.to(p.q.device))
        return self.finish(p, _attend(p.q, k, v, allow[None, None]))

    def step_at(self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, cache: DraftCache,
                columns: torch.Tensor, allow: torch.Tensor) -> torch.Tensor:
        """`step` with the entries written at `columns` `[T]` of a `block` cache and `allow` `[T, capacity]` over its
        whole storage, all tensors where the head runs: device operations only, for a captured graph; the same
        arithmetic as `step` on such a cache."""
        p = self.project(emb, h, positions)
        cache.write(columns, p.k, p.v)
        keys, values = cache.storage()
        return self.finish(p, _attend(p.q, keys, values, allow[None, None]))

    # -- training: the unrolled steps of the training-time test ----------------------------------------------------
    def ttt_step(self, emb: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor], allow0: torch.Tensor) -> torch.Tensor:
        """One unrolled step over a whole batch `[B, T, ...]`: query row p sees the step-0 entries that `allow0`
        `[B, T, T]` allows (causal, real) and, from each later step so far (this one included), the entry of its own
        row (the diagonal), exactly the entries its decode-time twin finds in the cache. `keys`/`values` collect
        each step's; returns the layer's outputs `[B, T, H]`."""
        p = self.project(emb, h, positions)
        keys.append(p.k)
        values.append(p.v)
        if len(keys) == 1:
            return self.finish(p, _attend(p.q, p.k, p.v, allow0[:, None]))
        groups = self.config.num_heads // self.config.num_kv_heads
        k0, v0 = _expand(keys[0], groups), _expand(values[0], groups)  # [B, heads, T, hd]
        scale = 1.0 / math.sqrt(self.config.head_dim)
        first = (p.q @ k0.transpose(-1, -2)) * scale  # [B, heads, T, T]
        first = first.masked_fill(~allow0[:, None], torch.finfo(first.dtype).min)
        diag = [(p.q * _expand(k, groups)).sum(-1, keepdim=True) * scale for k in keys[1:]]  # each [B, heads, T, 1]
        weights = torch.cat([first, *diag], dim=-1).float().softmax(-1).to(p.q.dtype)
        T = first.shape[-1]
        out = weights[..., :T] @ v0
        for j, v in enumerate(values[1:]):
            out = out + weights[..., T + j : T + j + 1] * _expand(v, groups)
        return self.finish(p, out)

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self._inverse_frequencies.get(positions.device)
        if inv is None:  # float32 always, whatever dtype the head is cast to
            hd = self.config.head_dim
            inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, hd, 2, device=positions.device).float() / hd))
            self._inverse_frequencies[positions.device] = inv
        angles = positions.float()[..., None] * inv  # [B, T, hd/2]
        both = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, hd]
        return both.cos().to(dtype), both.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allow: torch.Tensor) -> torch.Tensor:
    """Attention of `q` `[B, heads, Tq, hd]` over `k`, `v` `[B, kv_heads, Tk, hd]` where `allow` (bool, broadcast to
    `[B, heads, Tq, Tk]`) is True."""
    groups = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, _expand(k, groups), _expand(v, groups), attn_mask=allow)


def target_embeddings(model: Any) -> nn.Module:
    """The target's token embedding module (a transformers model's `get_input_embeddings()`): the head's input."""
    transformers_model: Any = model.model
    return cast(nn.Module, transformers_model.get_input_embeddings())


def eagle3_config_for(model: object, draft_vocab_size: int = 1024,
                      layers: tuple[int, ...] | None = None) -> Eagle3Config:
    """The default head shape for a loaded target (`fastdecode.load(...)`): the target's width, heads, MLP size and
    rotary base; its layers `default_layers(L)` unless given; a draft vocabulary of at most `draft_vocab_size`."""
    config = model.config  # type: ignore[attr-defined]
    target = Target.of(model)
    H, L, V = target.hidden_size, target.num_layers, target.vocab_size
    heads = int(getattr(config, "num_attention_heads", 0) or 0) or max(1, H // 64)
    if H % heads:
        heads = 1
    kv = int(getattr(config, "num_key_value_heads", 0) or 0) or heads
    if heads % kv:
        kv = heads
    inter = int(getattr(config, "intermediate_size", 0) or 0) or 4 * H
    theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    eps = getattr(config, "rms_norm_eps", None) or 1e-6
    return Eagle3Config(hidden_size=H, target_hidden_size=H, num_heads=heads, num_kv_heads=kv, head_dim=H // heads,
                        intermediate_size=inter, vocab_size=V, draft_vocab_size=min(draft_vocab_size, V),
                        layers=tuple(layers) if layers is not None else default_layers(L),
                        rms_norm_eps=float(eps), rope_theta=float(theta or 10000.0))
