"""Medusa heads (Cai et al. 2024, arXiv 2401.10774; FasterDecoding/Medusa `medusa/model/medusa_model.py`).

Head k (0-based) reads the target's last hidden state h_t (after the final norm, what its lm_head reads) and guesses
the token k + 2 places after t: residual blocks x + SiLU(W x), then an lm_head. By default every head reads its
logits through the target's own lm_head (`tie_lm_head`), so a head owns only its blocks (0.1 M parameters a head on
ar-small) and starts from the target's next-token guess; a head loaded from the Medusa layout brings lm_heads of
its own. `drafter.py`'s tree reads `logits(hidden)` of every head at once: the heads never see each other's tokens
(Hydra, `hydra.py`, does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .base import Head, HeadConfig, Target, register_head


@dataclass(frozen=True)
class MedusaConfig(HeadConfig):
    hidden_size: int = 0  # the target's hidden size
    vocab_size: int = 0  # the target's vocabulary
    num_heads: int = 4  # tokens guessed past the target's own next token (the deepest draft)
    num_layers: int = 1  # residual blocks per head
    tie_lm_head: bool = True  # read logits through the target's lm_head (else each head has its own)


class ResBlock(nn.Module):
    """x + SiLU(W x + b): starts as the identity when W and b are zero, so an untrained head guesses the next token."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        return x + nn.functional.silu(self.linear(x))


def target_lm_head(model: Any) -> torch.Tensor:
    """`[V, H]`: the weight of a loaded target's output layer (what tied heads read their logits through)."""
    return model.model.get_output_embeddings().weight


def target_embeddings(model: Any) -> torch.Tensor:
    """`[V, H]`: a loaded target's input embedding table (Hydra's heads read the drafted tokens through it)."""
    return model.model.get_input_embeddings().weight


def randomise(head: Head, seed: int) -> Head:
    """Every parameter drawn N(0, 0.02) from a seeded generator: an untrained head that still guesses variously."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return head.eval()


class TiedHeads(Head):
    """What Medusa's and Hydra's heads share: K heads of residual blocks whose logits are read through the target's
    lm_head (`tie_lm_head`) or through lm_heads of their own, the shape checks, and how a fresh head is made."""

    config: MedusaConfig

    def _check(self, config: MedusaConfig) -> None:
        if config.hidden_size <= 0 or config.vocab_size <= 0 or config.num_heads < 1 or config.num_layers < 0:
            raise ValueError(f"a {self.kind} head needs hidden_size, vocab_size > 0, num_heads >= 1, "
                             f"num_layers >= 0; got {config}")

    def _build_blocks(self, config: MedusaConfig) -> None:
        H, V = config.hidden_size, config.vocab_size
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(H) for _ in range(config.num_layers))) for _ in range(config.num_heads))
        self.lm_heads = (None if config.tie_lm_head else
                         nn.ModuleList(nn.Linear(H, V, bias=False) for _ in range(config.num_heads)))

    @classmethod
    def for_target(cls, model: Any, **options: Any) -> Any:
        """A fresh head shaped for `model` (a loaded `CausalLM`) that starts as the target's own next-token guess;
        own lm_heads (when `tie_lm_head=False`) start as copies of the target's."""
        config = cls.config_class(hidden_size=int(model.config.hidden_size),  # type: ignore[call-arg]
                                  vocab_size=int(model.config.vocab_size), **options)
        head = cls(config, Target.of(model))
        if head.lm_heads is not None:
            with torch.no_grad():
                for weight in head.lm_heads.parameters():  # one weight a head, no bias
                    weight.copy_(target_lm_head(model).float())
        return head

    @classmethod
    def untrained(cls, model: Any, seed: int = 0) -> Any:
        return randomise(cls.for_target(model), seed)

    def read_logits(self, k: int, feats: torch.Tensor, lm_head: torch.Tensor | None) -> torch.Tensor:
        """Head k's logits `[..., V]` from its features `[..., H]`; `lm_head` `[V, H]` is the target's
        (`target_lm_head`), needed when tied."""
        if self.lm_heads is not None:
            return self.lm_heads[k](feats)
        if lm_head is None:
            raise ValueError(f"this {self.kind} head reads the target's lm_head: pass it (heads.medusa.target_lm_head)")
        return feats @ lm_head.to(feats.dtype).T


@register_head("medusa")
class MedusaHead(TiedHeads):
    """K heads of residual blocks over h_t; head k's logits guess token t + k + 2."""

    config_class = MedusaConfig
    config: MedusaConfig

    def __init__(self, config: MedusaConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        self._check(config)
        self._build_blocks(config)

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[..., H]` -> `[K, ..., H]`: what each head's lm_head reads."""
        return torch.stack([blocks(hidden) for blocks in self.blocks])

    def logits(self, hidden: torch.Tensor, lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """`[..., H]` -> `[K, ..., V]`; `lm_head` `[V, H]` is the target's (`target_lm_head`), needed when tied."""
        feats = self.features(hidden)  # [K, ..., H]
        if self.lm_heads is None:  # one product for every head
            return self.read_logits(0, feats, lm_head)
        return torch.stack([self.read_logits(k, f, lm_head) for k, f in enumerate(feats)])
