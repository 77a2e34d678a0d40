"""The Distilled Decoding network (DD1's few-step generator, DD2's one-step generator and its score network).

A copy of the teacher's Llama body reads `[class] + n` continuous d-dimensional vectors instead of code ids: the
class token through the teacher's own embedding, each vector through a new `Linear(d -> hidden)`, plus a 2-entry
embedding that says whether a position holds noise or data (the DD1 authors' `n_d_embed`, `dd.py` of
microsoft/distilled_decoding). Attention stays causal and the output at the position of vector i predicts token i
(no shift): it sees noise 1..i, which the noise -> token map of token i depends on. Two heads read it: the teacher's
logits head restricted to the K codes, and an adaLN regression head (LayerNorm, then shift and scale from the class
embedding, then Linear(hidden -> d)) for a continuous code vector.

The same module serves DD2's score network psi: there `denoise` reads a noisy vector and its noise level beside the
hidden state of the prefix and predicts the clean vector (`denoiser=True` in the config adds that MLP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaModel

from .base import Head, HeadConfig, Target, register_head

NOISE, DATA = 0, 1


@dataclass(frozen=True)
class DDConfig(HeadConfig):
    """The teacher's body shape and the image layout, enough to rebuild the network without the teacher."""

    hidden_size: int = 0
    intermediate_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    vocab_size: int = 0  # the teacher's (codes + classes + null): its embedding gives the class token
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    codes: int = 0  # K
    code_dim: int = 0  # d
    tokens: int = 0  # h*w
    split: int = 0  # positions < split are read off the logits head (argmax code), the rest off the regression head
    second: int = 0  # the 2-step schedule's second step: positions < second kept from step 1 (0: 1 step only)
    denoiser: bool = False  # DD2's score network: an MLP denoising head over (hidden, noisy vector, noise level)
    init: str = ""  # what the weights started from ("teacher", "dd1"), for the card
    cfg_scale: float = 0.0  # the teacher's guidance it was distilled at (0: unknown); other scales are refused


def _llama(config: DDConfig) -> LlamaConfig:
    fields: dict[str, Any] = dict(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, max_position_embeddings=config.tokens + 1,
        rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaConfig(**fields)


class AdaLNHead(nn.Module):
    """LayerNorm without affine, shift and scale from the class embedding, then a linear map: [B, T, H] -> [B, T, o]."""

    def __init__(self, hidden: int, out: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.modulation = nn.Parameter(torch.randn(2, hidden) / hidden ** 0.5)
        self.linear = nn.Linear(hidden, out)

    def forward(self, h: Tensor, cond: Tensor) -> Tensor:  # h [B, T, H], cond [B, 1, H]
        shift, scale = self.modulation[0] + cond, self.modulation[1] + cond  # [B, 1, H]
        return self.linear(self.norm(h) * (1 + scale) + shift)


class Denoiser(nn.Module):
    """DD2's psi head: the clean code vector from the prefix's hidden state, a noisy vector and its noise level."""

    def __init__(self, hidden: int, d: int, width: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden + d + 1, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                                 nn.Linear(width, d))

    def forward(self, h: Tensor, x: Tensor, sigma: Tensor) -> Tensor:  # [B, T, H], [B, T, d], [B, T, 1] -> [B, T, d]
        return self.net(torch.cat([h, x, torch.log(sigma)], dim=-1))


@register_head("dd")
class DDNet(Head):
    config_class = DDConfig
    config: DDConfig
    codebook: Tensor

    def __init__(self, config: DDConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        H, d = config.hidden_size, config.code_dim
        self.body = LlamaModel(_llama(config))
        self.lm_head = nn.Linear(H, config.vocab_size, bias=False)
        self.vector_in = nn.Linear(d, H)
        self.noise_data = nn.Embedding(2, H)
        self.regress = AdaLNHead(H, d)
        self.denoise = Denoiser(H, d) if config.denoiser else None
        self.register_buffer("codebook", torch.zeros(config.codes, d))  # [K, d], the teacher's

    # -- building ---------------------------------------------------------------------------------------------------
    @classmethod
    def for_target(cls, model: Any, **options: Any) -> DDNet:
        """A DD network shaped for an image teacher (`model.image` set), its body and heads copied from the teacher."""
        image = getattr(model, "image", None)
        if image is None:
            raise TypeError(f"Distilled Decoding needs an image model (one with an image.json), not "
                            f"{getattr(model, 'name', 'this model')!r}")
        c = model.config
        config = DDConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
                          num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                          vocab_size=c.vocab_size, rope_theta=float(getattr(c, "rope_theta", 10000.0)),
                          rms_norm_eps=float(c.rms_norm_eps), codes=image.K, code_dim=image.d, tokens=image.tokens,
                          **options)
        net = cls(config, Target.of(model))
        net.copy_teacher(model.model)
        with torch.no_grad():
            net.codebook.copy_(image.codebook.float())
        return net

    @classmethod
    def untrained(cls, model: Any, seed: int = 0) -> DDNet:
        torch.manual_seed(seed)
        image = model.image
        return cls.for_target(model, split=max(1, image.tokens // 3), second=image.tokens // 3)

    def copy_teacher(self, teacher: nn.Module) -> None:
        """The teacher's embedding, blocks, norm and logits head (a `LlamaForCausalLM`) into this network."""
        own = self.body.state_dict()
        theirs = {k.removeprefix("model."): v for k, v in teacher.state_dict().items() if k.startswith("model.")}
        missing = sorted(set(own) - set(theirs))
        if missing:
            raise ValueError(f"the teacher lacks {missing[:3]}: it is not a Llama of this shape")
        self.body.load_state_dict({k: theirs[k].float() for k in own})
        self.lm_head.weight.data.copy_(teacher.state_dict()["lm_head.weight"].float())

    # -- the forward ------------------------------------------------------------------------------------------------
    def hidden(self, labels: Tensor, x: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """labels [B] class token ids, x [B, n, d] vectors, t [B] data count (positions < t hold data) ->
        (hidden states at the n vector positions [B, n, H], class embedding [B, 1, H])."""
        B, n, _ = x.shape
        cls = self.body.embed_tokens(labels)[:, None]  # [B, 1, H]
        h = torch.cat([cls, self.vector_in(x.to(cls.dtype))], dim=1)  # [B, n + 1, H]
        flags = (torch.arange(n + 1, device=x.device)[None] <= t[:, None]).long()  # [B, n + 1]: class + data = 1
        h = h + self.noise_data(flags)
        positions = torch.arange(n + 1, device=x.device)[None].expand(B, -1)
        out = self.body(inputs_embeds=h, position_ids=positions).last_hidden_state  # [B, n + 1, H]
        return out[:, 1:], cls

    def forward(self, labels: Tensor, x: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """-> (code logits [B, n, K], regressed vectors [B, n, d]); output i predicts token i."""
        h, cls = self.hidden(labels, x, t)
        logits = self.lm_head(h)[..., : self.config.codes].float()  # [B, n, K]
        return logits, self.regress(h, cls).float()

    def tokens_from(self, logits: Tensor, vectors: Tensor) -> Tensor:
        """Codes [B, n]: the logits' argmax before `split`, the code nearest each regressed vector from there."""
        near = torch.cdist(vectors.float(), self.codebook.float()[None]).argmin(-1)  # [B, n]
        picked = logits.argmax(-1)  # [B, n]
        early = torch.arange(logits.shape[1], device=logits.device) < self.config.split
        return torch.where(early[None], picked, near)
