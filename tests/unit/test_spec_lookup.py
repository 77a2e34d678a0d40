"""n-gram lookup (spec.pld / spec.ngram draft sources) on hand-written contexts."""

from __future__ import annotations

import torch

from fastdecode.speculative.drafters.ngram import NgramConfig, NgramLookup
from fastdecode.speculative.drafters.pld import PromptLookup, PromptLookupConfig
from fastdecode.speculative.lookup import continuation, longest_match


def t(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long)


def test_continuation_copies_after_the_leftmost_earlier_match():
    ctx = t(5, 6, 7, 8, 5, 6, 9, 5, 6)
    assert continuation(ctx, 2, 3).tolist() == [7, 8, 5]
    assert continuation(ctx, 2, 10).tolist() == [7, 8, 5, 6, 9, 5, 6]  # clipped at the end of the context
    assert continuation(ctx, 3, 3).tolist() == []  # [9 5 6] never occurred before


def test_trailing_ngram_never_matches_itself_but_may_overlap():
    assert continuation(t(1, 2, 3), 2, 4).tolist() == []
    assert continuation(t(4, 4, 4), 2, 4).tolist() == [4]  # [4 4] at 0 is followed by the last 4


def test_too_short_contexts_and_sizes_give_nothing():
    assert continuation(t(1), 1, 3).tolist() == []
    assert continuation(t(1, 1), 3, 3).tolist() == []
    assert continuation(t(1, 1), 1, 0).tolist() == []


def test_longest_match_prefers_longer_ngrams():
    ctx = t(1, 2, 3, 9, 2, 3, 7, 1, 2, 3)
    # the 3-gram [1 2 3] occurs at 0 (followed by 9); the 2-gram [2 3] would match first at 1 as well
    assert longest_match(ctx, 1, 3, 2).tolist() == [9, 2]
    ctx = t(0, 2, 3, 9, 1, 2, 3)
    assert longest_match(ctx, 1, 3, 2).tolist() == [9, 1]  # falls back to the 2-gram
    assert longest_match(ctx, 3, 5, 2).tolist() == []  # below min_n nothing is tried


def test_drafters_respect_the_loop_limit_and_their_own_length():
    ctx = t(*range(20), *range(5))
    pld = PromptLookup(PromptLookupConfig(num_tokens=10))
    assert pld.propose(ctx, 100).tokens.tolist() == list(range(5, 15))
    assert pld.propose(ctx, 3).tokens.tolist() == [5, 6, 7]
    ngram = NgramLookup(NgramConfig(num_tokens=4))
    assert ngram.propose(ctx, 100).tokens.tolist() == [5, 6, 7, 8]
    assert pld.propose(t(1, 2, 3), 5).probs is None  # deterministic drafters have no q
