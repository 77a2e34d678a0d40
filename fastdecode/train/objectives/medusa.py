"""`medusa`: Medusa-1 heads on a frozen target (Cai et al. 2024), trained on the target's own greedy answers.

Head k at position t learns the token k + 2 places on, where that token is one the target answered with: the loss is
Σ_k 0.8^k · CE_k (the paper's λ_k; the authors' legacy trainer sums them equally, which lets the hopeless deep heads
pull as hard as the first). The labels are the target's greedy tokens, so matching them is matching its argmax, what
greedy verification accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...heads.medusa import MedusaHead, target_lm_head
from .base import HeadObjective, TargetBatch, head_device

DECAY = 0.8  # weight of head k's loss: DECAY ** k


def shifted(batch: TargetBatch, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(valid [B, T - offset] bool, labels [N])`: positions t whose token t + offset is an answer token, and it."""
    valid = batch.answer[:, offset:]  # [B, T - offset]
    return valid, batch.ids[:, offset:][valid]


def tied_lm_head(head: Any, target: Any) -> torch.Tensor | None:
    """The target's lm_head `[V, H]` as a constant when the head reads through it, else None."""
    return target_lm_head(target).detach().float() if head.config.tie_lm_head else None


# head k's logits `[N, V]` at the positions `valid` `[B, T - offset]` of the first T - offset hidden states
HeadLogits = Callable[[int, torch.Tensor, int], torch.Tensor]


def heads_loss(batch: TargetBatch, num_heads: int, logits_of: HeadLogits) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_k 0.8^k · CE_k over the heads that have a label in the batch, and each head's top-1 agreement."""
    T = batch.ids.shape[1]
    metrics: dict[str, float] = {}
    loss = batch.hidden.new_zeros(())
    for k in range(num_heads):
        offset = k + 2
        if T <= offset:
            break
        valid, labels = shifted(batch, offset)
        if labels.numel():
            loss = loss + scored(logits_of(k, valid, T - offset), labels, k, metrics)
    return loss, metrics


def scored(logits: torch.Tensor, labels: torch.Tensor, k: int, metrics: dict[str, float]) -> torch.Tensor:
    """Head k's weighted cross-entropy; its top-1 agreement with the target goes to `metrics[f"acc{k}"]`."""
    metrics[f"acc{k}"] = float((logits.argmax(-1) == labels).float().mean())
    return DECAY**k * F.cross_entropy(logits, labels)


class Medusa(HeadObjective):
    kind = "medusa"
    method = "spec.medusa"

    def build_head(self, target: Any, options: dict[str, Any]) -> MedusaHead:
        return MedusaHead.for_target(target, **options)

    def head_loss(self, head: Any, target: Any, batch: TargetBatch,
                  gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        assert isinstance(head, MedusaHead)
        device = head_device(head)
        batch = batch.to(device)
        lm = tied_lm_head(head, target)
        lm = lm.to(device) if lm is not None else None

        def logits_of(k: int, valid: torch.Tensor, n: int) -> torch.Tensor:
            feats = head.blocks[k](batch.hidden[:, :n][valid])  # [N, H]
            if lm is not None:
                return feats @ lm.T  # [N, V]
            assert head.lm_heads is not None  # an untied head has its own
            return head.lm_heads[k](feats)

        return heads_loss(batch, head.config.num_heads, logits_of)

    def card_lines(self, options: dict[str, Any]) -> list[str]:
        return ["Head k (0-based) reads the target's last hidden state h_t and guesses token t + k + 2: residual "
                "blocks x + SiLU(Wx), then the target's own lm_head (tied). Loss Σ_k 0.8^k · CE_k against the "
                "target's greedy tokens.", ""]
