"""dlm.baseline: LLaDA's `generate` with low-confidence remasking, the reference for every `dlm.*` method."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ..ar.sample import make_generator
from ..config import MethodConfig, check
from ..models.diffusion import MaskedDiffusionLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .loop import denoise
from .scores import select_topk


@dataclass(frozen=True)
class BaselineConfig(MethodConfig):
    """`max_new_tokens` is LLaDA's gen_length: the number of masks on the canvas."""

    block_length: int | None = None  # None: one block, the whole canvas (pure diffusion); smaller: semi-AR
    steps: int | None = None  # forwards over the canvas; None: max_new_tokens (one token per step)
    temperature: float = 0.0  # 0: argmax; > 0: Gumbel-max sampling in float64
    remasking: Literal["low_confidence", "random"] = "low_confidence"  # what ranks masked positions
    seed: int | None = None  # None draws from torch's global RNG; a seed makes the run repeat

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.max_new_tokens
        if self.block_length is not None:
            divisors = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
            check(self.block_length >= 1 and n % self.block_length == 0, "block_length", self.block_length,
                  f"must divide max_new_tokens={n}: choose one of {divisors}, or None for a single block")
        if self.steps is not None:
            check(1 <= self.steps <= n, "steps", self.steps,
                  f"must be between 1 and max_new_tokens={n} (one token per step at most steps)")
            check(self.steps % self.num_blocks == 0, "steps", self.steps,
                  f"must be divisible by the number of blocks, {self.num_blocks} (= max_new_tokens / block_length), "
                  f"so every block gets the same number of steps")
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0 means argmax)")
        check(self.remasking in ("low_confidence", "random"), "remasking", self.remasking,
              "must be 'low_confidence' or 'random'")

    @property
    def block_size(self) -> int:
        return self.block_length or self.max_new_tokens

    @property
    def num_blocks(self) -> int:
        return self.max_new_tokens // self.block_size

    @property
    def steps_per_block(self) -> int:
        return (self.steps or self.max_new_tokens) // self.num_blocks


@register("dlm.baseline", kind="diffusion", config=BaselineConfig, lossless=True)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: BaselineConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """LLaDA decoding: each forward commits the k most confident masked positions of the block."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, select_topk, generator)
