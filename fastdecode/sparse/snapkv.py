"""sparse.snapkv: SnapKV (Li et al. 2024), prompt KV compression. At the end of the prefill the last `window`
prompt queries (the observation window) score every prompt column by their attention weights, summed and
average-pooled over `kernel` neighbouring columns; each key/value head keeps the best `budget - window` prompt
columns plus the window. Decoding reads those and every generated token; the other prompt columns are never read
again, so a compacting cache could drop them (this one keeps them: `held_columns` says what SnapKV would hold).
Every layer takes part (SnapKV compresses all layers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig


@dataclass(frozen=True)
class SnapKVConfig(SparseConfig):
    window: int = 32  # observation window: the last prompt queries (SnapKV: 32)
    kernel: int = 5  # average pooling width (SnapKV: 5)
    dense_layers: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.window >= 1, "window", self.window, "must be >= 1")
        check(self.window < self.budget, "window", self.window, f"must be below budget ({self.budget})")
        check(self.kernel >= 1 and self.kernel % 2 == 1, "kernel", self.kernel, "must be an odd number >= 1")


class SnapKVSelector(Selector):
    cfg: SnapKVConfig

    def reset(self) -> None:
        self.kept: dict[int, torch.Tensor] = {}  # layer -> [B, Hkv, prompt] bool
        self.prompt = 0

    def observe(self, layer, q, k, mask) -> None:
        if q.shape[2] <= self.cfg.max_queries:
            return
        B, Hkv, K, D = k.shape
        w = min(self.cfg.window, q.shape[2])
        g = q.shape[1] // Hkv
        qw = q[:, :, -w:]
        s = torch.matmul(qw, k.repeat_interleave(g, dim=1).transpose(-1, -2)) / D**0.5  # [B, Hq, w, K]
        p = s.masked_fill(~mask[:, :, -w:], float("-inf")).softmax(-1).nan_to_num(0.0).sum(2)  # [B, Hq, K]
        p = p.reshape(B, Hkv, g, K).sum(2)
        pad = self.cfg.kernel // 2
        pooled = F.avg_pool1d(p.reshape(B * Hkv, 1, K), self.cfg.kernel, 1, pad, count_include_pad=False)
        pooled = pooled.reshape(B, Hkv, K)
        prefix = K - w
        n = max(0, min(self.cfg.budget - w, prefix))
        kept = torch.zeros(B, Hkv, K, dtype=torch.bool, device=k.device)
        if n:
            kept[..., :prefix].scatter_(-1, pooled[..., :prefix].topk(n, -1).indices, True)
        kept[..., prefix:] = True
        self.kept[layer], self.prompt = kept, K

    def choose(self, layer, q, k, mask, visible) -> Selection | None:
        kept = self.kept.get(layer)
        if kept is None:  # no prefill seen (a rule handed a running cache): dense
            return None
        B, Hkv, K = k.shape[0], k.shape[1], k.shape[2]
        P = kept.shape[2]
        scores = torch.full((B, Hkv, K), 2.0, device=k.device)  # generated columns: always read
        scores[..., :P] = torch.where(kept, 1.0, float("-inf"))
        return Selection(self.top(scores, visible, int(kept.sum(-1).max()) + (K - P) + self.cfg.sinks))

    def held_columns(self, context: int, heads: int, layers: int) -> float:
        prompt = self.prompt or context
        return float(heads * layers * (min(prompt, self.cfg.budget) + max(0, context - prompt)))


register_rule(
    "snapkv", SnapKVSelector, SnapKVConfig,
    description="SnapKV: the prefill's observation window keeps the top prompt columns per head.",
)
