"""DD1's noise -> token map is exact: Gaussian noise flows to tokens distributed as the teacher's p."""

from __future__ import annotations

import pytest
import torch
from statistical.sampling_stats import chi_square_p_value  # tests/ is on the path (rootdir conftest)

from fastdecode.image.ddmap import flow_map, quantile_map, snr_grid


def test_one_dimension_equals_the_quantile_map() -> None:
    """A 1-D flow keeps order, so it is the monotone (quantile) map: at most 1 in 10^3 noise values disagree."""
    gen = torch.Generator().manual_seed(0)
    levels = torch.tensor([0.0, 1 / 3, 2 / 3, 1.0])
    eps = torch.randn(4000, 1, generator=gen)
    p = torch.distributions.Dirichlet(torch.full((4,), 0.5)).sample((4000,))
    logp = p.clamp_min(1e-30).log()
    mapped = flow_map(eps, logp, levels[:, None])
    exact = quantile_map(eps, logp, levels)
    assert (mapped != exact).float().mean().item() <= 1e-3


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gaussian_noise_flows_to_p(seed: int) -> None:
    """20k draws of one random p over 16 unit codes in 4-d: the token histogram passes chi-square (p > 1e-3)."""
    gen = torch.Generator().manual_seed(seed)
    codebook = torch.nn.functional.normalize(torch.randn(16, 4, generator=gen), dim=-1)
    p = torch.softmax(2 * torch.randn(16, generator=gen), dim=-1)
    eps = torch.randn(20000, 4, generator=gen)
    tokens = flow_map(eps, p.log().expand(20000, 16), codebook)
    assert chi_square_p_value(tokens.tolist(), p) > 1e-3


def test_zero_probability_codes_are_never_reached() -> None:
    codebook = torch.nn.functional.normalize(torch.randn(8, 3, generator=torch.Generator().manual_seed(4)), dim=-1)
    logp = torch.tensor([0.0, -float("inf"), 0.0, -float("inf"), 0.0, 0.0, -float("inf"), 0.0]).expand(3000, 8)
    tokens = flow_map(torch.randn(3000, 3, generator=torch.Generator().manual_seed(5)), logp, codebook)
    assert set(tokens.tolist()) <= {0, 2, 4, 5, 7}


def test_map_is_deterministic_and_shapes_are_checked() -> None:
    codebook = torch.eye(3)
    eps = torch.randn(50, 3, generator=torch.Generator().manual_seed(6))
    logp = torch.zeros(50, 3)
    assert torch.equal(flow_map(eps, logp, codebook), flow_map(eps, logp, codebook))
    with pytest.raises(ValueError, match="shapes disagree"):
        flow_map(eps[:, :2], logp, codebook)
    with pytest.raises(ValueError, match="at least 1"):
        snr_grid(0)
