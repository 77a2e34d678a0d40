"""spec.draft_model: classic speculative decoding with a separate small draft model (Leviathan et al. 2023;
Chen et al. 2023), transformers' draft-length heuristic, and a SpecDec++-style confidence stop, fixed or adapted
during the generation as transformers adapts it (`adaptive_stop`, `adaptive_stop.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..adaptive_stop import AdaptiveStop
from ..drafter import Draft, SpecConfig, Verification, register_spec
from ..driver import check_rollback, speculative
from ..model_chain import ModelChainDrafter


@dataclass(frozen=True)
class DraftModelConfig(SpecConfig):
    num_draft_tokens: int = 5  # draft length (the starting length under the heuristic schedule)
    schedule: Literal["constant", "heuristic"] = "constant"  # heuristic: +2 when all accepted, else -1 (min 1)
    confidence_stop: float = 0.0  # stop drafting after a token whose draft max-probability is below this; 0 = off
    # re-choose confidence_stop after each verification from the generation's drafts (transformers' rule where
    # scikit-learn is installed, which hf.assisted follows there: hf.assisted's adaptive_threshold)
    adaptive_stop: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_draft_tokens >= 1, "num_draft_tokens", self.num_draft_tokens, "must be at least 1")
        check(0 <= self.confidence_stop < 1, "confidence_stop", self.confidence_stop, "must be in [0, 1) (0 = off)")
        check(not self.adaptive_stop or self.confidence_stop > 0, "adaptive_stop", self.adaptive_stop,
              "adapts the confidence stop's threshold, so it needs one to start from: add confidence_stop=0.4 "
              "(transformers' default)")


class ModelDrafter(ModelChainDrafter):
    """Drafts autoregressively with the draft model, keeping its own KV cache in step with the accepted context."""

    cfg: DraftModelConfig

    def __init__(self, draft: CausalLM, cfg: DraftModelConfig, generator: torch.Generator | None) -> None:
        super().__init__(draft, cfg, generator, cfg.confidence_stop)
        self.length = cfg.num_draft_tokens  # current draft length (changes under the heuristic schedule)
        self.adaptive = AdaptiveStop(cfg.confidence_stop) if cfg.adaptive_stop else None

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        return self.draft_chain(context, min(k, self.length))

    def observe(self, verification: Verification) -> None:
        super().observe(verification)
        if self._drafted and self.cfg.schedule == "heuristic":
            self.length = self.length + 2 if verification.accepted == self.length else max(1, self.length - 1)
        if self.adaptive is not None:
            self.confidence_stop = self.adaptive.update(self.confidences, verification.accepted)


@register_spec("spec.draft_model", config=DraftModelConfig, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: DraftModelConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Speculative decoding with a draft model (pass draft=); length schedule, fixed or adaptive confidence stop."""
    check_rollback(ctx.draft)
    return speculative(model, batch, cfg, ctx, lambda generator: ModelDrafter(ctx.draft, cfg, generator))
