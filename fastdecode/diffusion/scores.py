"""Pure tensor functions of masked-diffusion decoding: predictions, scores, schedules, top-k commits.

Notation follows LLaDA's `generate` (Nie et al., 2025): `x0` is the predicted clean token at each
position, `p` its probability (the confidence), `k` the number of positions transferred (committed)
at a step.
"""

from __future__ import annotations

import torch


def num_transfer_tokens(mask_count: torch.Tensor, steps: int) -> torch.Tensor:
    """`[B]` masks -> `[B, steps]` tokens to commit per step: an even split, the remainder to the first steps.

    LLaDA's `get_num_transfer_tokens`: 10 masks over 4 steps -> [3, 3, 2, 2].
    """
    base = mask_count.long() // steps  # [B]
    remainder = mask_count.long() % steps  # [B]
    first = torch.arange(steps, device=mask_count.device) < remainder[:, None]  # [B, steps]
    return base[:, None] + first.long()


def predict(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """`[..., V]` -> `[...]` x0: argmax at temperature 0, else a Gumbel-max draw from softmax(logits / T).

    As LLaDA's `add_gumbel_noise`, in float64 (low-precision Gumbel noise hurts quality, arXiv:2409.02908):
    argmax exp(logits) / (-log u)^T with u ~ U(0, 1). Ties go to the lowest id, as torch.argmax does.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.double()
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return (logits.exp() / (-torch.log(u)) ** temperature).argmax(dim=-1)


def confidence(logits: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """`[..., V]`, `[...]` -> `[...]` float64 p(x0) = softmax(logits)[x0]; the max probability when x0 is the argmax."""
    p = logits.double().softmax(dim=-1)  # [..., V]
    return p.gather(-1, x0[..., None]).squeeze(-1)


def select_topk(score: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`[B, L]` scores, `[B]` counts -> `[B, L]` bool: the k[b] highest finite scores of each row.

    Positions scored -inf are never selected. Ties go to the lowest position (a stable sort), so the
    choice does not depend on the backend's top-k.
    """
    order = score.argsort(dim=-1, descending=True, stable=True)  # [B, L]
    ranks = torch.arange(score.shape[-1], device=score.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, ranks)  # [B, L]: 0 = best
    return (rank < k[:, None]) & (score > float("-inf"))
