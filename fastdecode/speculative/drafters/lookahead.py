"""spec.lookahead: Lookahead decoding (Fu et al. 2024), a Jacobi window that rides on every verification
forward harvests n-grams into a pool; n-grams that start with the last token are verified as a tree.

As hao-ai-lab/LookaheadDecoding (`lade/decoding.py`, `jacobi_greedy_search_multilevel`): the window is a grid of
N - 1 levels and W columns anchored on the last context token, which is level 0, column 0 (the verification
root); level j, column i sits j + i positions after it and sees level 0 up to column i and its own column below
it, so each column is one Jacobi trajectory. The argmax at the top level is the next level. Once N - 1 levels
exist, every column with its new token is an N-gram stored under its level-0 token (column 0's under the real
last token): the pool keeps up to G per first token (least recently used dropped). Then the grid moves one
position on: level 0 becomes level 1 without its column 0 (where the next real token goes), the other levels
move down. It starts as W + N - 3 tokens drawn from the context at level 0, one column more per level still to
come, and loses a column per step while the levels fill (LADE's warm-up), so that it has W columns when full.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, Side, SpecConfig, Verification, register_spec
from ..driver import speculative


@dataclass(frozen=True)
class LookaheadConfig(SpecConfig):
    ngram: int = 5  # N, the n-gram size (window levels + 1)
    window: int = 7  # W, Jacobi columns
    guesses: int = 7  # G, n-grams kept per first token and verified per step

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.ngram >= 3, "ngram", self.ngram, "must be at least 3 (a window of at least two levels)")
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.guesses >= 1, "guesses", self.guesses, "must be at least 1")


def window_layout(levels: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets `[S]` and attention `[S, S]` of the window's side tokens, S = (width - 1) + (levels - 1) * width:
    level 0's columns 1..width-1 (its column 0 is the last context token, the root), then level by level
    columns 0..width-1. Level j, column i sits j + i after the root and sees level 0 up to column i and its own
    column at levels 1..j (the root and the context it sees as every side token does)."""
    j = torch.cat([torch.zeros(width - 1, dtype=torch.long), torch.arange(1, levels).repeat_interleave(width)])
    i = torch.cat([torch.arange(1, width), torch.arange(width).repeat(levels - 1)])
    offsets = j + i
    level0_before = (j[None, :] == 0) & (i[None, :] <= i[:, None])
    own_column = (i[None, :] == i[:, None]) & (j[None, :] >= 1) & (j[None, :] <= j[:, None])
    return offsets, level0_before | own_column


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
        self.levels: list[list[int]] = []  # level 0: columns 1..w-1; levels 1..: columns 0..w-1
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self._tree_size = 0
        self._root: int | None = None  # last context token of the last proposal (level 0, column 0)

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        cfg = self.cfg
        if not self.levels:  # level 0 starts as tokens drawn from the context, as the reference does
            g = torch.Generator().manual_seed(context.numel())
            n = cfg.window + cfg.ngram - 3
            self.levels = [context[torch.randint(context.numel(), (n,), generator=g)].tolist()]
        self._root = int(context[-1])
        grams = list(self.pool.get(self._root, {}))
        tokens, parents = candidate_tree(grams[::-1], k)  # most recently used first
        self._tree_size = len(tokens)
        offsets, mask = window_layout(len(self.levels), len(self.levels[0]) + 1)
        side = Side(torch.tensor(sum(self.levels, []), dtype=torch.long), offsets, mask)
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=parents, side=side)

    def _top(self, side_rows: int) -> slice | None:
        """The rows of the window's top level among a step's `side_rows` side tokens (level 0's guesses, then each
        level above); None where the step carried no window."""
        S = sum(map(len, self.levels))
        if self._root is None or not S or side_rows < S:
            return None
        return slice(S - len(self.levels[-1]), S)

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None
              ) -> torch.Tensor | None:
        top = self._top(logits.shape[0] - 1 - num_draft)
        return None if top is None else logits[1 + num_draft :][top].argmax(-1)  # the top level's next tokens

    def observe(self, verification: Verification) -> None:
        root = self._root
        if root is None or self._top(verification.logits.shape[0] - 1 - verification.num_draft) is None:
            return
        levels, w = self.levels, len(self.levels[0]) + 1
        out = self.asked(verification).tolist()  # the top level's columns (1.. at level 0, else 0..)
        if len(levels) == self.cfg.ngram - 1:
            for i in range(w):
                first = root if i == 0 else levels[0][i - 1]
                self._remember([first] + [level[i] for level in levels[1:]] + [out[i]])
            self.levels = [levels[1][1:]] + levels[2:] + [out]
        else:  # still filling: every level moves one column on, and the top's new tokens are the next level
            self.levels = [level[1:] for level in levels] + [out if len(levels) == 1 else out[1:]]
        self._root = None

    def _remember(self, gram: list[int]) -> None:
        grams = self.pool.setdefault(gram[0], OrderedDict())
        key = tuple(gram[1:])
        grams.pop(key, None)
        grams[key] = None  # most recent last
        while len(grams) > self.cfg.guesses:
            grams.popitem(last=False)


@register_spec("spec.lookahead", config=LookaheadConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: LookaheadConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Lookahead decoding: a Jacobi window fills an n-gram pool; pooled n-grams are verified as a tree (N5 W7 G7)."""
    return speculative(model, batch, cfg, ctx, lambda generator: LookaheadDrafter(cfg))
