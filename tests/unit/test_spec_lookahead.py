"""Lookahead decoding's pieces: the Jacobi window layout, the n-gram pool, the candidate tree."""

from __future__ import annotations

import torch

from fastdecode.speculative.drafter import Verification
from fastdecode.speculative.drafters.lookahead import LookaheadConfig, LookaheadDrafter, candidate_tree, window_layout


def test_window_columns_are_jacobi_trajectories_anchored_on_the_last_token():
    offsets, mask = window_layout(levels=3, width=4)  # level 0: columns 1-3; levels 1, 2: columns 0-3
    assert offsets.tolist() == [1, 2, 3] + [1, 2, 3, 4] + [2, 3, 4, 5]
    seen = mask[3 + 4 + 2].nonzero().squeeze(-1).tolist()  # level 2, column 2
    assert seen == [0, 1, 3 + 2, 3 + 4 + 2]  # level 0 columns 1-2, then column 2 at levels 1 and 2
    # with the root (offset 0) they sit at consecutive positions 0..4, ending at its own position 4
    assert sorted(offsets[seen].tolist()) == [1, 2, 3, 4]
    assert mask[3].nonzero().squeeze(-1).tolist() == [3]  # level 1, column 0 sees only the root before it
    assert mask[2].nonzero().squeeze(-1).tolist() == [0, 1, 2]  # level 0 is plain causal after the root


def test_candidate_tree_merges_shared_prefixes_and_respects_depth():
    tokens, parents = candidate_tree([(5, 6, 7), (5, 6, 8), (9, 1, 2)], depth=3)
    assert tokens == [5, 6, 7, 8, 9, 1, 2] and parents == [-1, 0, 1, 1, -1, 4, 5]
    assert candidate_tree([(5, 6, 7), (5, 6, 8)], depth=2) == ([5, 6], [-1, 0])


def step(d: LookaheadDrafter, top_tokens: list[int], V: int = 50) -> None:
    """The target's argmax at the top level's rows is `top_tokens`; everything else 0."""
    S = sum(map(len, d.levels))
    logits = torch.zeros(1 + d._tree_size + S, V)
    rows = 1 + d._tree_size + S - len(d.levels[-1])
    logits[torch.arange(rows, rows + len(top_tokens)), torch.tensor(top_tokens)] = 1.0
    d.observe(Verification(0, (0,), logits, d._tree_size))


def test_warm_up_narrows_the_window_to_w_columns_as_lade():
    d = LookaheadDrafter(LookaheadConfig(ngram=4, window=2, guesses=2))
    d.propose(torch.tensor([4, 5, 6]), 10)
    assert [len(level) for level in d.levels] == [3]  # W + N - 3 guesses after the root: 4 columns
    d.levels = [[11, 12, 13]]
    step(d, [21, 22, 23])  # the outputs at level 0's guesses (columns 1-3) become level 1, columns 0-2
    assert d.levels == [[12, 13], [21, 22, 23]] and not d.pool
    d.propose(torch.tensor([4, 5, 7]), 10)
    step(d, [31, 32, 33])  # every level moves one column on; the top's columns 1-2 are the new level
    assert d.levels == [[13], [22, 23], [32, 33]] and not d.pool  # N - 1 levels of W = 2 columns: full
    d.propose(torch.tensor([4, 5, 8]), 10)
    step(d, [41, 42])
    assert list(d.pool[8]) == [(22, 32, 41)] and list(d.pool[13]) == [(23, 33, 42)]
    assert d.levels == [[23], [32, 33], [41, 42]]


def test_column_0_ngram_is_stored_under_the_real_last_token():
    d = LookaheadDrafter(LookaheadConfig(ngram=3, window=2, guesses=2))
    d.levels = [[5], [6, 7]]  # full: level 0 = (root, 5), level 1 = (6, 7)
    draft = d.propose(torch.tensor([0, 1, 9]), 10)
    assert draft.side is not None and draft.side.tokens.tolist() == [5, 6, 7]
    assert draft.side.offsets.tolist() == [1, 1, 2]
    step(d, [8, 3])  # column 0: root 9 -> 6 -> 8; column 1: 5 -> 7 -> 3
    assert list(d.pool[9]) == [(6, 8)] and list(d.pool[5]) == [(7, 3)]
    assert d.levels == [[7], [8, 3]]
    for g in ([9, 1, 1], [9, 2, 2], [9, 6, 8]):
        d._remember(g)
    assert list(d.pool[9]) == [(2, 2), (6, 8)]  # (1, 1) dropped; (6, 8) refreshed to most recent
    draft = d.propose(torch.tensor([0, 9]), 10)
    assert draft.tokens.tolist() == [6, 8, 2, 2] and draft.parents == [-1, 0, -1, 2]
