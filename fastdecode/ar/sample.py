"""ar.sample: ancestral sampling with temperature, top-k, top-p, min-p and repetition penalty."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .. import sampling
from ..config import check
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..sampling.config import SamplingConfig
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent
from .driver import autoregressive


@dataclass(frozen=True)
class SampleConfig(SamplingConfig):
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.min_p < 1, "min_p", self.min_p, "must be in [0, 1)")
        check(self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "must be > 0 (1 = off)")


def make_picker(cfg: SampleConfig, generator: torch.Generator | None):
    def pick(logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        logits = sampling.repetition_penalty(logits, seen, cfg.repetition_penalty)
        if cfg.temperature == 0:
            return sampling.greedy(logits)
        logits = sampling.temperature(logits, cfg.temperature)
        logits = sampling.top_k(logits, cfg.top_k)
        logits = sampling.top_p(logits, cfg.top_p)
        logits = sampling.min_p(logits, cfg.min_p)
        return sampling.sample(logits, generator)

    return pick


@register("ar.sample", kind="causal", config=SampleConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: SampleConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Sampling with temperature, top-k, top-p, min-p and repetition penalty; seeded runs repeat."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return autoregressive(model, batch, cfg, make_picker(cfg, generator))
