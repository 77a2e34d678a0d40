"""Acceptance rules of speculative decoding: pure functions from a draft and the target's logits to a verdict.

Notation follows Leviathan et al. 2023 (arXiv 2211.17192) and Chen et al. 2023 (arXiv 2302.01318):
x_1..x_k are the drafted tokens, q_i the drafter's distribution at draft position i, p_i the target's.
The target scores all k + 1 positions in one forward; position k + 1 gives the bonus token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from .. import sampling
from ..models.base import on_host
from ..sampling.pipeline import LogitsPipeline


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one chain draft.

    `tokens` holds the `accepted` draft tokens followed by one token from the target: the correction at
    the first rejected position, or the bonus token when the whole draft was accepted.
    """

    accepted: int
    tokens: list[int]
    read: torch.Tensor | None = None  # on the host: what was read with the verdict beside it (`Reading`)
    nodes: tuple[int, ...] | None = None  # a tree verdict: the accepted path's nodes, root to leaf
    # a tree left on the device (`tree.DeviceTree`): its parents and the order it was verified in (None: as drafted),
    # read with the verdict
    parents: list[int] | None = None
    order: list[int] | None = None


# a chain's acceptance rule at temperature > 0: (draft [k], q [k, V] or None, p [k + 1, V], generator, also: integers
# where p is to read with the verdict, or None) -> Verdict; `verify_sampling` unless a method passes its own (a
# relaxed, lossy rule: speculative/relaxed.py)
Acceptance = Callable[[torch.Tensor, "torch.Tensor | None", torch.Tensor, "torch.Generator | None",
                       "torch.Tensor | None"], Verdict]


