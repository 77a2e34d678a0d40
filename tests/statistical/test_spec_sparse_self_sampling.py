"""spec.sparse_self sampling reproduces the target's distribution: the draft reads only the sinks and a window of
the cache in every layer, so its q differs from p and both paths of rejection sampling run (chi-square as in
sampling_stats)."""

from __future__ import annotations

import pytest
from sampling_stats import PROCESSORS, N, chi_square_p_value, first_two

import fastdecode
from fastdecode.speculative.drafters.sparse_self import SparseSelfDrafter


@pytest.mark.parametrize("each", [True, False], ids=["read-each-token", "unread-as-on-a-gpu"])
def test_sparse_self_sampling_matches_the_target(causal, prompt, marginals, each, monkeypatch):
    monkeypatch.setattr(SparseSelfDrafter, "read_each_token", each)
    # the first token comes from the prefill's verification; the second is drafted sparsely, then verified
    results = fastdecode.generate(causal, [prompt] * N, "spec.sparse_self", seed=23, max_new_tokens=3,
                                  rule="streaming:dense_layers=0", budget=3, sinks=1, recent=1, **PROCESSORS)
    assert sum(r.stats.proposed for r in results) >= N // 2
    accepted = sum(r.stats.accepted for r in results)
    assert 0.05 * N < accepted < 0.95 * sum(r.stats.proposed for r in results)
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3
