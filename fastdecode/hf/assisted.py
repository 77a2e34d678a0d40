"""hf.assisted: transformers' assisted generation (speculative decoding), `generate(assistant_model=draft)`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..config import MethodConfig, check
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .driver import check_assisted, check_sliding_assistant, hf_driver


@dataclass(frozen=True)
class AssistedConfig(MethodConfig):
    """transformers' defaults; they are set on the assistant's generation config for the run only."""

    num_assistant_tokens: int = 20
    num_assistant_tokens_schedule: Literal["constant", "heuristic", "heuristic_transient"] = "constant"
    assistant_confidence_threshold: float = 0.4  # drafting stops early below this confidence; 0 = off

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_assistant_tokens >= 1, "num_assistant_tokens", self.num_assistant_tokens, "must be at least 1")
        check(0 <= self.assistant_confidence_threshold < 1, "assistant_confidence_threshold",
              self.assistant_confidence_threshold, "must be in [0, 1)")


@register("hf.assisted", kind="causal", config=AssistedConfig, lossless=True, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: AssistedConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """transformers assisted generation with a draft model (needs draft=), greedy (reference)."""
    check_assisted(model, "hf.assisted", "target")
    check_assisted(ctx.draft, "hf.assisted", "draft model")
    check_sliding_assistant(ctx.draft, "hf.assisted")
    return _run(model, batch, cfg, ctx.draft, ctx.constraint)


def _run(model: CausalLM, batch: PromptBatch, cfg: AssistedConfig, draft: CausalLM,
         constraint: Any = None) -> Iterator[StepEvent]:
    gen = draft.model.generation_config
    settings = {
        "num_assistant_tokens": cfg.num_assistant_tokens,
        "num_assistant_tokens_schedule": cfg.num_assistant_tokens_schedule,
        "assistant_confidence_threshold": cfg.assistant_confidence_threshold,
    }
    saved = {k: getattr(gen, k, None) for k in settings}
    for k, v in settings.items():
        setattr(gen, k, v)
    try:
        yield from hf_driver(model, batch, {"max_new_tokens": cfg.max_new_tokens}, assistant=draft.model,
                             constraint=constraint)
    finally:
        for k, old in saved.items():
            setattr(gen, k, old)
