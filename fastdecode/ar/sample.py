"""ar.sample: ancestral sampling with temperature, top-k, top-p, min-p and repetition penalty."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..sampling.config import SamplingConfig
from ..sampling.history import History
from ..sampling.pipeline import LogitsPipeline
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent
from .driver import Picker, autoregressive


@dataclass(frozen=True)
class SampleConfig(SamplingConfig):
    """temperature, top_k, top_p, min_p, repetition_penalty and seed, as every spec.* method takes them."""


def make_picker(pipeline: LogitsPipeline, generator: torch.Generator | None = None) -> Picker:
    """The ar driver's picker: the pipeline on each row's logits, with the driver's seen mask as its history.

    The driver updates `seen` in place after every step; the History below shares its storage, so each call sees
    the row's prompt and every token generated so far. (Stateful processors need the driver to call
    `History.append`; none exists yet.)"""
    assert not pipeline.stateful, "the ar driver does not advance stateful processors yet"

    def pick(logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        at = History(seen).rows() if pipeline.uses_history else None
        return pipeline.pick(logits, at, generator)

    return pick


@register("ar.sample", kind="causal", config=SampleConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: SampleConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Sampling with temperature, top-k, top-p, min-p and repetition penalty; seeded runs repeat."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return autoregressive(model, batch, cfg, make_picker(LogitsPipeline.from_config(cfg), generator))
