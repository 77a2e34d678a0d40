"""dlm.threshold: Fast-dLLM's confidence-threshold parallel decoding (Wu et al., 2025; NVlabs/Fast-dLLM)."""

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
from ..policy import BlockConfig, BlockPolicy, Step, register_dlm
from ..rules import threshold


@dataclass(frozen=True)
class ThresholdConfig(BlockConfig):
    threshold: float = 0.9  # tau: commit every masked in-block position with p(x0) >= tau (Fast-dLLM's eval setting)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1] (1 commits one token per step)")


class Threshold(BlockPolicy):
    def __init__(self, mask_id: int, cfg: ThresholdConfig) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.tau = cfg.threshold

    def select(self, step: Step) -> torch.Tensor:
        return threshold(step.conf, self.tau)


@register_dlm("dlm.threshold", config=ThresholdConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: ThresholdConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Fast-dLLM threshold: commit every masked in-block position with confidence >= threshold, always the top-1."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, Threshold(model.mask_token_id, cfg), generator, "dlm.threshold", ctx.constraint)
