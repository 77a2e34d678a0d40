"""A small LLaDA-style masked-diffusion LM: a Llama-shaped transformer with bidirectional attention.

Its parameter names equal `LlamaForCausalLM`'s, so an AR checkpoint initialises it directly (the
AR-to-diffusion adaptation of Dream / DiffuLLaMA). Importing fastdecode registers it with
`AutoConfig` / `AutoModel`, so `from_pretrained` loads it without remote code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from ..attention import sdpa
from .layers import RMSNorm, SwiGLU, add_rms_norm, gated, rms_norm
from .native import Fusion


class MDLMConfig(PretrainedConfig):
    model_type = "fastdecode_mdlm"

    def __init__(
        self,
        vocab_size: int = 4096,
        hidden_size: int = 256,
        intermediate_size: int = 768,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        max_position_embeddings: int = 512,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        mask_token_id: int = 3,
        logits_shift: bool = False,
        tie_word_embeddings: bool = False,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.mask_token_id = mask_token_id
        self.logits_shift = logits_shift  # False: logits at the same position (LLaDA); True: shifted (Dream)
        # transformers types the config __init__ from its dataclass fields; at run time it takes any keyword
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)  # type: ignore[call-arg]


def _cached_length(cache: list[LayerKV] | None) -> int:
    """Canvas columns the cache holds (a forward with `query_index` has checked that there is one)."""
    assert cache is not None and cache[0].k is not None
    return cache[0].k.shape[2]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys rotated by their positions' `cos`, `sin` (Llama's half-rotation layout)."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@dataclass(frozen=True)
class Ops:
    """The elementwise runs of a layer: the plain functions, or the same compiled (`MDLMForMaskedDiffusion.fuse`)."""

    rms: Callable[..., Any] = rms_norm
    add_rms: Callable[..., Any] = add_rms_norm
    rope: Callable[..., Any] = apply_rope
    gated: Callable[..., Any] = gated


PLAIN = Ops()


def rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[B, 1, L, D]` in Llama's half-rotation layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    freqs = positions.float()[..., None] * inv_freq  # [B, L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


@dataclass
class LayerKV:
    """One layer's keys and values for every canvas column, `[B, KVH, L, D]` (keys after RoPE).

    A forward with `query_index` writes the fresh K/V of its columns in (rebinding `k`, `v`) and reads
    every other column from here; that is how a masked-diffusion cache (Fast-dLLM, dKV-Cache) reuses K/V.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None


@dataclass
class MDLMOutput(ModelOutput):
    logits: torch.Tensor | None = None  # [B, Q, V]
    # per layer, whole canvas; with use_cache=True. Named `cache` as transformers >= 5.24 names it (5.24's ModelOutput
    # renames a `past_key_values` argument to `cache`)
    cache: list[LayerKV] | None = None


