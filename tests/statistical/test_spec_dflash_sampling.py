"""spec.dflash sampling reproduces the target's distribution: the second emitted token (the first one a DFlash block
drafts, each position drawn from the drafter's q) against its exact marginal, by a chi-square test."""

from __future__ import annotations

from sampling_stats import PROCESSORS, N, chi_square_p_value, first_two

import fastdecode


def test_dflash_sampling_matches_the_target(causal, prompt, marginals):
    results = fastdecode.generate(causal, [prompt] * N, "spec.dflash", seed=13, max_new_tokens=3, **PROCESSORS)
    assert sum(r.stats.proposed for r in results) >= N // 2  # the second step drafts wherever the first was no EOS
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3
