"""DD1's deterministic noise -> token map: the flow-matching ODE to a Dirac mixture over codebook vectors, solved.

A teacher gives, at one position, a categorical p over the K codebook vectors e_k (d-dimensional). Flow matching
from N(0, I) to that Dirac mixture with the straight path x_t = t e + (1 - t) eps has the closed-form velocity
v(x, t) = sum_k w_k (e_k - x) / (1 - t), w_k ∝ p_k N(x; t e_k, (1 - t)^2 I), which blows up as t -> 1 (stiff).

We integrate the same ODE in other coordinates: u = x / (1 - t) and s = t / (1 - t) (the signal-to-noise ratio).
Then u_s = s e + eps exactly along the interpolation, du/ds = E[e | u_s] = sum_k w_k e_k with
w_k ∝ p_k exp(s u.e_k - s^2 |e_k|^2 / 2), and s runs from 0 to infinity. The velocity is bounded by max |e_k|, so
a classical RK4 solver on a grid geometric in s is accurate; at the grid's end the posterior is one-hot and its argmax
is the token. The flow carries N(0, I) to the mixture, so eps ~ N(0, I) gives tokens distributed exactly as p
(up to the solver's error, which the tests bound). In one dimension a flow keeps order, so the map must equal the
quantile map on the sorted levels: the strongest test of the solver.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_STEPS = 12  # RK4 steps (4 velocity evaluations each) on the geometric s grid; tests/image/test_ddmap.py
# measures the error left: about 1 in 10^3 noise vectors lands on a neighbouring code (5 in 10^4 in one dimension),
# against 2 in 10^3 for 64 Heun steps on [0.01, 1000] (the first try: most of its steps fell where nothing moves)
S_MIN = 0.1  # the first nonzero signal-to-noise ratio (below it the posterior barely moves from p)
S_MAX = 50.0  # the last: s^2 |e_a - e_b|^2 / 2 (>= 100 for codes 0.3 apart) dwarfs the log-probability gaps


def snr_grid(steps: int = DEFAULT_STEPS, s_min: float = S_MIN, s_max: float = S_MAX,
             dtype: torch.dtype = torch.float64) -> Tensor:
    """The s values the solver visits: 0, then `steps` points geometric from s_min to s_max.  # [steps + 1]"""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if not 0 < s_min < s_max:
        raise ValueError(f"need 0 < s_min < s_max, got {s_min} and {s_max}")
    geo = torch.logspace(torch.log10(torch.tensor(s_min)).item(), torch.log10(torch.tensor(s_max)).item(), steps,
                         dtype=dtype)
    return torch.cat([torch.zeros(1, dtype=dtype), geo])


def posterior_logits(u: Tensor, s: float | Tensor, logp: Tensor, codebook: Tensor) -> Tensor:
    """log w_k up to a constant per row: log p_k + s u.e_k - s^2 |e_k|^2 / 2.  u [B, d], logp [B, K] -> [B, K]"""
    sq = (codebook * codebook).sum(-1)  # [K]
    return logp + s * (u @ codebook.T) - 0.5 * s * s * sq


def velocity(u: Tensor, s: float | Tensor, logp: Tensor, codebook: Tensor) -> Tensor:
    """du/ds = E[e | u_s] under the posterior.  [B, d]"""
    w = torch.softmax(posterior_logits(u, s, logp, codebook), dim=-1)  # [B, K]
    return w @ codebook


def flow_map(eps: Tensor, logp: Tensor, codebook: Tensor, steps: int = DEFAULT_STEPS,
             s_min: float = S_MIN, s_max: float = S_MAX) -> Tensor:
    """The token each noise vector flows to: eps [B, d], logp [B, K] (log-probabilities, -inf allowed),
    codebook [K, d] -> LongTensor [B]. Computed in float64; a deterministic function of its inputs."""
    if eps.dim() != 2 or logp.dim() != 2 or codebook.dim() != 2:
        raise ValueError(f"flow_map takes eps [B, d], logp [B, K], codebook [K, d]; got {tuple(eps.shape)}, "
                         f"{tuple(logp.shape)}, {tuple(codebook.shape)}")
    if eps.shape[1] != codebook.shape[1] or logp.shape[1] != codebook.shape[0] or eps.shape[0] != logp.shape[0]:
        raise ValueError(f"shapes disagree: eps {tuple(eps.shape)}, logp {tuple(logp.shape)}, codebook "
                         f"{tuple(codebook.shape)} (need eps [B, d], logp [B, K], codebook [K, d])")
    u = eps.to(torch.float64)
    lp = torch.log_softmax(logp.to(torch.float64), dim=-1)  # normalised: the map depends on p only
    e = codebook.to(device=u.device, dtype=torch.float64)
    grid = snr_grid(steps, s_min, s_max).tolist()
    for s0, s1 in zip(grid[:-1], grid[1:], strict=True):
        h, mid = s1 - s0, 0.5 * (s0 + s1)
        k1 = velocity(u, s0, lp, e)
        k2 = velocity(u + 0.5 * h * k1, mid, lp, e)
        k3 = velocity(u + 0.5 * h * k2, mid, lp, e)
        k4 = velocity(u + h * k3, s1, lp, e)
        u = u + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return posterior_logits(u, grid[-1], lp, e).argmax(-1)


def quantile_map(eps: Tensor, logp: Tensor, levels: Tensor) -> Tensor:
    """The exact map in one dimension: the level whose cumulative mass (levels sorted ascending) first exceeds
    Phi(eps). eps [B, 1], logp [B, K], levels [K] -> LongTensor [B]. What `flow_map` must equal when d = 1."""
    order = torch.argsort(levels.to(torch.float64))  # [K]
    p = torch.softmax(logp.to(torch.float64), dim=-1)[:, order]  # [B, K] in level order
    cdf = torch.cumsum(p, dim=-1)  # [B, K]
    u = torch.special.ndtr(eps.to(torch.float64)[:, :1])  # [B, 1]
    idx = (cdf < u).sum(-1).clamp(max=levels.numel() - 1)  # [B]
    return order[idx]
