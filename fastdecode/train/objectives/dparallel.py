"""`dparallel`: dParallel's certainty-forcing distillation loss (Chen et al., 2025; checked against the authors'
`LLaDA/llada_train.py`, czg1225/dParallel 2ca4d14).

The masking is semi-autoregressive, as the student will decode: the answer's blocks before a drawn block are clean,
the drawn block is masked at a fixed ratio (0.5) and, in a second forward, at the complementary positions, and every
later block is fully masked (but not scored). The loss is the cross-entropy on each forward's masked in-block
positions plus `entropy_weight` x the entropy (of the softmax at `temperature` 0.5) on those masked positions the
model already predicts correctly: it learns the teacher's answers and, where it has them right, to be sure of them,
which is what lets a threshold rule commit many tokens at once.

Differences from the authors' code (docs/diffusion.md, "dParallel"): the block is drawn among the canvas's own blocks
(theirs may draw the empty tail past the last whole block, a step with no loss); the two means are over the batch's
masked positions (theirs per example, one example a micro-batch); a model with shifted logits (Dream's convention,
zoo:dlm-small) scores token i at output i - 1.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...errors import ParameterError
from ..data import Packed
from .base import Batch
from .mdlm import MDLM

BLOCK = 16  # the decoding block the student is trained for (the zoo's dlm.* block_length)
MASK_RATIO = 0.5  # the authors' fixed t = 0.5: the drawn block half masked, then its complement
ENTROPY_WEIGHT = 2.0
TEMPERATURE = 0.5  # the entropy is of softmax(logits / 0.5): sharper than the model's own


def semi_ar_masks(answer: torch.Tensor, gen: torch.Generator, block: int = BLOCK,
                  ratio: float = MASK_RATIO) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[B, T]` answer positions (one contiguous run per row) -> (first, second, later), each `[B, T]` bool.

    One block of each row's answer is drawn uniformly (blocks counted from the answer's start, as the decoder's);
    `first` masks each of its positions with probability `ratio`, `second` the others; `later` is every answer
    position after the block (masked in both forwards, never scored). Drawn on the CPU with `gen` (the same masks on
    any device), returned on `answer`'s device.
    """
    device = answer.device
    answer = answer.cpu()
    B, T = answer.shape
    start = answer.long().argmax(dim=1, keepdim=True)  # [B, 1] the first answer position
    offset = torch.arange(T)[None, :] - start  # [B, T]
    index = torch.where(answer, offset.div(block, rounding_mode="floor"), -1)  # [B, T] block of each position
    blocks = index.amax(dim=1).clamp(min=0) + 1  # [B]
    drawn = (torch.rand(B, generator=gen) * blocks).long().clamp(max=blocks - 1)[:, None]  # [B, 1]
    inside = answer & (index == drawn)
    first = inside & (torch.rand(B, T, generator=gen) < ratio)
    return first.to(device), (inside & ~first).to(device), (answer & (index > drawn)).to(device)


def certainty_forcing(model: Any, ids: torch.Tensor, attention: torch.Tensor, answer: torch.Tensor, mask_id: int,
                      gen: torch.Generator, block: int = BLOCK, ratio: float = MASK_RATIO,
                      entropy_weight: float = ENTROPY_WEIGHT,
                      temperature: float = TEMPERATURE) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss on right-padded rows `ids` `[B, T]` (`attention` real tokens, `answer` the answer and its EOS
    padding) and its parts: `ce` and `entropy` (summed over the two forwards, as the loss adds them) and `acc`, the
    share of masked positions predicted correctly."""
    first, second, later = semi_ar_masks(answer, gen, block, ratio)
    shift = bool(getattr(model.config, "logits_shift", False))
    loss = torch.zeros((), device=ids.device)
    ce_total = ent_total = 0.0
    right = scored = 0
    for masked in (first, second):
        if not masked.any():
            continue
        # a shifted model scores token i at output i - 1 (an answer token never sits at position 0)
        at = torch.cat([masked[:, 1:], torch.zeros_like(masked[:, :1])], dim=1) if shift else masked
        logits = model(input_ids=ids.masked_fill(masked | later, mask_id), attention_mask=attention.long(),
                       logits_at=at).logits.float()  # [N, V] in the order of the masked positions
        labels = ids[masked]  # [N]
        ce = F.cross_entropy(logits, labels)
        logp = (logits / temperature).log_softmax(dim=-1)  # [N, V]
        entropy = -(logp.exp() * logp).sum(dim=-1)  # [N]
        correct = logits.argmax(dim=-1) == labels  # [N]
        certainty = (entropy * correct).sum() / correct.sum().clamp(min=1)
        loss = loss + ce + entropy_weight * certainty
        ce_total += ce.item()
        ent_total += certainty.item()
        right += int(correct.sum())
        scored += labels.numel()
    return loss, {"ce": ce_total, "entropy": ent_total, "acc": right / max(1, scored)}


class DParallel(MDLM):
    """The `mdlm` model and canvases, trained with the certainty-forcing loss (padded rows only: the block is
    counted from each row's answer start)."""

    name = "dparallel"

    def loss(self, model: torch.nn.Module, batch: Batch, mask_id: int, gen: torch.Generator) -> torch.Tensor:
        if isinstance(batch, Packed):
            raise ParameterError("The dparallel objective takes padded rows, not packed ones: set pack_len=0.")
        ids, attention, answer = batch
        return certainty_forcing(model, ids, attention, answer, mask_id, gen)[0]
