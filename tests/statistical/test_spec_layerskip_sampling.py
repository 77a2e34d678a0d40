"""spec.layerskip sampling reproduces the target's distribution: the skipped model's q is real (not one-hot),
so both the acceptance and the residual path of rejection sampling are exercised (chi-square as in
sampling_stats)."""

from __future__ import annotations

from sampling_stats import PROCESSORS, N, chi_square_p_value, first_two

import fastdecode


def test_layerskip_sampling_matches_the_target(causal, prompt, marginals):
    results = fastdecode.generate(causal, [prompt] * N, "spec.layerskip", skip_layers="1", seed=21,
                                  max_new_tokens=2, confidence_stop=0.0, **PROCESSORS)
    assert sum(r.stats.proposed for r in results) >= N
    accepted = sum(r.stats.accepted for r in results)
    assert 0.05 * N < accepted < 0.95 * N
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3
