"""Relaxed (lossy) acceptance rules for image models, over a codebook's geometry: LANTERN's and GSD's.

Both replace speculative sampling's min(1, p(x)/q(x)) for a chain draft (`verify.Acceptance`) and consume the
generator exactly as `verify.verify_sampling` does (k uniforms, then one draw), so with no relaxation (LANTERN at
delta = 0, GSD with a group of one) they give its verdicts draw for draw.

- LANTERN (Jang et al., ICLR 2025; `jadohu/LANTERN`, `models/ea_model_llamagen.py`): the draft x's k nearest codes
  by codebook distance (x excluded, nearest first), the longest prefix A of them whose target mass p(A) <= delta,
  and the relaxed target p~ that moves A's mass onto x (TVD(p~, p) = p(A) <= delta). Accept w.p.
  min(1, p~(x)/q(x)); on rejection draw from norm(max(p~ - q, 0)), i.e. speculative sampling against p~.
- GSD (So et al., ICCV 2025; `junhyukso/GSD`, `scheduler/jacobi_iteration_lumina_mgpt.py`): the group G of x is
  the tokens within +-`ranks` of x in the target's probability order whose |p(g) - p(x)| < `prob_gap` and whose
  codebook distance to x is < `max_dist` (x always in). Accept w.p. min(1, p(G)/q(G)); on rejection draw from
  norm(max(p - q, 0)), as the authors do.
"""

from __future__ import annotations

import torch

from .verify import Verdict, as_read, wanted


def neighbour_order(codebook: torch.Tensor) -> torch.Tensor:
    """`[K, d]` code vectors -> `[K, K - 1]` long: each code's other codes, nearest first (L2; ties to lower id)."""
    dist = torch.cdist(codebook.float(), codebook.float())  # [K, K]
    dist.fill_diagonal_(float("inf"))
    K = codebook.shape[0]
    order = torch.sort(dist, dim=-1, stable=True).indices  # [K, K]
    return order[:, : K - 1]


def code_distances(codebook: torch.Tensor) -> torch.Tensor:
    """`[K, d]` -> `[K, K]` L2 distances between code vectors."""
    return torch.cdist(codebook.float(), codebook.float())


def lantern_target(p: torch.Tensor, x: int, neighbours: torch.Tensor, delta: float) -> torch.Tensor:
    """`[V]` target -> `[V]` LANTERN's relaxed target for draft x: the mass of x's nearest codes (`neighbours`, `[k]`
    nearest first), as many as keep the moved mass <= delta, moved onto x."""
    if x >= neighbours.shape[0]:  # not a code: no neighbours
        return p
    near = neighbours[x].to(p.device)  # [k]
    cum = p[near].cumsum(0)  # [k], non-decreasing
    take = int((cum <= delta).sum())
    if take == 0:
        return p
    relaxed = p.clone()
    relaxed[near[:take]] = 0.0
    relaxed[x] = p[x] + cum[take - 1]
    return relaxed


def gsd_group(p: torch.Tensor, x: int, ranks: int, prob_gap: float, max_dist: float,
              distances: torch.Tensor) -> torch.Tensor:
    """`[V]` target -> the `[G]` ids of x's group: within +-ranks of x in p's order (likeliest first), |p - p(x)| <
    prob_gap and codebook distance to x < max_dist; x itself always."""
    if ranks == 0 or x >= distances.shape[0]:
        return torch.tensor([x], device=p.device)
    order = torch.sort(p, descending=True, stable=True).indices  # [V]
    r = int((order == x).nonzero()[0, 0])
    window = order[max(0, r - ranks) : r + ranks + 1]  # [<= 2 ranks + 1]
    window = window[window < distances.shape[0]]  # only codes have a place in the codebook
    close = ((p[window] - p[x]).abs() < prob_gap) & (distances[x].to(p.device)[window] < max_dist)
    group = window[close]
    return group if bool((group == x).any()) else torch.cat([group, torch.tensor([x], device=p.device)])


def verify_lantern(draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None,
                   also: torch.Tensor | None = None, *, neighbours: torch.Tensor, delta: float) -> Verdict:
    """LANTERN's relaxed speculative sampling of a chain: `[k]` draft, `[k, V]` q (None: one-hot), `[k + 1, V]` p;
    `also` as `verify.verify_sampling`'s."""
    k = draft.numel()
    x = draft.to(p.device)
    targets = lantern_targets(p[:k], x, neighbours, delta)  # [k, V]
    rows = torch.arange(k, device=p.device)
    num = targets[rows, x]  # [k]
    q_x = q.to(p.device)[rows, x] if q is not None else torch.ones_like(num)
    return _settle(x, num, q_x, p, q, list(targets), generator, also)


