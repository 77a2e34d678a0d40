"""hf.greedy: transformers' `model.generate(do_sample=False)`, the reference users would otherwise run."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import MethodConfig
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .driver import hf_driver


@register("hf.greedy", kind="causal", config=MethodConfig, lossless=True)
def run(model: CausalLM, batch: PromptBatch, cfg: MethodConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """transformers generate(do_sample=False), one prompt at a time (reference)."""
    return hf_driver(model, batch, {"max_new_tokens": cfg.max_new_tokens}, constraint=ctx.constraint)
