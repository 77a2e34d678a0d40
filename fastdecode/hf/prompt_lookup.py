"""hf.prompt_lookup: transformers' prompt-lookup decoding (Saxena 2023), `generate(prompt_lookup_num_tokens=k)`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..config import MethodConfig, check
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .driver import check_assisted, hf_driver


@dataclass(frozen=True)
class PromptLookupConfig(MethodConfig):
    num_tokens: int = 10  # prompt_lookup_num_tokens: tokens copied after an n-gram match (transformers' docs use 10)
    max_matching_ngram_size: int = 2  # transformers' default

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_tokens >= 1, "num_tokens", self.num_tokens, "must be at least 1")
        check(self.max_matching_ngram_size >= 1, "max_matching_ngram_size", self.max_matching_ngram_size,
              "must be at least 1")


@register("hf.prompt_lookup", kind="causal", config=PromptLookupConfig, lossless=True)
def run(model: CausalLM, batch: PromptBatch, cfg: PromptLookupConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """transformers prompt-lookup decoding: drafts copied from the context after an n-gram match (reference)."""
    check_assisted(model, "hf.prompt_lookup")
    return hf_driver(model, batch, {
        "max_new_tokens": cfg.max_new_tokens,
        "prompt_lookup_num_tokens": cfg.num_tokens,
        "max_matching_ngram_size": cfg.max_matching_ngram_size,
    }, constraint=ctx.constraint)
