"""The autoregressive drafting loop shared by the chain drafters that run a causal model token by token with
their own KV cache (spec.draft_model with a separate draft model, spec.layerskip with the target minus some
layers), and their token pick (spec.sparse_self too). The tree drafters that run a draft model share
`model_tree.py` instead."""

from __future__ import annotations

from typing import cast

import torch

from ..models.causal import CausalLM
from .drafter import BaseDrafter, Draft, SpecConfig, Verification
from .verify import target_distribution


def pick_token(
    logits: torch.Tensor, cfg: SpecConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain drafter's next token from its `[V]` logits: the argmax when greedy; when sampling, x ~ q with the
    target's processors applied, and q itself (verification needs it)."""
    if cfg.greedy:
        return logits.argmax(), None
    q = target_distribution(logits[None], cfg.temperature, cfg.top_k, cfg.top_p)[0]  # [V]
    return torch.multinomial(q, 1, generator=generator)[0], q


class ModelChainDrafter(BaseDrafter):
    """Drafts a chain with `model`, one forward per token, keeping the model's KV cache in step with the accepted
    context: `propose` feeds the context the cache has not seen, then each drafted token; `observe` drops the
    rejected drafts from the cache. Subclasses choose the draft length and wrap the loop (`draft_chain`)."""

    def __init__(
        self, model: CausalLM, cfg: SpecConfig, generator: torch.Generator | None, confidence_stop: float = 0.0
    ) -> None:
        self.model, self.cfg, self.generator = model, cfg, generator
        self.confidence_stop = confidence_stop  # end the draft after a token whose max-probability is below this
        self.eos = model.eos_token_ids
        self.cache = model.new_cache()
        self.forwards = 0
        self._base = 0  # context length at the last proposal
        self._drafted = 0

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        return self.draft_chain(context, k)

    def draft_chain(self, context: torch.Tensor, k: int) -> Draft:
        """At most k tokens after `context`; stops early at an end of text or an unsure token."""
        n = context.numel()
        device = self.model.device
        feed = context[self.cache.length :].to(device)  # context the cache has not seen (>= 1 token)
        pos = torch.arange(self.cache.length, n, device=device)
        tokens, probs = [], []
        for _ in range(k):
            logits = self.model.forward(feed[None], pos[None], self.cache, num_logits=1)[0, -1]  # [V]
            self.forwards += 1
            x, q = pick_token(logits, self.cfg, self.generator)
            tokens.append(x)
            probs.append(q)
            if int(x) in self.eos:  # nothing after an end of text can be emitted: drafting on would waste forwards
                break
            if self.confidence_stop and float(logits.softmax(-1).max()) < self.confidence_stop:
                break
            feed, pos = x.view(1), pos[-1:] + 1
        self._base, self._drafted = n, len(tokens)
        if not tokens:
            return Draft.empty()
        # [k, V]; pick_token gives q for every token (sampling) or for none (greedy)
        q = torch.stack(cast(list[torch.Tensor], probs)) if probs[0] is not None else None
        return Draft(torch.stack(tokens).cpu(), q)

    def observe(self, verification: Verification) -> None:
        if self._drafted == 0:
            return
        # the cache holds context + x_1..x_{m-1}; keep the context and the accepted drafts among them
        self.cache.crop(self._base + min(verification.accepted, self._drafted - 1))
