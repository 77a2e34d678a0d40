"""llamacpp.prompt_lookup: llama-cpp-python's prompt-lookup decoding (LlamaPromptLookupDecoding) drafting."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..config import MethodConfig, check
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .convert import check_convertible
from .driver import llamacpp_driver
from .greedy import NO_CONSTRAINT, REQUIRES


@dataclass(frozen=True)
class LlamaLookupConfig(MethodConfig):
    num_pred_tokens: int = 10  # tokens copied after an n-gram match (llama-cpp-python's default)
    max_ngram_size: int = 2  # longest n-gram matched (its default)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_pred_tokens >= 1, "num_pred_tokens", self.num_pred_tokens, "must be at least 1")
        check(self.max_ngram_size >= 1, "max_ngram_size", self.max_ngram_size, "must be at least 1")


@register("llamacpp.prompt_lookup", kind="causal", config=LlamaLookupConfig, requires=REQUIRES,
          constraints=NO_CONSTRAINT)
def run(model: CausalLM, batch: PromptBatch, cfg: LlamaLookupConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """llama.cpp with prompt-lookup drafts verified in one forward (reference; optional extra)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    check_convertible(model)
    draft = LlamaPromptLookupDecoding(max_ngram_size=cfg.max_ngram_size, num_pred_tokens=cfg.num_pred_tokens)
    return llamacpp_driver(model, batch, cfg.max_new_tokens, draft=draft, draft_len=cfg.num_pred_tokens,
                           should_stop=ctx.should_stop)
