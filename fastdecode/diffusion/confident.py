"""Dimple's confident decoding (Yu et al. 2025, yu-rp/Dimple `generation_utils.py`, `decoding_pipeline="dim"`): the
fallback of a threshold rule when no mask passes, `dlm.threshold(fallback="schedule")`.

Dimple commits every mask above the threshold; when none passes it does not commit just the best one, as
Fast-dLLM does, but the count its step schedule asks for *now*: with timesteps 1 = t_0 > t_1 > ... > t_S = eps
(evenly spaced) and r the share of the masks still masked, it takes the first timestep s below r, at step i
not earlier than t_(i+1), and commits int(m (1 - s / r)) of the m masks (at least one: a later s when the count
rounds to 0; all of them at t_S). A row behind its schedule so catches up, and the last step commits
everything, so a block never takes more than its `block_steps` forwards. Here the schedule runs per block
(Dimple decodes the whole answer as one block), and the fallback takes the most confident masks (Dimple's
`maskgit_plus`; its README's `origin` takes random ones).
"""

from __future__ import annotations

import torch

EPS = 1e-3  # Dimple's `eps`: the last timestep


def schedule_count(masks: int, total: int, step: int, steps: int, eps: float = EPS) -> int:
    """Masks to commit at 0-based `step` of `steps` when `masks` of the block's `total` are left and none passed
    the threshold: Dimple's fallback count (at least 1; all at the last timestep)."""
    if masks <= 0:
        return 0
    times = torch.linspace(1.0, eps, steps + 1, dtype=torch.float64).tolist()
    ratio = masks / total
    below = [j for j, t in enumerate(times) if t < ratio]
    for j in range(max(below[0] if below else steps, step + 1), steps + 1):
        n = int(masks * (1 - times[j] / ratio)) if j < steps else masks
        if n >= 1:
            return n
    return masks


class ConfidentSchedule:
    """Per row: the block it is in, the steps taken there and its masks at the block's start (Dimple's
    `num_total_mask`), so that a step knows its place in the block's schedule."""

    def __init__(self, rows: int, steps: int, device: torch.device) -> None:
        self.steps = steps
        self.block = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.t = torch.zeros(rows, dtype=torch.long, device=device)
        self.total = torch.ones(rows, dtype=torch.long, device=device)

    def commit(self, rows: torch.Tensor, block: torch.Tensor, masked: torch.Tensor, conf: torch.Tensor,
               passed: torch.Tensor) -> torch.Tensor:
        """`[B']` rows, their block ids, `[B', W]` the block's masks, confidences and the positions above the
        threshold -> `[B', W]` the positions to commit: the passed ones, all at the block's last step, else (when
        none passed) the schedule's count of the most confident masks."""
        new = block != self.block[rows]
        self.block[rows[new]], self.t[rows[new]] = block[new], 0
        self.total[rows[new]] = masked[new].sum(-1).clamp(min=1)
        out = passed.clone()
        order = conf.argsort(dim=-1, descending=True, stable=True)  # ties: lowest offset
        for i, r in enumerate(rows.tolist()):
            m, t = int(masked[i].sum()), int(self.t[r])
            if t >= self.steps - 1:
                out[i] = masked[i]
            elif not bool(passed[i].any()):
                out[i, order[i, : schedule_count(m, int(self.total[r]), t, self.steps)]] = True
        self.t[rows] += 1
        return out & masked
