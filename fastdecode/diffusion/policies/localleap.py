"""dlm.localleap: LocalLeap, Fast-dLLM's threshold relaxed next to confident anchors (friedrichor/LocalLeap)."""

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
from ..rules import local_leap


@dataclass(frozen=True)
class LocalLeapConfig(BlockConfig):
    threshold: float = 0.9  # tau: anchors are masked positions with p(x0) >= tau
    radius: int = 4  # positions within this distance of an anchor ...
    relaxed_threshold: float = 0.75  # ... need only tau_r

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1]")
        check(self.radius >= 0, "radius", self.radius, "must be >= 0")
        check(0 <= self.relaxed_threshold <= self.threshold, "relaxed_threshold", self.relaxed_threshold,
              f"must be in [0, threshold={self.threshold}]")


class LocalLeap(BlockPolicy):
    def __init__(self, mask_id: int, cfg: LocalLeapConfig) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.cfg = cfg

    def select(self, step: Step) -> torch.Tensor:
        c = self.cfg
        return local_leap(step.conf, c.threshold, c.radius, c.relaxed_threshold)


@register_dlm("dlm.localleap", config=LocalLeapConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: LocalLeapConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """LocalLeap: anchors at p >= threshold; masked positions within `radius` of one commit at relaxed_threshold."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, LocalLeap(model.mask_token_id, cfg), generator, "dlm.localleap", ctx.constraint)
