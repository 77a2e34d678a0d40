"""spec.ngram: vLLM's n-gram proposer, the longest trailing n-gram (min_n..max_n) found earlier in the context."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import speculative
from ..lookup import longest_match


@dataclass(frozen=True)
class NgramConfig(SpecConfig):
    min_n: int = 1  # shortest n-gram that may match (vLLM prompt_lookup_min)
    max_n: int = 5  # longest n-gram tried (vLLM's default prompt_lookup_max)
    num_tokens: int = 5  # k, tokens proposed after the match (vLLM num_speculative_tokens)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.min_n >= 1, "min_n", self.min_n, "must be at least 1")
        check(self.max_n >= self.min_n, "max_n", self.max_n, f"must be >= min_n ({self.min_n})")
        check(self.num_tokens >= 1, "num_tokens", self.num_tokens, "must be at least 1")


class NgramLookup(BaseDrafter):
    """Proposes the k tokens after the leftmost occurrence of the longest matching suffix; no model, no state."""

    def __init__(self, cfg: NgramConfig) -> None:
        self.cfg = cfg

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        return Draft(longest_match(context, self.cfg.min_n, self.cfg.max_n, min(k, self.cfg.num_tokens)))


@register_spec("spec.ngram", config=NgramConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: NgramConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """n-gram speculation (vLLM-style): k tokens after the longest earlier match of the context's suffix."""
    return speculative(model, batch, cfg, ctx, lambda generator: NgramLookup(cfg))
