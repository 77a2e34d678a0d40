"""History-dependent processors in speculative verification: with a repetition penalty, greedy speculative
decoding equals ar.greedy with the same penalty token for token (every verified position, chain or tree node,
penalises the drafted tokens before it), on tiny fp32 models."""

from __future__ import annotations

import pytest

import fastdecode

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
PENALTY = 1.3


def ar_greedy(causal, penalty):
    results = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40, repetition_penalty=penalty)
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def penalised(causal):
    return {p: ar_greedy(causal, p) for p in (1.1, PENALTY)}


def test_the_penalty_changes_greedy_output_and_ar_sample_agrees(causal, penalised):
    plain = [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)]
    assert plain != penalised[1.1] and plain != penalised[PENALTY]  # otherwise the tests below prove nothing
    sampled = fastdecode.generate(causal, PROMPTS, "ar.sample", temperature=0, max_new_tokens=40,
                                  repetition_penalty=PENALTY)
    assert [r.token_ids for r in sampled] == penalised[PENALTY]


# (method, params, penalty, whether drafts get accepted: a penalty of 1.3 rejects every copied n-gram on the tiny
# model, so prompt lookup / n-gram also run at 1.1, where drafted positions are accepted under the penalty).
# Ignoring the drafted tokens in each position's history breaks draft_model, suffix (tree) and lookahead here.
CASES = [
    ("spec.pld", {}, PENALTY, False),
    ("spec.pld", {}, 1.1, True),
    ("spec.ngram", {}, PENALTY, False),
    ("spec.ngram", {}, 1.1, True),
    ("spec.draft_model", {"num_draft_tokens": 4}, PENALTY, True),  # the tiny model as its own draft
    ("spec.suffix", {"tree": True, "max_spec_factor": 3.0, "min_token_prob": 0.0}, PENALTY, True),  # a tree
    ("spec.lookahead", {}, PENALTY, True),  # a tree plus side tokens
]


@pytest.mark.parametrize("method,params,penalty,accepts", CASES)
def test_greedy_with_repetition_penalty_equals_ar_greedy(causal, penalised, method, params, penalty, accepts):
    kw = dict(params, draft=causal) if method == "spec.draft_model" else params
    results = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=40, repetition_penalty=penalty, **kw)
    assert [r.token_ids for r in results] == penalised[penalty]
    assert sum(r.stats.proposed for r in results) > 0
    if accepts:  # drafted positions were verified under the penalty
        assert sum(r.stats.accepted for r in results) > 0
