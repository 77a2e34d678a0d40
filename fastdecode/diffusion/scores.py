"""Pure tensor functions of masked-diffusion decoding: predictions, per-position scores, the step schedule.

Notation follows LLaDA's `generate` (Nie et al., 2025): `x0` is the predicted clean token at each
position, `p` its probability (the confidence), `k` the number of positions transferred (committed)
at a step. Probabilities are a float64 softmax, as the reference code computes them. Every score is
"higher = more certain", so one commit rule can rank by any of them.
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


def probs(logits: torch.Tensor) -> torch.Tensor:
    """`[..., V]` -> `[..., V]` float64 softmax."""
    return logits.double().softmax(dim=-1)


def confidence(logits: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """`[..., V]`, `[...]` -> `[...]` float64 p(x0) = softmax(logits)[x0]; the max probability when x0 is the argmax."""
    return probs(logits).gather(-1, x0[..., None]).squeeze(-1)


def margin(logits: torch.Tensor) -> torch.Tensor:
    """`[..., V]` -> `[...]` float64 p_top1 - p_top2 (Dream's `topk_margin`); 0 on a tie for the top."""
    top = probs(logits).topk(2, dim=-1).values  # [..., 2]
    return top[..., 0] - top[..., 1]


def neg_entropy(logits: torch.Tensor) -> torch.Tensor:
    """`[..., V]` -> `[...]` float64 sum_v p log p (nats, <= 0; 0 for a one-hot). Dream's `entropy` score."""
    logp = logits.double().log_softmax(dim=-1)
    return (logp.exp() * logp).nan_to_num(0.0).sum(dim=-1)  # 0 * log 0 = 0 where a logit is -inf


def logit_gap(logits: torch.Tensor) -> torch.Tensor:
    """`[..., V]` -> `[...]` float64 top-1 minus top-2 logit (Prophet's early-commit signal; not probabilities)."""
    top = logits.double().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def random_score(shape: torch.Size, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Uniform noise in [0, 1), float64: LLaDA's `remasking="random"` ranks positions by it."""
    return torch.rand(shape, dtype=torch.float64, device=device, generator=generator)
