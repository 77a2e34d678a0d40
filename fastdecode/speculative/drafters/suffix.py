"""spec.suffix: SuffixDecoding (Oliaro et al. 2024), drafts from suffix trees over this request's prompt and
output and over earlier requests' outputs, with a draft length that grows with the match length."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import speculative
from ..memory import DrafterMemory, learns_across_requests, run_memory
from ..suffix_tree import SuffixTree, best_draft


@dataclass(frozen=True)
class SuffixConfig(SpecConfig):
    max_depth: int = 24  # longest substring the trees hold (vLLM suffix_decoding_max_tree_depth)
    max_spec_factor: float = 1.0  # a match of m tokens drafts at most floor(m * factor + offset) tokens
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1  # stop the draft when its path probability falls below this
    max_cached_requests: int = 10000  # outputs kept in the per-model global tree (FIFO; vLLM's default); 0 = this
    #   request only
    tree: bool = False  # draft a tree grown best-first by path probability (the paper's tree mode), not a chain

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_depth >= 2, "max_depth", self.max_depth, "must be at least 2")
        check(self.max_spec_factor >= 0, "max_spec_factor", self.max_spec_factor, "must be >= 0")
        check(0 <= self.min_token_prob <= 1, "min_token_prob", self.min_token_prob, "must be in [0, 1]")
        check(self.max_cached_requests >= 0, "max_cached_requests", self.max_cached_requests, "must be >= 0")


_request_ids = itertools.count()


def global_tree(memory: DrafterMemory, max_depth: int) -> SuffixTree:
    """The global tree of a run's memory (by default its target model's), one per max_depth: outputs of earlier
    requests, shared by every run with that memory and depth (a run with another depth neither reads nor clears it)."""
    return memory.get(("spec.suffix", max_depth), lambda: SuffixTree(max_depth))


class SuffixDrafter(BaseDrafter):
    """Per-request tree over prompt + output; global tree over outputs; the higher-scoring draft wins."""

    def __init__(self, cfg: SuffixConfig, shared: SuffixTree | None) -> None:
        self.cfg = cfg
        self.tree_drafts = cfg.tree
        self.local = SuffixTree(cfg.max_depth)
        self.shared = shared
        self.request = next(_request_ids)
        self.prompt_len: int | None = None
        self.seen = 0  # context tokens already added to the trees

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        self._add(context)
        cfg = self.cfg
        args = (k, cfg.max_spec_factor, cfg.max_spec_offset, cfg.min_token_prob, cfg.tree)
        n = context.numel()  # as Arctic, never the whole context as the match
        local = self.local
        draft = best_draft(local, [node for node in local.suffix_nodes(0) if local.depth[node] < n], *args)
        if self.shared is not None and len(self.shared):
            other = best_draft(self.shared, self.shared.match(context[-cfg.max_depth :].tolist()), *args)
            draft = other if other.score > draft.score else draft  # the request's own tree wins ties
        return Draft(torch.tensor(draft.tokens, dtype=torch.long), parents=draft.parents)

    def finish(self, context: torch.Tensor) -> None:
        self._add(context)

    def _add(self, context: torch.Tensor) -> None:
        if self.prompt_len is None:
            self.prompt_len = context.numel()  # the first proposal sees exactly the prompt
        new = context[self.seen :].tolist()
        self.local.extend(0, new)
        output = context[max(self.seen, self.prompt_len) :].tolist()
        self.seen = context.numel()
        if self.shared is not None and output:
            self.shared.extend(self.request, output)
            while len(self.shared) > self.cfg.max_cached_requests:
                oldest = self.shared.oldest()
                assert oldest is not None  # the tree holds more requests than the cap, so at least one
                self.shared.remove(oldest)


@register_spec("spec.suffix", config=SuffixConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: SuffixConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """SuffixDecoding: frequency-scored drafts from suffix trees over the prompt, the output and earlier outputs."""
    # a seeded sampled run drafts from its own request only, so that its seed repeats (`learns_across_requests`)
    learns = cfg.max_cached_requests and learns_across_requests(cfg, ctx.generator)
    shared = global_tree(run_memory(ctx, model), cfg.max_depth) if learns else None
    return speculative(model, batch, cfg, ctx, lambda generator: SuffixDrafter(cfg, shared))