def lantern_targets(p: torch.Tensor, x: torch.Tensor, neighbours: torch.Tensor, delta: float) -> torch.Tensor:
    """`[k, V]` targets and `[k]` drafts -> `[k, V]`: `lantern_target` of every row at once."""
    k, V = p.shape
    K, n = neighbours.shape
    if k == 0 or n == 0:
        return p
    rows = torch.arange(k, device=p.device)
    code = x < K  # [k] only codes have neighbours
    near = neighbours.to(p.device)[x.clamp(max=K - 1)]  # [k, n]
    cum = p.gather(1, near).cumsum(-1)  # [k, n] non-decreasing
    take = (cum <= delta).sum(-1) * code  # [k] neighbours moved onto x
    moved = torch.where(take > 0, cum[rows, (take - 1).clamp(min=0)], torch.zeros_like(cum[:, 0]))  # [k]
    out = p.clone()
    drop = torch.arange(n, device=p.device)[None, :] < take[:, None]  # [k, n]
    out.scatter_(1, near, p.gather(1, near) * ~drop)
    out[rows, x] = p[rows, x] + moved
    return out


def verify_gsd(draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None,
               also: torch.Tensor | None = None, *, ranks: int, prob_gap: float, max_dist: float,
               distances: torch.Tensor) -> Verdict:
    """GSD's grouped speculative sampling of a chain: accept x_i w.p. min(1, p_i(G_i) / q_i(G_i)); `also` as
    `verify.verify_sampling`'s."""
    k = draft.numel()
    x = draft.to(p.device)
    member = group_mask(p[:k], x, ranks, prob_gap, max_dist, distances)  # [k, V]
    num = (p[:k] * member).sum(-1)  # [k]
    den = (q.to(p.device) * member).sum(-1) if q is not None else torch.ones_like(num)  # one-hot q: x is in G
    return _settle(x, num, den, p, q, [p[i] for i in range(k)], generator, also)


def group_mask(p: torch.Tensor, x: torch.Tensor, ranks: int, prob_gap: float, max_dist: float,
               distances: torch.Tensor) -> torch.Tensor:
    """`[k, V]` target rows and `[k]` drafts -> `[k, V]` bool: each row's group (`gsd_group`, all rows at once)."""
    k, V = p.shape
    rows = torch.arange(k, device=p.device)
    member = torch.zeros(k, V, dtype=torch.bool, device=p.device)
    member[rows, x] = True
    if ranks == 0 or k == 0:
        return member
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices  # [k, V]
    rank_x = torch.argsort(order, dim=-1)[rows, x]  # [k]
    offsets = torch.arange(-ranks, ranks + 1, device=p.device)  # [2R + 1]
    at = rank_x[:, None] + offsets[None, :]  # [k, 2R + 1]
    inside = (at >= 0) & (at < V)
    ids = order.gather(1, at.clamp(0, V - 1))  # [k, 2R + 1]
    K = distances.shape[0]
    code = (ids < K) & (x[:, None] < K)
    near = distances.to(p.device)[x.clamp(max=K - 1)[:, None], ids.clamp(max=K - 1)] < max_dist  # [k, 2R + 1]
    similar = (p.gather(1, ids) - p[rows, x][:, None]).abs() < prob_gap
    keep = inside & code & near & similar
    # scatter_add: clamped ids outside the window repeat real ones, and must not overwrite their verdict
    hits = torch.zeros(k, V, dtype=torch.long, device=p.device).scatter_add_(1, ids, keep.long())
    return member | (hits > 0)


def _settle(x: torch.Tensor, num: torch.Tensor, den: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None,
            targets: list[torch.Tensor], generator: torch.Generator | None, also: torch.Tensor | None) -> Verdict:
    """Accept x_i while u_i * den_i < num_i (w.p. min(1, num/den)), then one draw: the residual max(t - q, 0) of
    the first rejected position's target t, or the bonus from p's last row. The same draws as verify_sampling.
    (It reads as it decides; `also` comes in its last read, with the accepted drafts.)"""
    k = x.numel()
    u = torch.rand(k, generator=generator, device=p.device)  # [k]
    accept = u * den < num
    n = int(accept.long().cumprod(0).sum())
    if n == k:
        residual = p[k]
    else:
        t = targets[n]
        if q is None:
            r = t.clone()
            r[int(x[n])] = 0.0
        else:
            r = (t - q[n].to(p.device)).clamp(min=0.0)
        residual = r if float(r.sum()) > 0 else t
    y = int(torch.multinomial(residual, 1, generator=generator))
    values = wanted([x[:n]], also).tolist()
    return Verdict(n, values[:n] + [y], as_read(values[n:], also))
