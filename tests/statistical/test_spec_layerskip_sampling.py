"""spec.layerskip sampling reproduces the target's distribution: the skipped model's q is real (not one-hot),
so both the acceptance and the residual path of rejection sampling are exercised (chi-square as in
test_spec_sampling)."""

from __future__ import annotations

import fastdecode
from test_spec_sampling import N, PROCESSORS, chi_square_p_value, first_two, marginals, prompt  # noqa: F401


def test_layerskip_sampling_matches_the_target(causal, prompt, marginals):  # noqa: F811
    results = fastdecode.generate(causal, [prompt] * N, "spec.layerskip", skip_layers="1", seed=21,
                                  max_new_tokens=2, confidence_stop=0.0, **PROCESSORS)
    assert sum(r.stats.proposed for r in results) >= N
    accepted = sum(r.stats.accepted for r in results)
    assert 0.05 * N < accepted < 0.95 * N
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3
