"""Sampled spec.rsd (siblings drawn without replacement, RSD verification) and spec.dyntree (a deterministic
tree, q one-hot) reproduce the target's distribution: chi-square tests of the first and second emitted tokens
against exact marginals, with a draft model close to the target so that acceptance and rejection both occur."""

from __future__ import annotations

import pytest
from sampling_stats import PROCESSORS, N, chi_square_p_value

import fastdecode


@pytest.mark.parametrize("method,params", [
    ("spec.rsd", {"branches": "3,2"}),
    ("spec.dyntree", {"total_tokens": 20, "depth": 2, "width": 5}),
])
def test_tree_sampling_with_a_draft_model_matches_the_target(causal, near_draft, prompt, marginals, method, params):
    results = fastdecode.generate(causal, [prompt] * N, method, draft=near_draft, seed=21, max_new_tokens=3,
                                  **params, **PROCESSORS)
    accepted = [r.stats.accepted_per_position for r in results]
    first = sum(a[0] if a else 0 for a in accepted)
    assert 0.1 * N < first < 0.9 * N  # the root's siblings are accepted and rejected, often
    second = sum(a[1] if len(a) > 1 else 0 for a in accepted)
    assert second > 0.05 * N  # and depth 2 is reached
    outputs = [r.token_ids for r in results]
    assert chi_square_p_value([o[0] for o in outputs], marginals[0]) > 1e-3
    assert chi_square_p_value([o[1] for o in outputs if len(o) > 1], marginals[1]) > 1e-3
