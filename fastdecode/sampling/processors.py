"""Pure logits -> logits transforms. Each takes `[B, V]` float logits and returns new logits.

Applied in the order transformers applies them: repetition penalty, temperature, top-k, top-p, min-p.
Removed tokens get -inf, so a later softmax gives them probability 0.
"""

from __future__ import annotations

import torch


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty (Keskar et al. 2019): divide positive, multiply negative logits of seen tokens.

    `seen` is a `[B, V]` bool mask of tokens already in the prompt or output.
    """
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    return logits if t == 1.0 else logits / t


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (ties at the k-th value are kept); k <= 0 keeps all."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of top tokens whose mass reaches p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # mass of strictly better tokens
    drop_sorted = mass_before >= p  # the top token always has mass_before 0, so it is kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Min-p filtering (Nguyen et al. 2024): drop tokens whose probability is below p times the top probability."""
    if p <= 0.0:
        return logits
    probs = logits.softmax(-1)
    threshold = p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))
