"""dlm.r2: R²-dLLM's training-free rules on top of the Fast-dLLM threshold (GATECH-EIC/R2-dLLM `llada/generate.py`).

After the threshold commit, three more rules run on the same forward, each on what is still masked:
1. spatial: every 3-position window holding at most 1 decoded token, whose masks average p >= 0.8, is
   committed whole;
2. token cluster: a run of adjacent masks predicting the same token commits one of them (the most
   confident, if above 0.8), so a repeated token is decoded once at a time;
3. temporal: a mask whose prediction stayed the same for 3 consecutive steps, last p >= 0.8, is finalised.
Defaults are the repository's eval script (temporal_eval=last).
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
from ..policy import BlockConfig, BlockPolicy, Step, columns, register_dlm
from ..rules import cluster_one, streaks, threshold, window_average


@dataclass(frozen=True)
class R2Config(BlockConfig):
    threshold: float = 0.9  # the base Fast-dLLM threshold rule
    window: int = 3  # spatial rule: window length (confidence_cluster_size)
    window_unmasked: int = 1  # ... most decoded tokens a window may hold
    window_threshold: float = 0.8  # ... mean confidence of its masks (spatial_threshold); also the cluster rule's
    stable_steps: int = 3  # temporal rule: consecutive steps with the same prediction (temporal_steps)
    stable_threshold: float = 0.8  # ... and its last confidence (temporal_threshold)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("threshold", "window_threshold", "stable_threshold"):
            check(0 <= getattr(self, name) <= 1, name, getattr(self, name), "must be in [0, 1]")
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.window_unmasked >= 0, "window_unmasked", self.window_unmasked, "must be >= 0")
        check(self.stable_steps >= 1, "stable_steps", self.stable_steps, "must be at least 1")


class R2(BlockPolicy):
    def __init__(self, mask_id: int, cfg: R2Config, rows: int, device: torch.device) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.cfg = cfg
        self.token = torch.full((rows, cfg.max_new_tokens), -1, dtype=torch.long, device=device)  # streak's token
        self.count = torch.zeros(rows, cfg.max_new_tokens, dtype=torch.long, device=device)  # its length

    def select(self, step: Step) -> torch.Tensor:
        c, masked, conf, x0 = self.cfg, step.masked, step.conf, step.x0
        commit = threshold(conf, c.threshold)
        commit |= window_average(masked & ~commit, conf, step.inview, c.window, c.window_unmasked, c.window_threshold)
        commit |= cluster_one(masked & ~commit, x0, conf, c.window_threshold)
        rows, cols = step.rows[:, None], columns(step)
        token, count = streaks(self.token[rows, cols], self.count[rows, cols], x0, masked & ~commit)
        self.token[rows, cols] = torch.where(step.inview, token, self.token[rows, cols])
        self.count[rows, cols] = torch.where(step.inview, count, self.count[rows, cols])
        return commit | (masked & ~commit & (count >= c.stable_steps) & (conf >= c.stable_threshold))


@register_dlm("dlm.r2", config=R2Config)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: R2Config, ctx: RunContext) -> Iterator[StepEvent]:
    """R²-dLLM: threshold, then confident 3-windows whole, one per duplicate run, and 3-step-stable predictions."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, R2(model.mask_token_id, cfg, batch.size, model.device), generator, "dlm.r2",
                   ctx.constraint)
