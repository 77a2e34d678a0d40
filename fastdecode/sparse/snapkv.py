"""sparse.snapkv: SnapKV (Li et al. 2024), prompt KV compression. At the end of the prefill the last `window`
prompt queries (the observation window) score every prompt column by their attention weights (softmax over the
whole prompt, the window causal); the weights of the columns before the window (the prefix) are summed over the
window's queries and average-pooled over `kernel` neighbouring prefix columns (zero-padded at the ends); each head
keeps the best `budget - window` prefix columns plus the window. Decoding reads those and every generated token;
the other prompt columns are never read again, so a compacting cache could drop them (this one keeps them:
`held_columns` says what SnapKV would hold). Every layer takes part (SnapKV compresses all layers).

As in the authors' code (`snapkv_utils.py`: the keys are repeated per query head before they are scored and
compressed) each query head keeps its own columns (`per_query_head=True`), and no sinks are forced (`sinks=0`);
`per_query_head=False` sums a group's weights so its key/value head keeps one set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig


@dataclass(frozen=True)
class SnapKVConfig(SparseConfig):
    TOP_K: ClassVar[bool] = True
    window: int = 32  # observation window: the last prompt queries (SnapKV: 32)
    kernel: int = 5  # average pooling width (SnapKV: 5)
    dense_layers: int = 0
    sinks: int = 0  # SnapKV forces no attention sinks: the pooled scores alone choose the prefix columns
    recent: int = 1  # no recent window either: the observation window and every generated token are kept
    per_query_head: bool = True  # the authors repeat the keys per query head before they compress them

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.window >= 1, "window", self.window, "must be >= 1")
        check(self.window < self.budget, "window", self.window, f"must be below budget ({self.budget})")
        check(self.kernel >= 1 and self.kernel % 2 == 1, "kernel", self.kernel, "must be an odd number >= 1")


class SnapKVSelector(Selector):
    cfg: SnapKVConfig

    def reset(self) -> None:
        self.kept: dict[int, torch.Tensor] = {}  # layer -> [B, H, prompt] bool (H: key/value or query heads)
        self.held: dict[int, float] = {}  # layer -> prompt columns a key/value head holds (its group's union)
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
        if not self.cfg.per_query_head:
            p = p.reshape(B, Hkv, g, K).sum(2)
        H, prefix = p.shape[1], K - w
        n = max(0, min(self.cfg.budget - w, prefix))
        kept = torch.zeros(B, H, K, dtype=torch.bool, device=k.device)
        if n:  # pooled over the prefix alone, so the window's own weights never spill into its neighbours' scores
            pad = self.cfg.kernel // 2
            pooled = F.avg_pool1d(p[..., :prefix].reshape(B * H, 1, prefix), self.cfg.kernel, 1, pad)
            kept[..., :prefix].scatter_(-1, pooled.reshape(B, H, prefix).topk(n, -1).indices, True)
        kept[..., prefix:] = True
        self.kept[layer], self.prompt = kept, K
        self.held[layer] = float(kept.reshape(B, Hkv, -1, K).any(2).sum(-1).float().mean())

    def choose(self, layer, q, k, mask, visible) -> Selection | None:
        kept = self.kept.get(layer)
        if kept is None:  # no prefill seen (a rule handed a running cache): dense
            return None
        B, H, K = k.shape[0], kept.shape[1], k.shape[2]
        P = kept.shape[2]
        scores = torch.full((B, H, K), 2.0, device=k.device)  # generated columns: always read
        scores[..., :P] = torch.where(kept, 1.0, float("-inf"))
        return Selection(self.top(scores, visible, int(kept.sum(-1).max()) + (K - P) + self.cfg.sinks))

    def held_columns(self, context: int, heads: int, layers: int) -> float:
        prompt = self.prompt or context
        held = sum(self.held.values()) / len(self.held) if self.held else min(prompt, self.cfg.budget)
        return float(heads * layers * (held + max(0, context - prompt)))


register_rule(
    "snapkv", SnapKVSelector, SnapKVConfig,
    description="SnapKV: the prefill's observation window keeps the top prompt columns per head.",
)
