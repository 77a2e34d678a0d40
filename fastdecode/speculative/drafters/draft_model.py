"""spec.draft_model: classic speculative decoding with a separate small draft model (Leviathan et al. 2023;
Chen et al. 2023), transformers' draft-length heuristic, and a SpecDec++-style confidence stop."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext, register
from ...types import PromptBatch, StepEvent
from ..driver import BaseDrafter, Draft, SpecConfig, check_rollback, speculative
from ..verification import Verification
from ..verify import target_distribution


@dataclass(frozen=True)
class DraftModelConfig(SpecConfig):
    num_draft_tokens: int = 5  # draft length (the starting length under the heuristic schedule)
    schedule: Literal["constant", "heuristic"] = "constant"  # heuristic: +2 when all accepted, else -1 (min 1)
    confidence_stop: float = 0.0  # stop drafting after a token whose draft max-probability is below this; 0 = off

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_draft_tokens >= 1, "num_draft_tokens", self.num_draft_tokens, "must be at least 1")
        check(0 <= self.confidence_stop < 1, "confidence_stop", self.confidence_stop, "must be in [0, 1) (0 = off)")


def pick_token(logits: torch.Tensor, cfg: SpecConfig, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain drafter's next token from its `[V]` logits: the argmax when greedy; when sampling, x ~ q with the
    target's processors applied, and q itself (verification needs it)."""
    if cfg.greedy:
        return logits.argmax(), None
    q = target_distribution(logits[None], cfg.temperature, cfg.top_k, cfg.top_p)[0]  # [V]
    return torch.multinomial(q, 1, generator=generator)[0], q


class ModelDrafter(BaseDrafter):
    """Drafts autoregressively with the draft model, keeping its own KV cache in step with the accepted context."""

    def __init__(self, draft: CausalLM, cfg: DraftModelConfig, generator: torch.Generator | None) -> None:
        self.draft, self.cfg, self.generator = draft, cfg, generator
        self.eos = draft.eos_token_ids
        self.cache = draft.new_cache()
        self.length = cfg.num_draft_tokens  # current draft length (changes under the heuristic schedule)
        self.forwards = 0
        self._base = 0  # context length at the last proposal
        self._drafted = 0

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        k = min(k, self.length)
        n = context.numel()
        device = self.draft.device
        feed = context[self.cache.length :].to(device)  # context the draft cache has not seen (>= 1 token)
        pos = torch.arange(self.cache.length, n, device=device)
        tokens, probs = [], []
        for i in range(k):
            logits = self.draft.forward(feed[None], pos[None], self.cache, num_logits=1)[0, -1]  # [V]
            self.forwards += 1
            x, q = self._pick(logits)
            tokens.append(x)
            probs.append(q)
            if int(x) in self.eos:  # nothing after an end of text can be emitted: drafting on would waste forwards
                break
            if self.cfg.confidence_stop and float(logits.softmax(-1).max()) < self.cfg.confidence_stop:
                break
            feed, pos = x.view(1), pos[-1:] + 1
        self._base, self._drafted = n, len(tokens)
        if not tokens:
            return Draft.empty()
        q = torch.stack(probs) if probs[0] is not None else None  # [k, V]
        return Draft(torch.stack(tokens).cpu(), q)

    def _pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return pick_token(logits, self.cfg, self.generator)

    def observe(self, verification: Verification) -> None:
        accepted = verification.accepted
        if self._drafted == 0:
            return
        # the cache holds context + x_1..x_{m-1}; keep the context and the accepted drafts among them
        keep = self._base + min(accepted, self._drafted - 1)
        self.cache.trim(self.cache.length - keep)
        if self.cfg.schedule == "heuristic":
            self.length = self.length + 2 if accepted == self.length else max(1, self.length - 1)


@register("spec.draft_model", kind="causal", config=DraftModelConfig, lossless=True, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: DraftModelConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Speculative decoding with a small draft model (pass draft=); constant or heuristic length, confidence stop."""
    check_rollback(ctx.draft)
    return speculative(model, batch, cfg, ctx, lambda generator: ModelDrafter(ctx.draft, cfg, generator))
