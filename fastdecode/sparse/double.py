"""sparse.double: Double Sparsity (Yang et al. 2024). Each key is also stored as a short "label": its `channels`
most important channels (from the model's offline calibration, `calibration.py`: channels ranked by mean |q_d k_d|
over tokens, the authors' "qk" ranking). A step scores every column with the query's same channels against the
labels (reading `channels / head_dim` of the keys, less with `label_bits`), then attends exactly to the
top-`budget` columns of each head. Labels are kept per layer and updated only for columns written since the last
step.

As in the authors' code each query head takes its own top-k (`per_query_head=True`), nothing else is forced
(`sinks=0`, `recent=1`: only the step's own token), and `label_bits` (4 in their default) quantises the label and
query channels of each token to that many bits between their min and max; 0 keeps them exact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig, group_sum
from .calibration import calibration


@dataclass(frozen=True)
class DoubleConfig(SparseConfig):
    TOP_K: ClassVar[bool] = True
    channels: int = 16  # label channels per head (Double Sparsity: head_dim / 8 .. head_dim / 2)
    label_bits: int = 0  # quantise the label channels to this many bits (Double Sparsity: 4); 0 = exact
    sinks: int = 0  # Double Sparsity forces no attention sinks
    recent: int = 1  # nor a recent window (the step's own token is always read)
    per_query_head: bool = True  # the authors' code: one top-k per query head

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.channels >= 1, "channels", self.channels, "must be >= 1")
        check(0 <= self.label_bits <= 8, "label_bits", self.label_bits,
              "must be 0 (exact labels) or 1..8 bits (Double Sparsity uses 4)")


def quantised(x: torch.Tensor, bits: int) -> torch.Tensor:
    """`x` `[..., r]` rounded to `bits` bits per vector between its own min and max (the authors' label
    quantisation, kept as the dequantised values); `bits` 0 returns `x`."""
    if bits <= 0:
        return x
    top = 2**bits - 1
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = top / (hi - lo).masked_fill(hi == lo, 1.0)
    return ((x - lo) * scale).round().clamp(0, top) / scale + lo


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
        new = quantised(k[:, :, start:].gather(3, idx), self.cfg.label_bits)  # [B, Hkv, K - start, r]
        self.labels[layer] = new if old is None or start == 0 else torch.cat([old[:, :, :start], new], 2)
        self.seen[layer] = k.shape[2]

    def choose(self, layer, q, k, mask, visible) -> Selection:
        labels = self.labels[layer]  # [B, Hkv, K, r]
        B, Hkv, K, r = labels.shape
        bits = self.cfg.label_bits or 8 * k.element_size()
        self.add_reads(B * Hkv * K * r / k.shape[-1] * bits / (8 * k.element_size()))
        ch = self.chosen(layer, k)
        g = q.shape[1] // Hkv
        qg = q.reshape(B, Hkv, g * q.shape[2], q.shape[3])
        qc = quantised(qg.gather(3, ch[None, :, None, :].expand(B, -1, qg.shape[2], -1)), self.cfg.label_bits)
        s = torch.matmul(qc, labels.transpose(-1, -2))  # [B, Hkv, gQ, K]
        allow = mask[:, :, None].expand(-1, 1, g, -1, -1).reshape(B, 1, g * q.shape[2], K)
        p = s.masked_fill(~allow, float("-inf")).softmax(-1).nan_to_num(0.0)  # [B, Hkv, gQ, K]
        return Selection(self.top(group_sum(p, q.shape[2], self.cfg.per_query_head), visible))


register_rule(
    "double", DoubleSelector, DoubleConfig,
    description="Double Sparsity: approximate scores from a few calibrated key channels, then exact top-k attention.",
)