class Attention(nn.Module):
    def __init__(self, cfg: MDLMConfig) -> None:
        super().__init__()
        self.h, self.kvh = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = cfg.hidden_size // cfg.num_attention_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, hidden]
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,  # [B, 1, 1, L]
        kv: LayerKV | None = None,
        index: torch.Tensor | None = None,  # [B, Q] canvas columns of x; None: x is the whole canvas
        ops: Ops = PLAIN,
    ) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.h, self.d).transpose(1, 2)  # [B, H, Q, D]
        k = self.k_proj(x).view(B, L, self.kvh, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.kvh, self.d).transpose(1, 2)
        q, k = ops.rope(q, k, cos, sin)
        if kv is not None and index is None:  # the whole canvas: remember its K/V
            kv.k, kv.v = k, v
        elif kv is not None and index is not None:  # some columns: write their fresh K/V in, attend to the whole canvas
            assert kv.k is not None and kv.v is not None, "a partial forward needs the canvas's K/V"
            at = index[:, None, :, None].expand(-1, self.kvh, -1, self.d)  # [B, KVH, Q, D]
            kv.k, kv.v = kv.k.scatter(2, at, k), kv.v.scatter(2, at, v)
            k, v = kv.k, kv.v  # [B, KVH, L, D]
        if self.kvh != self.h:
            k, v = (t.repeat_interleave(self.h // self.kvh, dim=1) for t in (k, v))
        y = sdpa(q, k, v, mask)  # bidirectional
        return self.o_proj(y.transpose(1, 2).reshape(B, L, self.h * self.d))


class Block(nn.Module):
    def __init__(self, cfg: MDLMConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        kv: LayerKV | None = None,
        index: torch.Tensor | None = None,
        ops: Ops = PLAIN,
    ) -> torch.Tensor:
        """The layer: the norms and the gated MLP as `ops` gives them (the modules' own operations, or compiled)."""
        norm, post, mlp = self.input_layernorm, self.post_attention_layernorm, self.mlp
        out = self.self_attn(ops.rms(x, norm.weight, norm.eps), cos, sin, mask, kv, index, ops)
        x, h = ops.add_rms(x, out, post.weight, post.eps)
        return x + mlp.down_proj(ops.gated(mlp.gate_proj(h), mlp.up_proj(h)))


class Backbone(nn.Module):
    def __init__(self, cfg: MDLMConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MDLMForMaskedDiffusion(PreTrainedModel):
    config_class = MDLMConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: MDLMConfig) -> None:
        super().__init__(config)
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        self.fusion = Fusion(PLAIN, dynamic=True)

    @property
    def fused(self) -> bool:
        return self.fusion.on

    def fuse(self, on: bool = True, backend: Any = "inductor") -> None:
        """Run the layers' elementwise runs (the norms with the residual add before the second, the rotary products,
        the gated MLP's SiLU times up) as compiled functions (`on`), or the plain ones: the same operations fused into
        a few kernels per layer, where a forward of this small model on a GPU is bound by its number of kernels
        (docs/gpu.md). The compiled functions take any canvas length (`dynamic=True`: a diffusion forward's shapes
        change with the prompt, the canvas and the columns a cache recomputes). Their rounding differs from the plain
        functions' (a fused norm keeps float32 inside), so it is a setting of its own: a lossless method equals its
        baseline run with the same setting. `backend` is `torch.compile`'s (`"eager"` traces without generating
        kernels, as the CPU tests do)."""
        self.fusion.fuse(self, on, backend)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    # recomputes chosen columns against cached K/V (query_index) and computes logits at chosen outputs (logits_index)
    supports_partial_forward = True

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, L], or [B, Q]: the canvas columns `query_index` names
        attention_mask: torch.Tensor | None = None,  # [B, L] over the whole canvas, 0 = padding (never attended to);
        # or [B, 1, Q, L] bool, True where a column may be attended to (packed training rows; needs position_ids)
        position_ids: torch.Tensor | None = None,  # [B, L] or [B, Q]
        cache: list[LayerKV] | None = None,  # per layer, whole canvas; updated with the fresh columns
        query_index: torch.Tensor | None = None,  # [B, Q] columns to compute; the others come from `cache`
        use_cache: bool = False,  # return every layer's K/V (a new cache when none was passed)
        logits_at: torch.Tensor | None = None,  # [B, L] bool: logits only there, as [N, V] (training's masked tokens)
        logits_index: torch.Tensor | None = None,  # [B, W] outputs (indices into the computed columns): logits only
        # there, as [B, W, V] (the columns a decoding step reads)
        past_key_values: list[LayerKV] | None = None,  # the name of `cache` before transformers 5.24
        **_: object,
    ) -> MDLMOutput:
        """Logits of the given columns. Without `query_index` the whole canvas is computed (no cache needed).

        With it, only those columns run through the layers; they attend to all L columns, taking the K/V of
        the others from `cache` (stale where the canvas changed since: that is the cache's trade).

        The first fused forward (`fuse`) is where torch.compile builds its kernels; where it cannot (no Triton, no C
        compiler), the forward runs again unfused, which stays the setting, with a warning. Rerunning is safe: a
        partial forward writes the same keys and values into `cache` again.
        """
        args = (input_ids, attention_mask, position_ids, cache if cache is not None else past_key_values,
                query_index, use_cache, logits_at, logits_index)
        return self.fusion.run(lambda: self._forward(*args))

    def _forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        cache: list[LayerKV] | None, query_index: torch.Tensor | None, use_cache: bool,
        logits_at: torch.Tensor | None, logits_index: torch.Tensor | None,
    ) -> MDLMOutput:
        cfg = self.config
        if query_index is not None and cache is None:
            raise ValueError("query_index needs a cache: the K/V of the columns that are not recomputed")
        x = self.model.embed_tokens(input_ids)
        full_mask = attention_mask is not None and attention_mask.dim() == 4
        if full_mask and position_ids is None:
            raise ValueError(
                "a [B, 1, Q, L] attention_mask needs position_ids (positions restart in every packed example)"
            )
        if position_ids is None:
            L = input_ids.shape[1] if query_index is None else _cached_length(cache)
            if attention_mask is None:
                position_ids = torch.arange(L, device=input_ids.device).expand(input_ids.shape[0], L)
            else:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            if query_index is not None:
                position_ids = position_ids.gather(1, query_index)
        cos, sin = rope(position_ids, cfg.hidden_size // cfg.num_attention_heads, cfg.rope_theta, x.dtype)
        if attention_mask is None:
            mask = None
        else:
            mask = attention_mask.bool() if full_mask else attention_mask.bool()[:, None, None, :]  # [B, 1, Q | 1, L]
        if cache is None and use_cache:
            cache = [LayerKV() for _ in self.model.layers]
        ops = self.fusion.ops
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, None if cache is None else cache[i], query_index, ops)
        x = ops.rms(x, self.model.norm.weight, self.model.norm.eps)
        if logits_at is not None:
            x = x[logits_at]
        elif logits_index is not None:
            x = x.gather(1, logits_index[..., None].expand(-1, -1, x.shape[-1]))
        return MDLMOutput(logits=self.lm_head(x), cache=cache if use_cache else None)


AutoConfig.register(MDLMConfig.model_type, MDLMConfig, exist_ok=True)
AutoModel.register(MDLMConfig, MDLMForMaskedDiffusion, exist_ok=True)
AutoModelForMaskedLM.register(MDLMConfig, MDLMForMaskedDiffusion, exist_ok=True)
