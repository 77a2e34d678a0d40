"""spec.lookahead: Lookahead decoding (Fu et al. 2024), a Jacobi window that rides on every verification
forward harvests n-grams into a pool; n-grams that start with the last token are verified as a tree.

The window has up to N - 1 levels of W guessed tokens; level j, column i sits j + i + 1 positions after the
last context token and sees the context, level 0 before column i and its own column below it, so each column
is one Jacobi trajectory. The argmax at the top level is the next level; once N - 1 levels exist, every column
with its new token is an N-gram: the pool keeps up to G of them per first token (least recently used dropped),
and the oldest level is discarded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext, register
from ...types import PromptBatch, StepEvent
from ..driver import BaseDrafter, Draft, Side, SpecConfig, speculative
from ..verification import Verification


@dataclass(frozen=True)
class LookaheadConfig(SpecConfig):
    ngram: int = 5  # N, the n-gram size (window levels + 1)
    window: int = 7  # W, Jacobi columns
    guesses: int = 7  # G, n-grams kept per first token and verified per step

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.ngram >= 2, "ngram", self.ngram, "must be at least 2")
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.guesses >= 1, "guesses", self.guesses, "must be at least 1")


def window_layout(levels: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets `[L*W]` and attention `[L*W, L*W]` of a window stored level by level (index j * W + i)."""
    j = torch.arange(levels).repeat_interleave(width)  # [S] level
    i = torch.arange(width).repeat(levels)  # [S] column
    offsets = j + i + 1
    same_column_below = (i[:, None] == i[None, :]) & (j[None, :] <= j[:, None])
    earlier_level0 = (j[None, :] == 0) & (i[None, :] < i[:, None])
    return offsets, same_column_below | earlier_level0


def candidate_tree(ngrams: list[tuple[int, ...]], depth: int) -> tuple[list[int], list[int]]:
    """Merge n-grams (each truncated to `depth`) into a token tree with distinct siblings."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for gram in ngrams:
        above = -1
        for t in gram[:depth]:
            node = index.get((above, t))
            if node is None:
                node = index[(above, t)] = len(tokens)
                tokens.append(t)
                parents.append(above)
            above = node
    return tokens, parents


class LookaheadDrafter(BaseDrafter):
    tree_drafts = True

    def __init__(self, cfg: LookaheadConfig) -> None:
        self.cfg = cfg
        self.levels: list[list[int]] = []
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self._tree_size = 0

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        cfg = self.cfg
        if not self.levels:  # level 0 starts as tokens drawn from the context, as the reference does
            g = torch.Generator().manual_seed(context.numel())
            self.levels = [context[torch.randint(context.numel(), (cfg.window,), generator=g)].tolist()]
        grams = list(self.pool.get(int(context[-1]), {}))
        tokens, parents = candidate_tree(grams[::-1], k)  # most recently used first
        self._tree_size = len(tokens)
        offsets, mask = window_layout(len(self.levels), cfg.window)
        side = Side(torch.tensor(sum(self.levels, []), dtype=torch.long), offsets, mask)
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=parents, side=side)

    def observe(self, verification: Verification) -> None:
        cfg = self.cfg
        top = (len(self.levels) - 1) * cfg.window  # first side token of the top level
        new = verification.side_logits[top : top + cfg.window].argmax(-1).tolist()  # [W]
        if len(self.levels) == cfg.ngram - 1:
            for i in range(cfg.window):
                self._remember([level[i] for level in self.levels] + [new[i]])
            self.levels.pop(0)
        self.levels.append(new)

    def _remember(self, gram: list[int]) -> None:
        grams = self.pool.setdefault(gram[0], OrderedDict())
        key = tuple(gram[1:])
        grams.pop(key, None)
        grams[key] = None  # most recent last
        while len(grams) > self.cfg.guesses:
            grams.popitem(last=False)


@register("spec.lookahead", kind="causal", config=LookaheadConfig, lossless=True)
def run(model: CausalLM, batch: PromptBatch, cfg: LookaheadConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Lookahead decoding: a Jacobi window fills an n-gram pool; pooled n-grams are verified as a tree (N5 W7 G7)."""
    return speculative(model, batch, cfg, ctx, lambda generator: LookaheadDrafter(cfg))
