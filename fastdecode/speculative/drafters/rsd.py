"""spec.rsd: Recursive Speculative Decoding with a constant branching factor per depth (RSD-C; Jeon et al. 2024,
"Recursive Speculative Decoding: Accelerating LLM Inference via Sampling Without Replacement", arXiv 2402.14160).

The draft model grows a tree level by level (one forward per depth for the whole level): under every node of
depth l - 1 it draws b_l distinct children WITHOUT replacement from its distribution q, by Gumbel-top-k. The
target verifies the tree in one forward by recursive rejection sampling adapted to without-replacement siblings
(`tree.verify_tree_rsd`). Greedy decoding takes the draft's top-b_l children instead and accepts the longest
path the target's argmax agrees with.
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
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import check_rollback, speculative
from ..model_tree import DraftModelTree
from ..verify import target_distribution

MAX_NODES = 512  # a larger tree would make one verification forward longer than any plausible gain


@dataclass(frozen=True)
class RSDConfig(SpecConfig):
    branches: str = "2,2,2,1,1"  # b_l per depth l: children drawn under each node of depth l - 1 (30 nodes, 5 deep)

    def __post_init__(self) -> None:
        super().__post_init__()
        widths = parse_branches(self.branches)
        nodes = sum(_level_sizes(widths))
        check(nodes <= MAX_NODES, "branches", self.branches,
              f"makes a tree of {nodes} nodes; keep it at most {MAX_NODES}")


def parse_branches(text: str) -> list[int]:
    try:
        widths = [int(x) for x in text.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise ParameterError(
            f"Parameter branches={text!r} is invalid: write one branching factor (>= 1) per depth, e.g. '2,2,2,1,1'."
        )
    return widths


def _level_sizes(widths: list[int]) -> list[int]:
    sizes, size = [], 1
    for b in widths:
        size *= b
        sizes.append(size)
    return sizes


def gumbel_top_k(q: torch.Tensor, k: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`[L, V]` distributions -> per row k distinct tokens `[L, k]` in the order of sampling without replacement, and
    which of them were drawn `[L, k]` (bool), where q is: nothing is read.

    Gumbel-top-k (Kool et al. 2019) in its exponential-race form: sorting q_v / E_v with E_v ~ Exp(1) orders tokens
    as log q_v + Gumbel_v does, and the top k are k sequential draws without replacement. A row with fewer than k
    tokens of positive probability draws all of them first; its last places hold tokens of probability 0, not drawn
    (the verification passes over them: `tree.verify_tree_rsd`).
    """
    e = torch.empty(q.shape, device=q.device, dtype=torch.float64).exponential_(generator=generator)  # [L, V]
    keys = q.double() / e.clamp(min=torch.finfo(torch.float64).tiny)  # q / E; tokens with q = 0 stay at 0
    top = keys.topk(min(k, q.shape[-1]), dim=-1)
    return top.indices, top.values > 0


class RSDDrafter(BaseDrafter):
    """Draws the RSD-C tree with the draft model, level by level; sampled drafts carry q for every node."""

    tree_drafts = True

    def __init__(self, draft: CausalLM, cfg: RSDConfig, generator: torch.Generator | None) -> None:
        self.tree = DraftModelTree(draft)
        self.cfg, self.generator = cfg, generator
        self.widths = parse_branches(cfg.branches)

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.tree.forwards

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        """The tree level by level, its shape fixed by the branching factors: its tokens (and q) stay where the draft
        model computed them, and the verification reads them with its verdict (one read a step on a GPU, issue #30).
        Greedy: the draft's top-b_l children under every node. Sampling: b_l draws without replacement from q, the
        draft's distribution under the target's processors (a row of q with fewer tokens of positive probability
        leaves its last children undrawn, `gumbel_top_k`); each node carries the q it was drawn from."""
        widths = self.widths[:k]
        logits = self.tree.start(context)[None]  # [1, V] q at the root
        tokens: list[torch.Tensor] = []  # each level's tokens, [size]
        probs: list[torch.Tensor] = []  # each level's q rows, [size, V] (sampling)
        parents: list[int] = []
        level = [-1]  # nodes whose children are drawn next; -1 is the root
        for depth, b in enumerate(widths):
            if self.cfg.greedy:
                picks = logits.topk(min(b, logits.shape[-1]), dim=-1).indices  # [len(level), b']
            else:
                q = target_distribution(logits, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)  # [L, V]
                picks, _ = gumbel_top_k(q, b, self.generator)
                probs.append(q[:, None].expand(-1, picks.shape[1], -1).reshape(picks.numel(), -1))
            first = sum(t.numel() for t in tokens)
            tokens.append(picks.reshape(-1))
            parents += [parent for parent in level for _ in range(picks.shape[1])]
            level = list(range(first, first + picks.numel()))
            if depth + 1 < len(widths):
                logits = self.tree.grow(torch.cat(tokens), parents, level)  # [len(level), V]
        return Draft(torch.cat(tokens), torch.cat(probs) if probs else None, parents=parents)


@register_spec("spec.rsd", config=RSDConfig, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: RSDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Recursive Speculative Decoding: a draft-model tree sampled without replacement (Gumbel-top-k), pass draft=."""
    check_rollback(ctx.draft)
    return speculative(model, batch, cfg, ctx, lambda generator: RSDDrafter(ctx.draft, cfg, generator))
