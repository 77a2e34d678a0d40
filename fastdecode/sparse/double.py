"""sparse.double: Double Sparsity (Yang et al. 2024). Each key is also stored as a short "label": its `channels`
most important channels (from the model's offline calibration, `calibration.py`). A step scores every column with
the query's same channels against the labels (reading `channels / head_dim` of the keys), then attends exactly to
the top-`budget` columns of each head. Labels are kept per layer and updated only for columns written since the
last step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig
from .calibration import calibration


@dataclass(frozen=True)
class DoubleConfig(SparseConfig):
    channels: int = 16  # label channels per head (Double Sparsity: head_dim / 8 .. head_dim / 2)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.channels >= 1, "channels", self.channels, "must be >= 1")


class DoubleSelector(Selector):
    cfg: DoubleConfig

    def reset(self) -> None:
        self.labels: dict[int, torch.Tensor] = {}
        self.seen: dict[int, int] = {}

    def chosen(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """`[Hkv, r]` channel indices of this layer."""
        order = calibration(self.model)["channels"][layer]
        r = min(self.cfg.channels, k.shape[-1])
        return torch.tensor([row[:r] for row in order], device=k.device)

    def observe(self, layer, q, k, mask) -> None:
        if layer < self.cfg.dense_layers:
            return
        ch = self.chosen(layer, k)  # [Hkv, r]
        old = self.labels.get(layer)
        start = min(self._dirty, self.seen.get(layer, 0)) if old is not None else 0
        idx = ch[None, :, None, :].expand(k.shape[0], -1, k.shape[2] - start, -1)
        new = k[:, :, start:].gather(3, idx)  # [B, Hkv, K - start, r]
        self.labels[layer] = new if old is None or start == 0 else torch.cat([old[:, :, :start], new], 2)
        self.seen[layer] = k.shape[2]

    def choose(self, layer, q, k, mask, visible) -> Selection:
        labels = self.labels[layer]  # [B, Hkv, K, r]
        B, Hkv, K, r = labels.shape
        self.add_reads(B * Hkv * K * r / k.shape[-1])
        ch = self.chosen(layer, k)
        g = q.shape[1] // Hkv
        qg = q.reshape(B, Hkv, g * q.shape[2], q.shape[3])
        qc = qg.gather(3, ch[None, :, None, :].expand(B, -1, qg.shape[2], -1))  # [B, Hkv, gQ, r]
        s = torch.matmul(qc, labels.transpose(-1, -2))  # [B, Hkv, gQ, K]
        allow = mask[:, :, None].expand(-1, 1, g, -1, -1).reshape(B, 1, g * q.shape[2], K)
        p = s.masked_fill(~allow, float("-inf")).softmax(-1).nan_to_num(0.0).sum(2)
        return Selection(self.top(p, visible))


register_rule(
    "double", DoubleSelector, DoubleConfig,
    description="Double Sparsity: approximate scores from a few calibrated key channels, then exact top-k attention.",
)
