"""sparse.tidal: TidalDecode (Yang et al. 2025), position-persistent sparse attention. The first `dense_layers`
layers are dense; a token-selection layer (the first sparse one, and again at `reselect_layer`) attends densely and
keeps the top-`budget` columns of each head by its attention weights; the layers after it read only those columns,
until the next selection layer.

Selection is per query head by default (`per_query_head=True`), as in TidalDecode's reference code
(`src/tidal_build/modify_llama.py` scores after `repeat_kv`, so every query head takes its own top-k);
`per_query_head=False` shares one set per key/value head (summed over its query heads), which reads fewer columns
per key/value head under grouped-query attention. As there, nothing else is forced (`sinks=0`, `recent=1`: the
step's own token). Differences from the authors, with why, are in docs/sparse.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig, query_scores


@dataclass(frozen=True)
class TidalConfig(SparseConfig):
    TOP_K: ClassVar[bool] = True
    reselect_layer: int = 4  # a second token-selection layer (TidalDecode: layer 13 of 32); -1 = none
    sinks: int = 0  # TidalDecode forces no attention sinks
    recent: int = 1  # nor a recent window (the step's own token is always read)
    per_query_head: bool = True  # TidalDecode's reference code: one top-k per query head

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.reselect_layer == -1 or self.reselect_layer > self.dense_layers, "reselect_layer",
              self.reselect_layer, f"must come after the dense layers (> dense_layers = {self.dense_layers}) or be -1")


class TidalSelector(Selector):
    cfg: TidalConfig

    def choose(self, layer, q, k, mask, visible) -> Selection | None:
        cols = self.state.get("cols")
        if cols is None or layer == self.cfg.reselect_layer or cols.shape[0] != k.shape[0]:
            # a selection layer: dense attention, whose weights pick the columns of the layers below
            self.state["cols"] = self.top(query_scores(q, k, mask, self.cfg.per_query_head), visible)
            return None
        return Selection(cols)


register_rule(
    "tidal", TidalSelector, TidalConfig,
    description="TidalDecode: selection layers attend densely and pick the top-k that the next layers reuse.",
)
