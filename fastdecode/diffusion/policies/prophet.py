"""dlm.prophet: LLaDA decoding with Prophet's early commit (pixeli99/Prophet `generate_earlyexit`).

Prophet watches the top-1 minus top-2 logit gap; once the answer is settled it "goes all-in" and fills
every remaining mask with its current prediction in one step. The released code averages the gap over
an answer slot pinned by forced tokens; with no such slot in general text, this averages it over all
remaining masks, so the commit happens once the whole rest of the canvas is that certain.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...sampling.samplers import make_generator
from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext, register
from ...types import PromptBatch, StepEvent
from ..driver import denoise
from ..policy import StepsConfig, Step, View, in_block, to_end
from ..rules import prophet_exit, select_topk
from ..scores import logit_gap
from .baseline import Schedule


@dataclass(frozen=True)
class ProphetConfig(StepsConfig):
    gap_early: float = 7.5  # mean top-2 logit gap that commits everything in the first third of the steps
    gap_mid: float = 5.0  # ... in the second third
    gap_late: float = 2.5  # ... afterwards

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("gap_early", "gap_mid", "gap_late"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")


class Prophet(Schedule):
    """LLaDA's top-k schedule in the block; the view runs to the end of the canvas so all-in can fill it."""

    def __init__(self, mask_id: int, cfg: ProphetConfig, rows: int, device: torch.device) -> None:
        super().__init__(mask_id, cfg.block_size, cfg.steps_per_block, rows, device)
        self.n, self.total = cfg.max_new_tokens, cfg.total_steps
        self.levels = (cfg.gap_early, cfg.gap_mid, cfg.gap_late)
        self.hi = torch.zeros(rows, dtype=torch.long, device=device)  # end of each row's block

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        v = super().view(gen, rows)
        self.hi[rows] = v.hi
        return to_end(v, self.n)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        block = step.conf.masked_fill(~in_block(step, self.hi[step.rows]), float("-inf"))
        commit = select_topk(block, self.count(step.rows))
        progress = torch.full(step.rows.shape, step.index / self.total, dtype=torch.float64, device=block.device)
        all_in = prophet_exit(logit_gap(step.logits), step.masked, progress, self.levels)  # [B']
        return torch.where(all_in[:, None], step.masked, commit), step.x0


@register("dlm.prophet", kind="diffusion", config=ProphetConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: ProphetConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Prophet: LLaDA top-k steps until the mean top-2 logit gap passes 7.5/5.0/2.5 by progress, then fill all masks."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = Prophet(model.mask_token_id, cfg, batch.size, model.device)
    return denoise(model, batch, cfg, policy, generator, "dlm.prophet")
