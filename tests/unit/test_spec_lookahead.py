"""Lookahead decoding's pieces: the Jacobi window layout, the n-gram pool, the candidate tree."""

from __future__ import annotations

import torch

from fastdecode.speculative.drafters.lookahead import LookaheadConfig, LookaheadDrafter, candidate_tree, window_layout
from fastdecode.speculative.verification import Verification


def test_window_columns_are_jacobi_trajectories():
    offsets, mask = window_layout(levels=3, width=4)  # index j * 4 + i
    assert offsets.view(3, 4).tolist() == [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]
    seen = mask[2 * 4 + 2].nonzero().squeeze(-1).tolist()  # level 2, column 2
    assert seen == [0, 1, 2, 6, 10]  # level 0 columns 0-1, then column 2 at levels 0, 1, 2
    # what it sees sits at consecutive positions 1..5, right before its own position 5
    assert sorted(offsets[seen].tolist()) == [1, 2, 3, 4, 5]
    assert mask[1].nonzero().squeeze(-1).tolist() == [0, 1]  # level 0 is plain causal


def test_candidate_tree_merges_shared_prefixes_and_respects_depth():
    tokens, parents = candidate_tree([(5, 6, 7), (5, 6, 8), (9, 1, 2)], depth=3)
    assert tokens == [5, 6, 7, 8, 9, 1, 2] and parents == [-1, 0, 1, 1, -1, 4, 5]
    assert candidate_tree([(5, 6, 7), (5, 6, 8)], depth=2) == ([5, 6], [-1, 0])


def test_pool_keeps_the_latest_ngrams_per_first_token():
    d = LookaheadDrafter(LookaheadConfig(ngram=3, window=2, guesses=2))
    d.propose(torch.tensor([4, 5, 6]), 10)
    assert len(d.levels) == 1 and d.levels[0][0] in (4, 5, 6)

    def step(top_tokens):
        logits = torch.zeros(1 + d._tree_size + len(d.levels) * 2, 20)
        rows = 1 + d._tree_size + (len(d.levels) - 1) * 2
        logits[torch.arange(rows, rows + 2), torch.tensor(top_tokens)] = 1.0
        d.observe(Verification(0, (0,), logits, d._tree_size))

    d.levels = [[1, 2]]
    step([3, 4])  # second level: no n-gram yet (N - 1 = 2 levels needed first)
    assert d.levels == [[1, 2], [3, 4]] and not d.pool
    step([7, 8])  # columns give 3-grams (1, 3, 7) and (2, 4, 8)
    assert d.levels == [[3, 4], [7, 8]]
    assert list(d.pool[1]) == [(3, 7)] and list(d.pool[2]) == [(4, 8)]
    for g in ([1, 9, 9], [1, 5, 5], [1, 3, 7]):
        d._remember(g)
    assert list(d.pool[1]) == [(5, 5), (3, 7)]  # (9, 9) dropped; (3, 7) refreshed to most recent
    draft = d.propose(torch.tensor([0, 1]), 10)
    assert draft.tokens.tolist() == [3, 7, 5, 5] and draft.parents == [-1, 0, -1, 2]
    assert draft.side is not None and draft.side.tokens.tolist() == [3, 4, 7, 8]
