"""dlm.baseline: LLaDA's `generate` with low-confidence remasking, the reference for every `dlm.*` method."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from ...sampling.samplers import make_generator
from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext, register
from ...types import PromptBatch, StepEvent
from ..driver import denoise
from ..policy import StepsConfig, Step, View, block_view
from ..rules import select_topk
from ..scores import num_transfer_tokens, random_score


@dataclass(frozen=True)
class BaselineConfig(StepsConfig):
    """LLaDA's settings: `steps` forwards over the canvas, split evenly over its blocks."""

    block_length: int | None = None  # None: one block, the whole canvas (pure diffusion); smaller: semi-AR
    remasking: Literal["low_confidence", "random"] = "low_confidence"  # what ranks masked positions

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.remasking in ("low_confidence", "random"), "remasking", self.remasking,
              "must be 'low_confidence' or 'random'")

    def check_block_length(self, block_length: int) -> None:
        n = self.max_new_tokens
        divisors = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
        check(block_length >= 1 and n % block_length == 0, "block_length", block_length,
              f"must divide max_new_tokens={n}: choose one of {divisors}, or None for a single block")


class Schedule:
    """LLaDA's fixed schedule: at a block's first step its masks are split evenly over `steps` steps
    (`get_num_transfer_tokens`); step t of the block commits the top k[t] positions by score."""

    def __init__(self, mask_id: int, size: int, steps: int, rows: int, device: torch.device) -> None:
        self.mask_id, self.size, self.steps = mask_id, size, steps
        self.block = torch.full((rows,), -1, dtype=torch.long, device=device)  # block each row is in
        self.t = torch.zeros(rows, dtype=torch.long, device=device)  # steps taken in it
        self.k = torch.zeros(rows, steps, dtype=torch.long, device=device)  # its schedule

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        v = block_view(gen, self.mask_id, self.size)
        new = v.block != self.block[rows]
        if new.any():
            r, cols = rows[new], torch.arange(gen.shape[1], device=gen.device)
            inside = (cols >= v.lo[new, None]) & (cols < v.hi[new, None])
            self.block[r], self.t[r] = v.block[new], 0
            self.k[r] = num_transfer_tokens(((gen[new] == self.mask_id) & inside).sum(-1), self.steps)
        return v

    def count(self, rows: torch.Tensor) -> torch.Tensor:
        """`[B']` this step's k (at least 1), advancing the rows' step counters."""
        k = self.k[rows, self.t[rows].clamp(max=self.steps - 1)].clamp(min=1)
        self.t[rows] += 1
        return k


class LowConfidence(Schedule):
    def __init__(self, cfg: BaselineConfig, mask_id: int, rows: int, device: torch.device,
                 generator: torch.Generator | None) -> None:
        super().__init__(mask_id, cfg.block_size, cfg.steps_per_block, rows, device)
        self.random, self.generator = cfg.remasking == "random", generator

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        score = step.conf
        if self.random:
            score = step.score(random_score(step.conf.shape, self.generator, step.conf.device))
        return select_topk(score, self.count(step.rows)), step.x0


@register("dlm.baseline", kind="diffusion", config=BaselineConfig, lossless=True)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: BaselineConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """LLaDA decoding: each forward commits the k most confident masked positions of the block."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = LowConfidence(cfg, model.mask_token_id, batch.size, model.device, generator)
    return denoise(model, batch, cfg, policy, generator, "dlm.baseline")
