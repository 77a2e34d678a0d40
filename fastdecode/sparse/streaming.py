"""sparse.streaming: StreamingLLM (Xiao et al. 2024): the first `sinks` tokens and a window of the most recent
ones, `budget` columns in all; nothing else is read, so nothing else need be kept."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig


@dataclass(frozen=True)
class StreamingConfig(SparseConfig):
    """The window is `budget - sinks` tokens (`recent` is ignored: the whole budget is the window)."""

    def check_window(self) -> None:
        check(self.sinks < self.budget, "budget", self.budget,
              f"must exceed the sinks ({self.sinks}): the rest of the budget is the recent window")


class StreamingSelector(Selector):
    def window(self) -> int:
        return self.cfg.budget - self.cfg.sinks

    def always(self, visible: torch.Tensor) -> torch.Tensor:
        rank = visible.long().cumsum(-1)
        total = rank[:, -1:]
        recent = max(self.window(), self._queries)
        return visible & ((rank <= self.cfg.sinks) | (rank > total - recent))

    def choose(self, layer, q, k, mask, visible) -> Selection:
        none = torch.full((k.shape[0], k.shape[1], k.shape[2]), float("-inf"), device=k.device)
        return Selection(self.top(none, visible, self.cfg.budget + self._queries))

    def held_columns(self, context: int, heads: int, layers: int) -> float:
        dense = min(self.cfg.dense_layers, layers)
        return float(heads * (dense * context + (layers - dense) * min(context, self.cfg.budget)))


register_rule(
    "streaming", StreamingSelector, StreamingConfig,
    description="StreamingLLM: attention sinks plus a recent window of `budget` tokens in all.",
)
