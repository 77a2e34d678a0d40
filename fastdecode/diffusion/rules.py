"""Commit rules: pure tensor functions from per-position scores to the positions committed at a step.

Every rule takes `score` `[B, L]` (float64, higher = more certain, -inf where a position is not a
candidate: not masked, or outside the view) and returns `[B, L]` bool, a subset of the candidates.
Unless it says otherwise a rule always includes the row's best candidate, so a row with a candidate
commits at least one position (the "no hangs, ever" rule). Ties go to the lowest position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def candidates(score: torch.Tensor) -> torch.Tensor:
    return score > NEG_INF


def top1(score: torch.Tensor) -> torch.Tensor:
    """`[B, L]` -> the best candidate of each row (the lowest position on ties); nothing for a row without one."""
    best = score.argmax(dim=-1, keepdim=True)  # argmax returns the first maximum
    return torch.zeros_like(score, dtype=torch.bool).scatter_(-1, best, True) & candidates(score)


def select_topk(score: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`[B, L]` scores, `[B]` counts -> `[B, L]` bool: the k[b] highest finite scores of each row (LLaDA).

    Positions scored -inf are never selected. Ties go to the lowest position (a stable sort), so the
    choice does not depend on the backend's top-k. k = 0 selects nothing.
    """
    order = score.argsort(dim=-1, descending=True, stable=True)  # [B, L]
    ranks = torch.arange(score.shape[-1], device=score.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, ranks)  # [B, L]: 0 = best
    return (rank < k[:, None]) & candidates(score)


