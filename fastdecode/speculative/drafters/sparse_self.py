"""spec.sparse_self: sparse self-speculation (MagicDec, TriForce, LongSpec). The target itself, reading only a
budget of its KV cache per head (any `sparse.*` rule), drafts a chain; the same target with dense attention
verifies it in one forward. Lossless: every kept cache entry is written by a dense verification forward, and the
verification decides every emitted token (equals ar.greedy at temperature 0, ar.sample's distribution above).

The drafter shares the target's cache instead of keeping its own (no second copy of a long context, no second
prefill): it writes its draft entries after the accepted context and removes them again before the verification
forward rewrites those columns densely. The first step drafts nothing, so the prompt is prefilled once, densely.

The drafts' rule watches the target's dense forwards on the shared cache (`Watch`, returned by `bind`): it sees each
layer's queries and keys there but selects nothing. So a rule that chooses from the prefill (SnapKV's observation
window) chooses from the prompt's prefill, which the verification forward runs, and a rule that summarises keys
(Quest's page bounds) keeps its summaries current; without it SnapKV never saw a prefill and drafted densely.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch

from ...attention import Plan, Selection, SparseSelector, make_selector
from ...cache import DynamicKVCache, KVCache
from ...config import check
from ...models.capabilities import check_sparse_attention
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import check_rollback, speculative
from ..model_chain import pick_token, reads_each_token


@dataclass(frozen=True)
class SparseSelfConfig(SpecConfig):
    rule: str = "quest"  # the drafts' sparse rule, optionally with its own parameters: "quest:page=32"
    budget: int = 256  # cached columns per head a draft step reads
    sinks: int = 4
    recent: int = 32
    draft_tokens: int = 4  # chain length per step

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.draft_tokens >= 1, "draft_tokens", self.draft_tokens, "must be at least 1")
        check(not self.rule.startswith("dense"), "rule", self.rule, "must be a sparse rule (dense drafts are the "
              "target itself: nothing to gain)")
        make_selector(self.rule, None, budget=self.budget, sinks=self.sinks, recent=self.recent)


class Watch:
    """The drafts' rule in the target's verification forwards: every layer's queries and keys go to its `observe`
    (SnapKV scores the prompt there at the prefill), and every layer attends densely (the verification is exact)."""

    def __init__(self, selector: Any) -> None:
        self.selector = selector  # a `sparse.base.Selector`

    def begin(self, cache: Any, plan: Plan) -> None:
        self.selector.begin(cache, plan)  # the rule keeps to this cache (a new one would reset what it learnt)
        plan.sparse = self

    def select(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> Selection | None:
        self.selector.observe(layer, q, k, mask)
        return None


class SparseSelfDrafter(BaseDrafter):
    shares_target_cache = True
    # whether the draft reads each token as it comes (`reads_each_token`): None = on the CPU only; tests set
    # False to run the GPU's path on the CPU
    read_each_token: bool | None = None

    def __init__(self, model: CausalLM, cfg: SparseSelfConfig, generator: torch.Generator | None) -> None:
        self.model, self.cfg, self.generator = model, cfg, generator
        self.eos = model.eos_token_ids
        self.selector = make_selector(cfg.rule, model, budget=cfg.budget, sinks=cfg.sinks, recent=cfg.recent)
        self.cache: KVCache | DynamicKVCache | None = None
        self.forwards = 0

    def bind(self, cache: KVCache | DynamicKVCache) -> SparseSelector | None:
        """The target's cache of this row (set by the speculative driver before the first step); returns the watcher
        of the target's dense forwards on it."""
        self.cache = cache
        return Watch(self.selector)

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        assert self.cache is not None, "the speculative driver binds the target's cache first"
        base = self.cache.length
        n = context.numel()
        if n - base > 1 or k < 1:  # the prompt (or a gap): the verification forward prefills it, densely
            return Draft.empty()
        device = self.model.device
        feed = context[base:].to(device)
        pos = torch.arange(base, n, device=device)
        # on a GPU the drafts stay unread on the device, as a draft model's chain's (`reads_each_token`)
        each = reads_each_token(self.read_each_token, device)
        tokens, probs = [], []
        try:
            for _ in range(min(k, self.cfg.draft_tokens)):
                logits = self.model.forward(feed[None], pos[None], self.cache, num_logits=1,
                                            sparse=self.selector)[0, -1]
                self.forwards += 1
                x, q = pick_token(logits, self.cfg, self.generator)
                tokens.append(x)
                probs.append(q)
                if each and int(x) in self.eos:
                    break
                feed, pos = x.view(1), pos[-1:] + 1
        finally:
            self.cache.crop(base)  # the verification forward writes these columns again, densely
        q_all = torch.stack(cast(list[torch.Tensor], probs)) if probs[0] is not None else None
        drafted = torch.stack(tokens)
        return Draft(drafted.cpu() if each else drafted, q_all)


# joins=False: its drafter runs the target on the target's own cache, row by row, so rows cannot join a running batch
@register_spec("spec.sparse_self", config=SparseSelfConfig, joins=False)
def run(model: CausalLM, batch: PromptBatch, cfg: SparseSelfConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Sparse self-speculation: the target with sparse attention drafts, the dense target verifies."""
    check_rollback(model)  # a recurrent model is refused for that first
    check_sparse_attention(model)
    return speculative(model, batch, cfg, ctx, lambda g: SparseSelfDrafter(model, cfg, g))
