"""sparse.oracle: the exact top-`budget` columns of every head by this step's attention weights (summed over the
forward's queries and a key/value head's query heads; with `per_query_head`, one set per query head). It reads every
key to choose, so it saves no time: it is the accuracy ceiling of a token budget, the yardstick of the cheaper
rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..attention import register_rule
from .base import Selection, Selector, SparseConfig, query_scores


@dataclass(frozen=True)
class OracleConfig(SparseConfig):
    TOP_K: ClassVar[bool] = True
    pass


class OracleSelector(Selector):
    def choose(self, layer, q, k, mask, visible) -> Selection:
        self.add_reads(k.shape[0] * k.shape[1] * k.shape[2])  # every key, to score it
        return Selection(self.top(query_scores(q, k, mask, self.cfg.per_query_head), visible))


register_rule(
    "oracle", OracleSelector, OracleConfig,
    description="Exact top-k columns per head by attention weight (the accuracy ceiling of a budget).",
)
