"""The masked-diffusion driver: a canvas of masks after the prompt, decoded block by block (LLaDA `generate`).

Each step is one forward over the whole canvas; a commit rule then picks which masked positions of
the current block take their prediction x0. Unlike LLaDA, a row stops once its text is settled through
its first EOS, and the rows left are decoded without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from ..models.diffusion import MaskedDiffusionLM
from ..types import PromptBatch, StepEvent
from .scores import confidence, num_transfer_tokens, predict

if TYPE_CHECKING:
    from .baseline import BaselineConfig

# (score [B, b] float64, -inf off the block's masked positions; k [B] scheduled count) -> commit [B, b] bool
Rule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def denoise(
    model: MaskedDiffusionLM,
    batch: PromptBatch,
    cfg: BaselineConfig,
    rule: Rule,
    generator: torch.Generator | None,
) -> Iterator[StepEvent]:
    device, mask_id = model.device, model.mask_token_id
    B, P, N = batch.size, batch.width, cfg.max_new_tokens
    x = torch.cat([batch.input_ids, torch.full((B, N), mask_id)], dim=1).to(device)  # [B, P + N] the canvas
    attention = torch.cat([batch.attention_mask, torch.ones(B, N, dtype=torch.long)], dim=1).to(device)  # [B, P + N]
    eos = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long, device=device)
    live = torch.arange(B, device=device)  # rows still decoding; finished rows cost no more work
    index = 0
    for lo in range(P, P + N, cfg.block_size):
        hi = lo + cfg.block_size
        k = num_transfer_tokens((x[:, lo:hi] == mask_id).sum(-1), cfg.steps_per_block)  # [B, S]
        for t in range(cfg.steps_per_block):
            masked = x[live, lo:hi] == mask_id  # [B', b]
            if not masked.any():  # the block is done early (only when a rule commits ahead of the schedule)
                break
            logits = model.forward(x[live], attention[live])[:, lo:hi]  # [B', b, V]
            x0, score = _propose(logits, masked, mask_id, cfg, generator)  # [B', b], [B', b]
            commit = rule(score, k[live, t].clamp(min=1)) & masked  # at least one per step: never stall
            x[live, lo:hi] = torch.where(commit, x0, x[live, lo:hi])
            done = finished(x[live, P:], mask_id, eos)  # [B']
            yield _event(index, B, live, x[live, lo:hi], commit, masked, done, lo - P)
            live, index = live[~done], index + 1
            if live.numel() == 0:
                return


def _propose(
    logits: torch.Tensor, masked: torch.Tensor, mask_id: int, cfg: BaselineConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 and its score (p(x0), or uniform noise for random remasking), -inf off the masked positions."""
    logits = logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))  # never predict MASK
    x0 = predict(logits, cfg.temperature, generator)  # [B, b]
    if cfg.remasking == "random":
        p = torch.rand(x0.shape, dtype=torch.float64, device=x0.device, generator=generator)
    else:
        p = confidence(logits, x0)
    return x0, p.masked_fill(~masked, float("-inf"))


def finished(gen: torch.Tensor, mask_id: int, eos: torch.Tensor) -> torch.Tensor:
    """`[B, N]` generated region -> `[B]` bool: no mask remains up to the first EOS (or anywhere, if none).

    Positions before the first EOS never change once committed, so the output is then final.
    """
    N = gen.shape[-1]
    is_eos = torch.isin(gen, eos)  # [B, N]
    first = torch.where(is_eos.any(-1), is_eos.long().argmax(-1), N)  # [B] offset of the first EOS, or N
    before = torch.arange(N, device=gen.device) < first[:, None]  # [B, N]
    return ~((gen == mask_id) & before).any(-1)


def _event(
    index: int,
    B: int,
    live: torch.Tensor,  # [B'] row ids
    block: torch.Tensor,  # [B', b] the block after this step
    commit: torch.Tensor,  # [B', b]
    masked: torch.Tensor,  # [B', b] before this step
    done: torch.Tensor,  # [B']
    offset: int,  # offset of the block's first position
) -> StepEvent:
    tokens: list[tuple[tuple[int, int], ...]] = [()] * B
    proposed, accepted, fin = [0] * B, [0] * B, [True] * B  # rows not live finished earlier
    for i, row in enumerate(live.tolist()):
        cols = commit[i].nonzero().squeeze(-1).tolist()
        tokens[row] = tuple((offset + j, t) for j, t in zip(cols, block[i, cols].tolist()))
        proposed[row], accepted[row], fin[row] = int(masked[i].sum()), len(cols), bool(done[i])
    return StepEvent(index, tuple(tokens), proposed=tuple(proposed), accepted=tuple(accepted), finished=tuple(fin))
