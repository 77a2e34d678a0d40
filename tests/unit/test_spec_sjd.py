"""spec.sjd on a text model: greedy is Jacobi decoding (ar.greedy's tokens), seeded sampling repeats, both
initialisations and the coupled redraft run, and a bad init is refused before the first step."""

from __future__ import annotations

import pytest

import fastdecode

PROMPTS = ["the quick brown", "def add"]


@pytest.mark.parametrize("params", [dict(window=4), dict(window=16), dict(window=3, coupling=True)])
def test_greedy_sjd_equals_ar_greedy(causal, params):
    want = [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=20)]
    got = fastdecode.generate(causal, PROMPTS, "spec.sjd", max_new_tokens=20, **params)
    assert [r.token_ids for r in got] == want


@pytest.mark.parametrize("coupling", [False, True])
def test_seeded_sampling_repeats_and_drafts(causal, coupling):
    kw = dict(max_new_tokens=24, temperature=1.0, top_k=16, seed=5, window=6, coupling=coupling)
    a = fastdecode.generate(causal, PROMPTS, "spec.sjd", **kw)
    b = fastdecode.generate(causal, PROMPTS, "spec.sjd", **kw)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert all(r.stats.proposed > 0 for r in a)
    assert all(r.stats.forwards <= r.stats.new_tokens for r in a)


def test_vertical_init_is_refused_on_a_text_model(causal):
    with pytest.raises(fastdecode.IncompatibleMethodError, match="init='random'"):
        fastdecode.generate(causal, "the", "spec.sjd", max_new_tokens=4, init="vertical")