def _leading(ok: torch.Tensor) -> torch.Tensor:
    """`[B, L]` bool -> `[B]` length of the leading run of True."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def threshold(score: torch.Tensor, tau: float) -> torch.Tensor:
    """Fast-dLLM `get_transfer_index` with a threshold: every candidate scoring >= tau, and always the top-1."""
    return (candidates(score) & (score >= tau)) | top1(score)


def factor(score: torch.Tensor, f: float, rule: str = "fast_dllm") -> torch.Tensor:
    """Fast-dLLM factor rule: with confidences sorted c(1) >= c(2) >= ..., the n-th passes when
    c(n) >= 1 - f / (n + 1), i.e. (n + 1)(1 - c(n)) <= f (the paper's (n+1)eps <= 1 parallel-decoding condition);
    the first always passes.

    rule="fast_dllm" (`get_transfer_index_dynamic`): scan the sorted candidates and stop at the first that fails;
    the passing ones before it are committed, and when the scan reaches the last candidate (every earlier one
    passed) that one is committed as well, pass or fail (the reference's `top_i += 1`: two remaining masks are
    always both committed). rule="strict" (fastdecode's earlier rule): only the leading run that passes with
    the strict (n + 1)(1 - c(n)) < f, at least 1.

    The test is monotone in n for a sorted row, so "the largest n" is the leading run of positions that pass.
    """
    c = score.sort(dim=-1, descending=True).values  # [B, L]
    n = torch.arange(1, score.shape[-1] + 1, device=score.device, dtype=c.dtype)
    live = c > NEG_INF
    if rule == "strict":
        ok = ((n + 1) * (1 - c) < f) & live
        return select_topk(score, _leading(ok).clamp(min=1))
    ok = (c >= 1 - f / (n + 1)) & live
    ok[..., 0] = live[..., 0]  # the reference's first threshold is -1
    lead = _leading(ok)  # [B] where the scan breaks (or the candidate count, when it never does)
    count = live.sum(dim=-1)
    return select_topk(score, torch.where(lead >= count - 1, count, lead))


def entropy_bound(score: torch.Tensor, gamma: float) -> torch.Tensor:
    """EB-Sampler (SGLang `EBSampling`): `score` is the negative entropy. Sort candidates by entropy H(1) <= H(2)
    <= ... and commit the first n for the largest n with H(1) + ... + H(n-1) <= gamma, at least 1.

    Equivalently the committed set's total entropy minus its largest entropy stays within gamma (nats).
    """
    h = -score.sort(dim=-1, descending=True).values  # [B, L] ascending entropy, +inf off the candidates
    before = h.cumsum(dim=-1) - h  # entropy of the positions ranked before each one
    ok = (before <= gamma) & torch.isfinite(h)
    return select_topk(score, _leading(ok).clamp(min=1))


def local_leap(score: torch.Tensor, tau: float, radius: int, tau_relaxed: float) -> torch.Tensor:
    """LocalLeap: anchors are candidates with confidence >= tau; candidates within `radius` positions of an
    anchor need only tau_relaxed; always the top-1."""
    anchor = candidates(score) & (score >= tau)  # [B, L]
    near = F.max_pool1d(anchor.double()[:, None], 2 * radius + 1, stride=1, padding=radius)[:, 0] > 0
    return anchor | (candidates(score) & near & (score >= tau_relaxed)) | top1(score)


# -- CreditDecoding ----------------------------------------------------------------------------------

def credit_update(
    credit: torch.Tensor, logits: torch.Tensor, masked: torch.Tensor, beta: float, gamma: float
) -> torch.Tensor:
    """CreditDecoding trace credits (dInfer `CreditThresholdParallelDecoder`): decay every credit by beta, then
    give each masked position's current top-1 token p_top1^gamma more credit.

    credit `[B, L, V]` float32, logits `[B, L, V]`, masked `[B, L]` -> the new credit.
    """
    p1, top = logits.float().softmax(dim=-1).max(dim=-1)  # [B, L]
    boost = (p1.pow(gamma) * masked)[..., None]  # [B, L, 1]
    return (credit * beta).scatter_add(-1, top[..., None], boost)


def credit_fuse(logits: torch.Tensor, credit: torch.Tensor, alpha: float) -> torch.Tensor:
    """Logits fused with the credits: logits + alpha * log(1 + C)."""
    return logits + alpha * credit.log1p()


# -- Prophet ------------------------------------------------------------------------------------------

def prophet_threshold(progress: torch.Tensor, levels: tuple[float, float, float] = (7.5, 5.0, 2.5)) -> torch.Tensor:
    """`[B]` decoding progress in [0, 1] -> the logit gap needed to stop early: levels[0] before 1/3 of the
    steps (0.33), levels[1] before 2/3 (0.67), then levels[2] (Prophet `generate_earlyexit`)."""
    hi, mid, lo = levels
    return torch.where(progress < 0.33, hi, torch.where(progress < 0.67, mid, lo)).double()


def prophet_exit(
    gap: torch.Tensor, masked: torch.Tensor, progress: torch.Tensor, levels=(7.5, 5.0, 2.5)
) -> torch.Tensor:
    """`[B, L]` top-2 logit gaps, `[B, L]` the masks they average over, `[B]` progress -> `[B]` bool: commit all
    remaining masks now, because the mean gap over them reached the threshold."""
    n = masked.sum(dim=-1)
    mean = (gap * masked).nan_to_num(0.0).sum(dim=-1) / n.clamp(min=1)
    return (n > 0) & (mean >= prophet_threshold(progress, levels))


# -- R²-dLLM ------------------------------------------------------------------------------------------

def window_average(masked: torch.Tensor, conf: torch.Tensor, inview: torch.Tensor, size: int = 3,
                   max_unmasked: int = 1, tau: float = 0.8) -> torch.Tensor:
    """R²-dLLM spatial rule: every window of `size` positions (inside the view) that holds at most
    `max_unmasked` decoded tokens and whose masked positions average confidence >= tau is committed whole.

    masked, inview `[B, L]` bool; conf `[B, L]` p(x0) -> `[B, L]` bool (masked positions only).
    """
    B, L = masked.shape
    if L < size:
        return torch.zeros_like(masked)
    win = lambda t: t.unfold(-1, size, 1)  # noqa: E731  [B, L-size+1, size]
    m, full = win(masked), win(inview).all(dim=-1)
    n = m.sum(dim=-1)
    mean = win(torch.where(masked, conf, 0.0)).sum(dim=-1) / n.clamp(min=1)
    good = full & (n > 0) & (size - n <= max_unmasked) & (mean >= tau)  # [B, W]
    kernel = torch.ones(1, 1, size, dtype=torch.float64, device=good.device)
    cover = F.conv_transpose1d(good.double()[:, None], kernel)[:, 0] > 0  # [B, L]: inside some good window
    return cover & masked


def cluster_one(masked: torch.Tensor, x0: torch.Tensor, conf: torch.Tensor, tau: float = 0.8) -> torch.Tensor:
    """R²-dLLM token-cluster rule: in each run of >= 2 adjacent masked positions that predict the same token,
    if the run's best confidence exceeds tau, commit that one position (duplicates are decoded one at a time).

    masked `[B, L]`, x0 `[B, L]`, conf `[B, L]` -> `[B, L]` bool.
    """
    B, L = masked.shape
    same = torch.zeros_like(masked)
    same[:, 1:] = masked[:, 1:] & masked[:, :-1] & (x0[:, 1:] == x0[:, :-1])  # continues the run on its left
    run = (~same).long().cumsum(dim=-1) - 1  # [B, L] run id; a masked position joins its left neighbour's run
    c = torch.where(masked, conf.double(), NEG_INF)
    best = torch.full((B, L), NEG_INF, dtype=torch.float64, device=c.device).scatter_reduce(1, run, c, "amax")
    length = torch.zeros(B, L, dtype=torch.long, device=c.device).scatter_add(1, run, masked.long())
    pos = torch.arange(L, device=c.device).expand(B, L)
    at_best = masked & (c == best.gather(1, run))
    first = torch.full((B, L), L, device=c.device).scatter_reduce(1, run, torch.where(at_best, pos, L), "amin")
    return masked & (pos == first.gather(1, run)) & (length.gather(1, run) >= 2) & (best.gather(1, run) > tau)


def streaks(
    token: torch.Tensor, count: torch.Tensor, x0: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """R²-dLLM temporal tracking: at `active` positions, extend the run of steps predicting the same token
    (or start one at 1); elsewhere the run is cleared. `[B, L]` each -> (token, count)."""
    kept = active & (token == x0)
    count = torch.where(active, torch.where(kept, count + 1, 1), 0)
    return torch.where(active, x0, -1), count


# -- Coherent contextual decoding -------------------------------------------------------------------

def consistent(score: torch.Tensor, x0: torch.Tensor, history: list[torch.Tensor],
               v: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CCD cross-step consistency: the current top-v set by score, and those of its positions that were in
    every remembered step's top set predicting the same token as now.

    history: `[B, L]` tokens a past step's top set predicted (-1 outside that set); v: int or `[B]`.
    -> (top set, consistent), `[B, L]` bool each.
    """
    top = select_topk(score, torch.as_tensor(v, device=score.device).expand(score.shape[0]))
    ok = top.clone() if history else torch.zeros_like(top)
    for past in history:
        ok &= past == x0
    return top, ok
