"""spec.pld: prompt lookup decoding (Saxena 2023), the drafts are copied from the context itself."""

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
class PromptLookupConfig(SpecConfig):
    max_ngram: int = 3  # trailing n-gram sizes tried, max_ngram down to 1 (Spec-Bench's PLD setting)
    num_tokens: int = 10  # tokens copied after the match

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_ngram >= 1, "max_ngram", self.max_ngram, "must be at least 1")
        check(self.num_tokens >= 1, "num_tokens", self.num_tokens, "must be at least 1")


class PromptLookup(BaseDrafter):
    """Copies what followed the leftmost earlier occurrence of the trailing n-gram; no model, no state."""

    def __init__(self, cfg: PromptLookupConfig) -> None:
        self.cfg = cfg

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        return Draft(longest_match(context, 1, self.cfg.max_ngram, min(k, self.cfg.num_tokens)))


@register_spec("spec.pld", config=PromptLookupConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: PromptLookupConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Prompt lookup decoding: copy the tokens that followed the last n-gram's earlier occurrence (3 -> 1, 10
    tokens)."""
    return speculative(model, batch, cfg, ctx, lambda generator: PromptLookup(cfg))
