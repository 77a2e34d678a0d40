"""`hydra`: Hydra heads (Ankner et al. 2024) on a frozen target: Medusa's loss, each head also fed the embeddings
of the tokens between h_t and the token it guesses (teacher forcing with the target's own greedy tokens, which are
what an accepted draft path holds at decoding time)."""

from __future__ import annotations

from typing import Any

import torch

from ...heads.hydra import HydraHead
from ...heads.medusa import target_embeddings
from .base import HeadObjective, TargetBatch, head_device
from .medusa import heads_loss, tied_lm_head


class Hydra(HeadObjective):
    kind = "hydra"
    method = "spec.medusa"

    def method_params(self, folder: str) -> dict[str, Any]:
        return {"hydra": True, "head": folder}

    def build_head(self, target: Any, options: dict[str, Any]) -> HydraHead:
        return HydraHead.for_target(target, **options)

    def head_loss(self, head: Any, target: Any, batch: TargetBatch,
                  gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        assert isinstance(head, HydraHead)
        device = head_device(head)
        batch = batch.to(device)
        lm = tied_lm_head(head, target)
        lm = lm.to(device) if lm is not None else None
        embed = target_embeddings(target).detach().float().to(device)  # [V, H]

        def logits_of(k: int, valid: torch.Tensor, n: int) -> torch.Tensor:
            # [B, n, k + 1]: the tokens t + 1 .. t + k + 1 between h_t and the guessed token
            path = torch.stack([batch.ids[:, 1 + j : n + 1 + j] for j in range(k + 1)], dim=-1)
            return head.head_logits(k, batch.hidden[:, :n][valid], embed[path[valid]], lm)  # [N, V]

        return heads_loss(batch, head.config.num_heads, logits_of)

    def card_lines(self, options: dict[str, Any]) -> list[str]:
        return ["Head k (0-based) reads h_t and the embeddings of tokens t + 1 .. t + k + 1 (the target's next token "
                "and the k drafted before it), through a linear map to the hidden size, a residual block x + "
                "SiLU(Wx) and the target's own lm_head (tied); it guesses token t + k + 2. Loss Σ_k 0.8^k · CE_k "
                "against the target's greedy tokens.", ""]
