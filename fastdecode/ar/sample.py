"""ar.sample: ancestral sampling with temperature, top-k, top-p, min-p and repetition penalty."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..attention import check_attention, make_selector
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..sampling.config import SamplingConfig
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent
from .driver import ar_session, autoregressive


@dataclass(frozen=True)
class SampleConfig(SamplingConfig):
    """temperature, top_k, top_p, min_p, repetition_penalty and seed, as every spec.* method takes them, and the
    attention: "dense" or a sparse rule ("quest", "quest:budget=128")."""

    attention: str = "dense"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_attention(self.attention)


@register("ar.sample", kind="causal", config=SampleConfig, session=ar_session)
def run(model: CausalLM, batch: PromptBatch, cfg: SampleConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Sampling with temperature, top-k, top-p, min-p and repetition penalty; seeded runs repeat."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return autoregressive(model, batch, cfg, generator, ctx.constraint, sparse=make_selector(cfg.attention, model))