def target_distribution(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """`[T, V]` logits -> `[T, V]` probabilities after temperature, top-k, top-p and min-p, with no history.

    For drafters' q; the target's p at verification comes from the request's `LogitsPipeline`
    (`sampling/pipeline.py`), which also applies history-dependent processors (repetition penalty) per position.
    """
    cfg = SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if temperature == 0:  # callers pass 0 only for a softmax of the raw logits
        return logits.float().softmax(-1)
    return LogitsPipeline.from_config(cfg).distributions(logits)


@dataclass(frozen=True)
class Reading:
    """A greedy verdict waiting for its one read: `wanted`, integers `[n]` where the logits are (the argmaxes, the
    drafts left there, what the drafter asked), and how the verdict follows from their values on the host. Several
    rows' readings are read together (`read_all`): one synchronisation a step on a GPU, where reading each row's apart
    would wait once a row."""

    wanted: torch.Tensor
    finish: Callable[[list[int]], Verdict]

    def verdict(self) -> Verdict:
        return self.finish(self.wanted.tolist())


def read_all(readings: list[Reading]) -> list[Verdict]:
    """Each reading's verdict, every `wanted` copied to the host in one read (they are where the target's logits
    are: a draft is in `wanted` only where it was left there)."""
    if len(readings) == 1:  # (no cat: one host operation fewer a step, tests/invariants/test_host_ops.py)
        return [readings[0].verdict()]
    values = torch.cat([r.wanted for r in readings]).tolist()
    out, at = [], 0
    for r in readings:
        n = r.wanted.numel()
        out.append(r.finish(values[at : at + n]))
        at += n
    return out


def wanted(parts: list[torch.Tensor], also: torch.Tensor | None) -> torch.Tensor:
    """`[n]` the integers to read: `parts` flattened, then `also` (any shape), as one tensor where they are."""
    flat = [t.reshape(-1) for t in parts] + ([also.reshape(-1).to(parts[0].dtype)] if also is not None else [])
    return torch.cat(flat) if len(flat) > 1 else flat[0]


def float_bits(x: torch.Tensor) -> torch.Tensor:
    """Floating values (float32 or narrower: exact in float32) as int64 integers holding their float32 bits, so that
    they travel in one integer copy beside token ids (one read, where a second copy would wait again); `from_bits`
    turns them back. (Not float64 for both: MPS has none.)"""
    return x.float().contiguous().view(torch.int32).long()


def from_bits(bits: torch.Tensor | list[int]) -> torch.Tensor:
    """The values `float_bits` read (host integers, any shape), as a float32 host tensor of that shape."""
    return torch.as_tensor(bits).to(torch.int32).view(torch.float32)


def as_read(values: list[int], also: torch.Tensor | None) -> torch.Tensor | None:
    """`also`'s values, read, as a host tensor of its shape (`Verdict.read`); None without it."""
    return None if also is None else torch.tensor(values, dtype=also.dtype).view(also.shape)


def with_drafts(draft: torch.Tensor | list[int], best: torch.Tensor
                ) -> tuple[list[torch.Tensor], Callable[[list[int]], tuple[list[int], list[int]]]]:
    """What a greedy verdict reads beside the argmaxes `best`: the drafts too where a drafter left them unread beside
    them on a device (a model's greedy chain, a tree grown there), in the same copy; drafts on the host are compared
    there, not copied to the device. Returns the tensors to read, in order, and how the values read split into the
    drafts' and the rest."""
    if isinstance(draft, torch.Tensor) and draft.device == best.device and not on_host(best.device):
        k = draft.numel()
        return [draft, best], lambda values: (values[:k], values[k:])
    drafted = draft.tolist() if isinstance(draft, torch.Tensor) else list(draft)
    return [best], lambda values: (drafted, values)


def greedy_reading(draft: torch.Tensor, logits: torch.Tensor, also: torch.Tensor | None = None) -> Reading:
    """`verify_greedy`, its read left to the caller (`Reading`)."""
    k = draft.numel()
    best = sampling.greedy(logits)  # [k + 1], ties to the lowest id as in ar.greedy
    parts, split = with_drafts(draft, best)

    def finish(values: list[int]) -> Verdict:
        here, values = split(values)
        best_ids = values[: k + 1]
        n = next((i for i in range(k) if here[i] != best_ids[i]), k)
        return Verdict(n, best_ids[: n + 1], as_read(values[k + 1 :], also))  # best[:n] equals the accepted draft

    return Reading(wanted(parts, also), finish)


def verify_greedy(draft: torch.Tensor, logits: torch.Tensor, also: torch.Tensor | None = None) -> Verdict:
    """Accept the longest draft prefix equal to the target's argmax, then emit the target's own token.

    draft: `[k]` token ids; logits: `[k + 1, V]` target logits (row i predicts the token after x_i), already through
    the request's pipeline when it has processors that can change the argmax (repetition penalty). `also`: integers
    beside the logits read with the argmax (`Verdict.read`: a drafter's `reads`). One copy to the host: one
    synchronisation on a GPU.
    """
    return greedy_reading(draft, logits, also).verdict()


def verify_sampling(
    draft: torch.Tensor,  # [k] x_1..x_k, drawn from q
    q: torch.Tensor | None,  # [k, V] the drafter's distributions; None for a deterministic drafter (q one-hot)
    p: torch.Tensor,  # [k + 1, V] the target's distributions, processors already applied
    generator: torch.Generator | None,
    also: torch.Tensor | None = None,  # integers where p is, read with the verdict (`Verdict.read`)
) -> Verdict:
    """Speculative sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit
    y ~ norm(max(p_i - q_i, 0)); if all k are accepted emit the bonus y ~ p_{k+1}. The emitted tokens are
    distributed exactly as k + 1 ancestral samples from p would be (Leviathan et al., Theorem 3.5).
    """
    k = draft.numel()
    x = draft.to(p.device)
    rows = torch.arange(k, device=p.device)
    p_x = p[rows, x]  # [k]
    q_x = q[rows, x] if q is not None else torch.ones_like(p_x)  # a deterministic drafter proposes x with q = 1
    u = torch.rand(k, generator=generator, device=p.device)  # [k]
    if k == 0:
        values = wanted([torch.multinomial(p[0], 1, generator=generator)], also).tolist()
        return Verdict(0, values[:1], as_read(values[1:], also))
    accept = u * q_x < p_x  # u < p/q without dividing; P(accept) = min(1, p/q)
    # what follows stays on the device and is read once at the end (one synchronisation a step on a GPU): the number
    # accepted n, the row drawn from (the bonus token's p_{k+1} when n == k, else the residual at n) and the draw
    n = accept.long().cumprod(0).sum().view(1)  # [1]
    at = n.clamp(max=k - 1)  # the rejected position when n < k (unused when n == k)
    p_n = p.index_select(0, n)[0]  # [V]
    residual = _residual(p_n, q.index_select(0, at)[0] if q is not None else None, x.index_select(0, at))
    y = torch.multinomial(torch.where(n == k, p_n, residual), 1, generator=generator)  # [1]
    values = wanted([n, y, x], also).tolist()
    accepted = values[0]
    return Verdict(accepted, values[2 : 2 + accepted] + [values[1]], as_read(values[2 + k :], also))


def _residual(p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """`[V]` unnormalised max(p - q, 0); with q one-hot at x (`[1]`, where p is) that is p with x removed. Nothing
    is read: the choice below is made on the device."""
    r = p.scatter(0, x, 0.0) if q is None else (p - q).clamp(min=0.0)
    # p == q leaves nothing; rejection then had probability 0 up to rounding, and p itself is the right law
    return torch.where(r.sum() > 0, r, p)
