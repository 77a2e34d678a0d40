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
from ...errors import ParameterError
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..best_first import BestFirst, stops_early
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import check_rollback, speculative
from ..model_tree import DraftModelTree

MAX_NODES = 512  # a larger tree would make one verification forward longer than any plausible gain


@dataclass(frozen=True)
class DynTreeConfig(SpecConfig):
    total_tokens: int = 60  # draft nodes kept after reranking (EAGLE-2's total_token)
    depth: int = 8  # most draft tokens on one path (EAGLE-2's depth=7 counts the expansions after level 1)
    width: int = 10  # EAGLE-2's top_k: nodes expanded per depth, and children drawn per expanded node
    # stop growing once no child could be kept (the same tree, fewer draft forwards; a read a level): None = on the
    # CPU only (best_first.stops_early)
    early_stop: bool | None = None
    # grow the whole tree in one captured graph (without the early stop; model_tree.DraftModelTree.best_first): None
    # = wherever the draft model runs CUDA graphs (or their capture-free replay), False = level by level
    graph: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(1 <= self.total_tokens <= MAX_NODES, "total_tokens", self.total_tokens, f"must be in [1, {MAX_NODES}]")
        check(self.depth >= 1, "depth", self.depth, "must be at least 1")
        check(self.width >= 1, "width", self.width, "must be at least 1")
        check(not (self.graph and self.early_stop), "graph", self.graph,
              "grows every level in one graph, which early_stop=true (a read a level) cannot: set one of them")


class DynTreeDrafter(BaseDrafter):
    """Grows EAGLE-2's tree with the draft model, one forward per depth; the tree is deterministic (no q)."""

    tree_drafts = True

    def __init__(self, draft: CausalLM, cfg: DynTreeConfig) -> None:
        if cfg.graph and draft.graphs is None:
            raise ParameterError("spec.dyntree:graph=true grows the tree in a CUDA graph of the draft model, which "
                                 "runs without graphs: load it with graphs (the default on CUDA in exact mode; "
                                 "graphs='replay' with exact=True elsewhere) or leave graph unset")
        self.tree = DraftModelTree(draft)
        self.cfg = cfg

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.tree.forwards

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        depth = min(self.cfg.depth, k)
        root = self.tree.start(context)
        graph = self.cfg.graph if self.cfg.graph is not None else not stops_early(self.cfg.early_stop, root.device)
        if graph:
            draft = self.tree.best_first(root, self.cfg.width, self.cfg.total_tokens, depth)
            if draft is not None:
                return draft
        nodes = BestFirst(self.cfg.width, self.cfg.total_tokens, root.device)
        nodes.add_children(root[None])
        nodes.grow(depth, lambda beam, d: (self.tree.feed(beam.tokens, beam.sees, d), None), self.cfg.early_stop)
        return nodes.draft()  # (on a device unread: the verdict reads it)


@register_spec("spec.dyntree", config=DynTreeConfig, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: DynTreeConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """EAGLE-2 / DySpec dynamic draft tree: a draft model's likeliest paths within a node budget, pass draft=."""
    check_rollback(ctx.draft)
    return speculative(model, batch, cfg, ctx, lambda generator: DynTreeDrafter(ctx.draft, cfg))
