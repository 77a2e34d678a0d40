"""DFlash's block drafter (z-lab/dflash `dflash/model.py`; trained as in SpecForge's DFlash family): a small
non-causal transformer that fills a whole block of masked positions in one forward, conditioned on the target.

The target's features are the outputs of a few of its decoder layers, concatenated and fused by `fc` + `hidden_norm`
(RMSNorm) into one vector per context token. Every draft layer projects that fused feature with its own `k_proj` and
`v_proj` and prepends the result to its keys and values, so the block [last verified token, mask x (B - 1)] attends to
the target's view of the whole context, and bidirectionally to itself. The drafter owns no embeddings and no lm_head:
it reads the target's (frozen, shared), which is why its width is the target's hidden size.

Tensor names follow the authors' module (Qwen3-style layers with per-head `q_norm`/`k_norm`), so a checkpoint in
their layout maps onto this module by name alone (`heads/dflash_layout.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import check
from ..models.layers import RMSNorm, SwiGLU
from .base import Head, HeadConfig, Target, register_head

KV = tuple[torch.Tensor, torch.Tensor]  # one draft layer's context keys and values, each [B, kv_heads, C, head_dim]


@dataclass(frozen=True)
class DFlashConfig(HeadConfig):
    hidden_size: int = 320  # the target's hidden size (the drafter reads its embeddings and lm_head)
    num_layers: int = 2  # draft decoder layers
    num_heads: int = 5
    num_kv_heads: int = 5
    head_dim: int = 64
    intermediate_size: int = 864  # the SwiGLU MLP's width
    target_layers: tuple[int, ...] = (1, 3)  # the target's decoder layers fused into the context feature
    block_size: int = 8  # B: the last verified token and B - 1 masks, filled in one forward
    mask_token_id: int = 3  # the tokenizer's <|mask|>
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be at least 1")
        check(self.num_heads % self.num_kv_heads == 0, "num_heads", self.num_heads,
              f"must be a multiple of num_kv_heads ({self.num_kv_heads})")
        check(self.head_dim % 2 == 0, "head_dim", self.head_dim, "must be even (rotary embedding)")
        check(len(self.target_layers) >= 1, "target_layers", self.target_layers, "must name at least one layer")
        check(self.block_size >= 2, "block_size", self.block_size, "must be at least 2 (one token and one mask)")
        check(self.mask_token_id >= 0, "mask_token_id", self.mask_token_id, "must be a token id")


def default_target_layers(num_layers: int, count: int) -> tuple[int, ...]:
    """The authors' rule (`build_target_layer_ids`): `count` layers evenly spaced from layer 1 to layer L - 3, the
    middle one when count is 1; small targets where that span is empty spread over all their layers instead."""
    if count == 1:
        return (num_layers // 2,)
    start, end = (1, num_layers - 3) if num_layers - 3 > 1 else (0, num_layers - 1)
    return tuple(sorted({int(round(start + i * (end - start) / (count - 1))) for i in range(count)}))


def rotary(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` positions -> cos, sin `[B, 1, T, dim]` of the default rotary embedding (half-split layout)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)  # [dim/2]
    angles = positions.float()[..., None] * inv  # [B, T, dim/2]
    emb = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class DFlashAttention(nn.Module):
    """Attention whose keys and values are the context's (projected from the fused target feature) followed by the
    block's own; queries come from the block only. Which key each query may read is the caller's `visible` mask."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(H, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(H, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(H, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, H, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KV:
        """`[B, T, H]` -> keys (normed per head, rotated) and values `[B, kv_heads, T, head_dim]`."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.cfg.num_kv_heads, -1)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.cfg.num_kv_heads, -1).transpose(1, 2)
        return _rotate(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: KV,
                visible: torch.Tensor | None) -> torch.Tensor:
        B, Q, _ = x.shape
        q = _rotate(self.q_norm(self.q_proj(x).view(B, Q, self.cfg.num_heads, -1)).transpose(1, 2), cos, sin)
        k, v = self.keys(x, cos, sin)
        k = torch.cat([context[0], k], dim=2)  # [B, kv, C + Q, d]
        v = torch.cat([context[1], v], dim=2)
        groups = self.cfg.num_heads // self.cfg.num_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = visible[:, None] if visible is not None else None  # [B, 1, Q, C + Q] bool
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, heads, Q, d]
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))


class DFlashLayer(nn.Module):
    """A pre-norm decoder layer; the context keys skip `input_layernorm` (they come from the fused feature)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: KV,
                visible: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


