"""dlm.ete: explore-then-exploit, after "From Bits to Rounds" (arXiv:2511.21103). No public code exists;
the rule below is our reading of the paper's description.

The paper bounds the rounds (forwards) from below by the answer's information in bits over what one
round can resolve. Confidence-only rules resolve little per round, since they commit only near-certain
tokens of one block. ETE raises the bits per round two ways:
- exploit, across blocks: commit every masked position of the look-ahead (the current block and the
  `lookahead` positions after it; all the rest of the canvas by default) with p(x0) >= `threshold`;
- explore: when no position of the current block passes (a stalled round), also commit the block's most
  uncertain plausible prediction (the highest-entropy masked position with p(x0) >= `explore_floor`)
  beside the block's most confident one. One uncertain choice per round keeps the round coherent (one
  uncertain token plus near-certain ones is close to the joint), and it reshapes the conditionals so the
  next rounds find more confident tokens (the "cascade").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from ..driver import denoise
from ..policy import BlockConfig, Step, View, block_view, in_block, register_dlm
from ..rules import top1
from ..scores import neg_entropy


@dataclass(frozen=True)
class ETEConfig(BlockConfig):
    threshold: float = 0.9  # exploit: commit any masked position of the look-ahead this confident
    lookahead: int | None = None  # positions past the block's end exploit may commit; None: the rest of the canvas
    explore_floor: float = 0.5  # explore only predictions at least this probable (more likely than all others)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1]")
        check(0 <= self.explore_floor <= self.threshold, "explore_floor", self.explore_floor,
              f"must be in [0, threshold={self.threshold}]")
        if self.lookahead is not None:
            check(self.lookahead >= 0, "lookahead", self.lookahead, "must be >= 0, or None for the rest of the canvas")


class ExploreExploit:
    def __init__(self, mask_id: int, cfg: ETEConfig, rows: int, device: torch.device) -> None:
        self.mask_id, self.cfg, self.n = mask_id, cfg, cfg.max_new_tokens
        self.hi = torch.zeros(rows, dtype=torch.long, device=device)  # end of each row's current block

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        v = block_view(gen, self.mask_id, self.cfg.block_size)
        self.hi[rows] = v.hi
        ahead = self.n if self.cfg.lookahead is None else self.cfg.lookahead
        return View(v.lo, (v.hi + ahead).clamp(max=self.n), v.block)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        c, masked, conf = self.cfg, step.masked, step.conf
        block = in_block(step, self.hi[step.rows]) & masked  # [B', W]
        exploit = masked & (conf >= c.threshold)
        best = top1(conf.masked_fill(~block, float("-inf")))
        stalled = ~(exploit & block).any(-1, keepdim=True)
        plausible = block & ~best & (conf >= c.explore_floor)
        explore = top1(step.score(-neg_entropy(step.logits)).masked_fill(~plausible, float("-inf")))
        return exploit | best | (explore & stalled), step.x0


@register_dlm("dlm.ete", config=ETEConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: ETEConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Explore-then-exploit: confident tokens committed across blocks; a stalled block also commits its most
    uncertain plausible token."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = ExploreExploit(model.mask_token_id, cfg, batch.size, model.device)
    return denoise(model, batch, cfg, policy, generator, "dlm.ete", ctx.constraint)
