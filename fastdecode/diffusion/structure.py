"""Dystruct's structural inference (`dlm.dystruct`), as pure tensor functions over a step's window.

Three latent structures are inferred from one forward, each by its maximum a posteriori value (docs/diffusion.md,
"dlm.dystruct", says why each choice was made; the paper, arXiv 2605.09820, publishes no code):

- the answer's length: a posterior over where the first EOS falls (`end_posterior`), from which the window is kept
  or grown (`expansion`);
- the block partition: a Chinese-Restaurant-Process prior over contiguous blocks, each column joining the current
  block in proportion to its size times an entropy affinity, or opening a new one in proportion to `alpha`; a
  delimiter predicted just before a column raises the odds of a new block (`partition`);
- the schedule: the blocks ranked by a Gibbs distribution over -beta * instability + lam * anchoring, its mode
  decoded first (`schedule`).

Every function takes view columns `[B, W]` (padded to the widest row; `inview` marks the real ones).
"""

from __future__ import annotations

import torch

from .scores import neg_entropy


def eos_mass(logits: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """`[B, W, V]` logits, `[E]` EOS ids -> `[B, W]` float64 probability that each column holds an EOS."""
    return logits.double().softmax(dim=-1)[..., eos].sum(dim=-1)


def end_posterior(p_eos: torch.Tensor, inview: torch.Tensor) -> torch.Tensor:
    """`[B, W]` p(EOS at column), `[B, W]` window columns -> `[B, W]` posterior that the *first* EOS is at each
    column: p_j * prod_{i<j} (1 - p_i), columns read as independent (the mean-field reading of one forward).
    Committed columns enter with p = 1 (an EOS) or 0 (a token). The mass left over is the answer running past
    the window."""
    p = torch.where(inview, p_eos, 0.0)
    survive = torch.cumprod(1 - p, dim=-1)  # [B, W] no EOS through column j
    before = torch.cat([torch.ones_like(p[:, :1]), survive[:, :-1]], dim=-1)  # no EOS before column j
    return p * before


def fits(posterior: torch.Tensor, width: torch.Tensor, margin: int) -> torch.Tensor:
    """`[B]` posterior probability that the answer's first EOS lies at least `margin` columns before the end of
    the window of `width` `[B]` columns (the zoo's models were trained with EOS padding after every answer)."""
    cols = torch.arange(posterior.shape[-1], device=posterior.device)
    return (posterior * (cols[None, :] < (width - margin)[:, None])).sum(dim=-1)


def expansion(p_fit: torch.Tensor, step: int, gamma: float) -> torch.Tensor:
    """`[B]` P(the answer fits) -> `[B]` columns to append, L in {0, step // 2, step}: none when the posterior
    says it fits (>= gamma), a full step when it is as sure that it does not (< min(gamma, 1 - gamma)), half a
    step in between."""
    sure = min(gamma, 1 - gamma)
    half = max(1, step // 2)
    return torch.where(p_fit >= gamma, 0, torch.where(p_fit < sure, step, half))


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """`[B, W, V]` -> `[B, W]` float64 entropy in nats (the local instability of a column's prediction)."""
    return -neg_entropy(logits)


def partition(h: torch.Tensor, boundary: torch.Tensor, inview: torch.Tensor, alpha: float, sigma: float,
              max_block: int) -> torch.Tensor:
    """MAP block partition of the window under a CRP prior, scanned left to right.

    h `[B, W]` entropy (0 on committed columns), boundary `[B, W]` probability that a block boundary follows the
    column (a predicted delimiter), inview `[B, W]`. Column j joins the current block k iff
    n_k * exp(-|h_j - mean_k| / sigma) * (1 - boundary_{j-1}) > alpha and n_k < max_block, else opens a new one.
    -> `[B, W]` block ids (0, 1, ...; -1 off the view).
    """
    B, W = h.shape
    ids = torch.zeros(B, W, dtype=torch.long, device=h.device)
    if W == 0:
        return ids
    k = torch.zeros(B, dtype=torch.long, device=h.device)  # current block per row
    n = torch.ones(B, dtype=torch.float64, device=h.device)  # its size
    total = h[:, 0].clone()  # its entropy sum
    for j in range(1, W):
        affinity = torch.exp(-(h[:, j] - total / n).abs() / sigma)
        join = (n * affinity * (1 - boundary[:, j - 1]) > alpha) & (n < max_block)
        k = torch.where(join, k, k + 1)
        n = torch.where(join, n + 1, 1.0)
        total = torch.where(join, total + h[:, j], h[:, j])
        ids[:, j] = k
    return ids.masked_fill(~inview, -1)


def schedule(ids: torch.Tensor, h: torch.Tensor, masked: torch.Tensor, inview: torch.Tensor, end_known: torch.Tensor,
             beta: float, lam: float, right: float = 1.0) -> torch.Tensor:
    """The mode of the Gibbs schedule p(B) ∝ exp(-beta * H(B) + lam * C(B)) over the blocks holding masks.

    H(B) is the mean entropy of the block's masks; C(B) its anchoring, (left + right * r) / (1 + r) for the sides of
    its masked span that touch decoded text, r = `right` the weight of the right side (the prompt side of the window
    counts; the window's right end counts when the answer's end is known, `end_known` `[B]`). Ties go to the
    leftmost block. -> `[B, W]` the chosen block's masks.
    """
    B, W = ids.shape
    nb = int(ids.max()) + 1 if W else 0
    cols = torch.arange(W, device=ids.device)
    out = torch.zeros_like(masked)
    if nb == 0:
        return out
    member = (ids[:, None, :] == torch.arange(nb, device=ids.device)[None, :, None]) & masked[:, None, :]  # [B, K, W]
    count = member.sum(-1)  # [B, K]
    mean_h = (h[:, None, :] * member).sum(-1) / count.clamp(min=1)
    first = torch.where(member, cols, W).min(-1).values  # [B, K] first mask of the block
    last = torch.where(member, cols, -1).max(-1).values
    width = inview.sum(-1, keepdim=True)  # [B, 1]
    decoded = inview & ~masked  # [B, W]
    left = (first == 0) | decoded.gather(1, (first - 1).clamp(0, W - 1))
    right_in = decoded.gather(1, (last + 1).clamp(0, W - 1)) & (last + 1 < width)
    anchored = right_in | ((last + 1 >= width) & end_known[:, None])
    score = -beta * mean_h + lam * (left.double() + right * anchored.double()) / (1 + right)
    score = score.masked_fill(count == 0, float("-inf"))
    best = score.argmax(-1)  # [B] first maximum: the leftmost of ties
    return member[torch.arange(B, device=ids.device), best] & (count.gather(1, best[:, None]) > 0)