@register_head("dflash")
class DFlashHead(Head):
    """The block drafter. `fuse` turns the target's layer outputs into context features, `context` projects those
    into each layer's keys and values (what a decoder caches), `forward` runs a block over them."""

    config_class = DFlashConfig
    config: DFlashConfig

    def __init__(self, config: DFlashConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        H = config.hidden_size
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.fc = nn.Linear(len(config.target_layers) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.training_options: dict[str, float] = {}  # how a trainer set it up (anchors, gamma); not saved

    @classmethod
    def for_target(cls, model: object, **options: object) -> DFlashHead:
        """A freshly initialised head shaped for `model` (`config_for`), what training starts from."""
        return build_for(model, None, **options)

    @classmethod
    def untrained(cls, model: object, seed: int = 0) -> DFlashHead:
        """A seeded random head for `model` with the default shape (lossless, but it rarely guesses right)."""
        return build_for(model, seed=seed)

    def blocks(self) -> list[DFlashLayer]:
        """The draft decoder layers, typed."""
        return [layer for layer in self.layers if isinstance(layer, DFlashLayer)]

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[B, T]` positions -> the cos/sin every layer rotates with."""
        return rotary(positions, self.config.head_dim, self.config.rope_theta, self.fc.weight.dtype)

    def fuse(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        """The target's outputs of `target_layers`, one `[B, T, H]` each in that order -> fused `[B, T, H]`."""
        if len(layers) != len(self.config.target_layers):
            raise ValueError(f"the DFlash head fuses {len(self.config.target_layers)} target layers "
                             f"{self.config.target_layers}, got {len(layers)}")
        return self.hidden_norm(self.fc(torch.cat([t.to(self.fc.weight.dtype) for t in layers], dim=-1)))

    def context(self, fused: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Fused features `[B, C, H]` at `[B, C]` positions -> each layer's context keys and values."""
        cos, sin = self.rotary(positions)
        return [layer.self_attn.keys(fused, cos, sin) for layer in self.blocks()]

    def forward(self, block: torch.Tensor, positions: torch.Tensor, context: Sequence[KV],
                visible: torch.Tensor | None = None) -> torch.Tensor:
        """Block embeddings `[B, Q, H]` (the target's embeddings of the block's tokens) at `[B, Q]` positions, over
        each layer's context K/V -> the final-normed block states `[B, Q, H]` for the target's lm_head. `visible`
        `[B, Q, C + Q]` bool says which context and block keys each query reads (None: all of them)."""
        cos, sin = self.rotary(positions)
        x = block.to(self.fc.weight.dtype)
        for layer, kv in zip(self.blocks(), context, strict=True):
            x = layer(x, cos, sin, kv, visible)
        return self.norm(x)


def target_parts(model: object) -> tuple[nn.Module, nn.Linear]:
    """The target's input embeddings and lm_head (shared, frozen) from a loaded `CausalLM`."""
    module = getattr(model, "model", model)
    embed, head = module.get_input_embeddings(), module.get_output_embeddings()  # type: ignore[attr-defined]
    if not isinstance(embed, nn.Module) or not isinstance(head, nn.Linear):
        raise ValueError(f"{type(module).__name__} exposes no input embeddings or lm_head for a DFlash drafter")
    return embed, head


def mask_token_of(model: object, default: int | None = None) -> int:
    """The target tokenizer's `<|mask|>` id; `default` (else the pad id) for a model whose tokenizer has none."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        found = tokenizer.convert_tokens_to_ids("<|mask|>")
        unk = getattr(tokenizer, "unk_token_id", None)
        if isinstance(found, int) and found >= 0 and found != unk:
            return found
    if default is not None:
        return default
    return int(getattr(model, "pad_token_id", 0))


def config_for(model: object, **options: object) -> DFlashConfig:
    """The DFlash shape for a target: its width, heads and rotary base, 2 layers, the authors' layer rule; any field
    given in `options` wins (e.g. `target_layers=(1, 3, 5)`, `block_size=16`)."""
    cfg = model.config  # type: ignore[attr-defined]
    H = int(cfg.hidden_size)
    heads = int(getattr(cfg, "num_attention_heads", 0) or max(1, H // 64))
    head_dim = int(getattr(cfg, "head_dim", 0) or H // heads)
    if head_dim % 2 or head_dim * heads != H:
        heads, head_dim = max(1, H // 64) if H % 64 == 0 else 1, 64 if H % 64 == 0 else H
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", 0) if isinstance(rope, dict) else 0) or float(
        getattr(cfg, "rope_theta", 10000.0) or 10000.0)
    num_layers = int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "n_layer", 0) or 1)
    count = len(options["target_layers"]) if "target_layers" in options else 2  # type: ignore[arg-type]
    fields: dict[str, object] = dict(
        hidden_size=H, num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
        intermediate_size=int(getattr(cfg, "intermediate_size", 0) or 4 * H),
        target_layers=default_target_layers(num_layers, count), mask_token_id=mask_token_of(model),
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6) or 1e-6), rope_theta=theta)
    fields.update(options)
    if "num_heads" in options and "num_kv_heads" not in options:
        fields["num_kv_heads"] = fields["num_heads"]
    return DFlashConfig(**fields)  # type: ignore[arg-type]


def build_for(model: object, seed: int | None = None, **options: object) -> DFlashHead:
    """A freshly initialised DFlash head for `model` (init: normal(0, 0.02) linears, unit norms, as transformers'
    `_init_weights`), on the model's device and dtype; `seed` makes it repeatable without touching the global RNG."""
    cfg = config_for(model, **options)
    num = int(getattr(model.config, "num_hidden_layers", 0) or 0)  # type: ignore[attr-defined]
    for i in cfg.target_layers:
        check(not num or -num <= i < num, "target_layers", cfg.target_layers,
              f"must be layers of the target (0..{num - 1})")
    head = DFlashHead(cfg, Target.of(model))
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.02)
    device, dtype = getattr(model, "device", None), getattr(model, "dtype", None)
    return head.to(device=device, dtype=dtype if isinstance(dtype, torch.dtype) else None)
