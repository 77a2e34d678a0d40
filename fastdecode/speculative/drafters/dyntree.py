"""spec.dyntree: a dynamic draft tree grown by cumulative draft probability (EAGLE-2, Li et al. 2024, arXiv
2406.16858, `topK_genrate`; the same greedy-by-path-probability idea as DySpec, Xiong et al. 2024, arXiv
2410.11744), drafted with a separate draft model.

A node's score is the log of its path probability under the draft, sum of log q along the path. Depth by depth,
the `width` best nodes of the newest level (the beam) are fed to the draft model in one forward with a tree mask
and each gets its `width` likeliest children; after the last level every generated node is reranked and the
`total_tokens` best are kept. A child never scores above its parent, so the kept set is closed under ancestors.
The tree depends only on the context, so sampling verifies it with q one-hot (`tree.verify_tree_sampling`),
which is lossless; greedy accepts the longest path the target's argmax agrees with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import check_rollback, speculative
from ..model_tree import DraftModelTree

MAX_NODES = 512  # a larger tree would make one verification forward longer than any plausible gain


@dataclass(frozen=True)
class DynTreeConfig(SpecConfig):
    total_tokens: int = 60  # draft nodes kept after reranking (EAGLE-2's total_token)
    depth: int = 8  # most draft tokens on one path (EAGLE-2's depth=7 counts the expansions after level 1)
    width: int = 10  # EAGLE-2's top_k: nodes expanded per depth, and children drawn per expanded node

    def __post_init__(self) -> None:
        super().__post_init__()
        check(1 <= self.total_tokens <= MAX_NODES, "total_tokens", self.total_tokens, f"must be in [1, {MAX_NODES}]")
        check(self.depth >= 1, "depth", self.depth, "must be at least 1")
        check(self.width >= 1, "width", self.width, "must be at least 1")


@dataclass
class _Candidates:
    """Every node generated this step, in creation order (parents before children)."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]  # log path probability under the draft

    def add_children(self, beam: list[int], logits: torch.Tensor, width: int) -> list[int]:
        """Give each beam node (-1 = root) its `width` likeliest children; `logits` `[len(beam), V]`. Returns them."""
        logq = logits.float().log_softmax(-1)  # [B, V]
        top = logq.topk(min(width, logq.shape[-1]), dim=-1)
        new = []
        for parent, ids, lq in zip(beam, top.indices.tolist(), top.values.clamp(max=0.0).tolist(), strict=True):
            base = self.scores[parent] if parent >= 0 else 0.0
            for x, s in zip(ids, lq, strict=True):
                new.append(len(self.tokens))
                self.tokens.append(x)
                self.parents.append(parent)
                self.scores.append(base + s)  # <= the parent's score: clamp keeps rounding from breaking this
        return new

    def ranked(self, nodes: list[int]) -> list[int]:
        """Best score first; ties go to the node created first (so a parent ranks before its children)."""
        return sorted(nodes, key=lambda i: (-self.scores[i], i))


class DynTreeDrafter(BaseDrafter):
    """Grows EAGLE-2's tree with the draft model, one forward per depth; the tree is deterministic (no q)."""

    tree_drafts = True

    def __init__(self, draft: CausalLM, cfg: DynTreeConfig) -> None:
        self.tree = DraftModelTree(draft)
        self.cfg = cfg

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.tree.forwards

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        depth, width, total = min(self.cfg.depth, k), self.cfg.width, self.cfg.total_tokens
        nodes = _Candidates([], [], [])
        level = nodes.add_children([-1], self.tree.start(context)[None], width)
        for _ in range(depth - 1):
            beam = nodes.ranked(level)[:width]
            # children score at most the beam's best; once `total` nodes reach it, no new node could be kept
            best = nodes.scores[beam[0]]
            if sum(s >= best for s in nodes.scores) >= total:
                break
            level = nodes.add_children(beam, self.tree.grow(nodes.tokens, nodes.parents, beam), width)
        keep = sorted(nodes.ranked(list(range(len(nodes.tokens))))[:total])  # creation order: parents first
        index = {node: i for i, node in enumerate(keep)}
        parents = [index[nodes.parents[i]] if nodes.parents[i] >= 0 else -1 for i in keep]
        return Draft(torch.tensor([nodes.tokens[i] for i in keep], dtype=torch.long), parents=parents)


@register_spec("spec.dyntree", config=DynTreeConfig, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: DynTreeConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """EAGLE-2 / DySpec dynamic draft tree: a draft model's likeliest paths within a node budget, pass draft=."""
    check_rollback(ctx.draft)
    return speculative(model, batch, cfg, ctx, lambda generator: DynTreeDrafter(ctx.draft, cfg))
