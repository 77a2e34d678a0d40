"""dlm.threshold: Fast-dLLM's confidence-threshold parallel decoding (Wu et al., 2025; NVlabs/Fast-dLLM).

`fallback="schedule"` is Dimple's confident decoding (`diffusion/confident.py`): when no mask passes, the count
the block's step schedule asks for, not just the best one, and every mask at the block's last step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from ..confident import ConfidentSchedule
from ..driver import denoise
from ..policy import BlockConfig, BlockPolicy, Step, register_dlm
from ..rules import candidates, threshold


@dataclass(frozen=True)
class ThresholdConfig(BlockConfig):
    threshold: float = 0.9  # tau: commit every masked in-block position with p(x0) >= tau (Fast-dLLM's eval setting)
    fallback: Literal["top1", "schedule"] = "top1"  # when none passes: the best mask (Fast-dLLM), or Dimple's
    #   schedule count (confident decoding; Dimple's threshold is 0.95)
    block_steps: int | None = None  # fallback="schedule": the steps of a block's schedule (Dimple's `steps`, per
    #   block); the last commits every mask left. None: one per position of the block

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1] (1 commits one token per step)")
        check(self.fallback in ("top1", "schedule"), "fallback", self.fallback,
              "must be 'top1' (Fast-dLLM) or 'schedule' (Dimple's confident decoding)")
        if self.block_steps is not None:
            check(self.fallback == "schedule", "block_steps", self.block_steps,
                  "only applies with fallback='schedule' (it sets that schedule's steps per block)")
            check(self.block_steps >= 1, "block_steps", self.block_steps, "must be at least 1")


class Threshold(BlockPolicy):
    def __init__(self, mask_id: int, cfg: ThresholdConfig, rows: int = 1, device: torch.device | None = None) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.tau = cfg.threshold
        self.schedule = None
        if cfg.fallback == "schedule":
            self.schedule = ConfidentSchedule(rows, cfg.block_steps or cfg.block_size, device or torch.device("cpu"))

    def select(self, step: Step) -> torch.Tensor:
        if self.schedule is None:
            return threshold(step.conf, self.tau)
        passed = candidates(step.conf) & (step.conf >= self.tau)
        return self.schedule.commit(step.rows, step.view.block, step.masked, step.conf, passed)


@register_dlm("dlm.threshold", config=ThresholdConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: ThresholdConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Fast-dLLM threshold: commit every masked in-block position with confidence >= threshold, always the top-1."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = Threshold(model.mask_token_id, cfg, batch.size, model.device)
    return denoise(model, batch, cfg, policy, generator, "dlm.threshold", ctx.constraint)
