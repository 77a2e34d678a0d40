"""dlm.factor: Fast-dLLM's factor rule for parallel decoding (Wu et al., 2025; NVlabs/Fast-dLLM)."""

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
from ..driver import denoise
from ..policy import BlockConfig, BlockPolicy, Step, register_dlm
from ..rules import factor


@dataclass(frozen=True)
class FactorConfig(BlockConfig):
    factor: float = 1.0  # f: the n-th most confident passes when (n + 1)(1 - c(n)) <= f (Fast-dLLM's eval setting)
    rule: Literal["fast_dllm", "strict"] = "fast_dllm"  # fast_dllm: the reference's scan, which also commits the
    #   last candidate once every earlier one passed; strict: only the passing prefix, with < (fastdecode's earlier
    #   rule)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.factor > 0, "factor", self.factor, "must be > 0 (larger commits more per step)")
        check(self.rule in ("fast_dllm", "strict"), "rule", self.rule, "must be 'fast_dllm' or 'strict'")


class Factor(BlockPolicy):
    def __init__(self, mask_id: int, cfg: FactorConfig) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.f, self.rule = cfg.factor, cfg.rule

    def select(self, step: Step) -> torch.Tensor:
        return factor(step.conf, self.f, self.rule)


@register_dlm("dlm.factor", config=FactorConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: FactorConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Fast-dLLM factor rule: commit the n most confident with (n + 1)(1 - c(n)) <= f, at least one (and the last
    mask once all before it passed, as the reference does; `rule=strict` commits only the passing prefix)."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, Factor(model.mask_token_id, cfg), generator, "dlm.factor", ctx.constraint)
