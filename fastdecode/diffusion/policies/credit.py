"""dlm.credit: CreditDecoding (arXiv:2510.06133), as dInfer's `CreditThresholdParallelDecoder`.

Each masked position accumulates "trace credit" for the tokens it kept predicting; the credits, decayed
every step, are fused into the logits, so a token predicted steadily reaches the threshold sooner.
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
from ..driver import denoise, propose
from ..policy import BlockConfig, BlockPolicy, Step, register_dlm
from ..rules import credit_fuse, credit_update, threshold


@dataclass(frozen=True)
class CreditConfig(BlockConfig):
    threshold: float = 0.9  # tau of the threshold rule run on the fused logits
    alpha: float = 0.7  # fusion: logits + alpha * log(1 + C)
    beta: float = 0.8  # decay of every credit per step
    gamma: float = 0.2  # a position's top-1 token gains p_top1 ** gamma credit per step

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1]")
        check(self.alpha >= 0, "alpha", self.alpha, "must be >= 0 (0 is the plain threshold rule)")
        check(0 <= self.beta <= 1, "beta", self.beta, "must be in [0, 1]")
        check(self.gamma >= 0, "gamma", self.gamma, "must be >= 0")


class Credit(BlockPolicy):
    """Credits `[B, block, V]` live for one block and restart at zero in the next."""

    def __init__(self, mask_id: int, cfg: CreditConfig, rows: int, device: torch.device,
                 generator: torch.Generator | None) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.cfg, self.generator = cfg, generator
        self.credit: torch.Tensor | None = None  # [B, block, V], allocated at the first step (V known)
        self.block = torch.full((rows,), -1, dtype=torch.long, device=device)  # block the credits belong to

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        c, rows, (_, W, V) = self.cfg, step.rows, step.logits.shape
        if self.credit is None:
            self.credit = step.logits.new_zeros((len(self.block), self.size, V))
        new = step.view.block != self.block[rows]
        self.credit[rows[new]] = 0.0
        self.block[rows] = step.view.block
        credit = credit_update(self.credit[rows, :W], step.logits, step.masked, c.beta, c.gamma)  # [B', W, V]
        self.credit[rows, :W] = credit
        x0, conf = propose(credit_fuse(step.logits, credit, c.alpha), step.masked, c.temperature, self.generator)
        return threshold(conf, c.threshold), x0


@register_dlm("dlm.credit", config=CreditConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: CreditConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """CreditDecoding: decayed trace credits (alpha 0.7, beta 0.8, gamma 0.2) fused into the logits, then threshold."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = Credit(model.mask_token_id, cfg, batch.size, model.device, generator)
    return denoise(model, batch, cfg, policy, generator, "dlm.credit", ctx.constraint)
