"""sparse.duo: DuoAttention (Xiao et al. 2025). A share of the key/value heads are retrieval heads and attend to
the whole cache; the others are streaming heads that read the first `sinks` tokens and a window of the recent ones
(`budget` columns in all) and need keep nothing else. The split comes from the model's calibration
(`calibration.py`: the heads whose question queries put the most weight far back); `retrieval` is the share of
heads kept dense (DuoAttention: 0.25 for MHA models, 0.5 for GQA). Every layer takes part (no dense layers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import register_rule
from ..config import check
from .base import Selection
from .calibration import calibration
from .streaming import StreamingConfig, StreamingSelector


@dataclass(frozen=True)
class DuoConfig(StreamingConfig):
    retrieval: float = 0.25  # share of (layer, head) pairs that stay dense
    dense_layers: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.retrieval <= 1, "retrieval", self.retrieval, "must be in [0, 1]")


def retrieval_heads(far_mass: list[list[float]], share: float) -> torch.Tensor:
    """`[layers, heads]` bool: the `share` of heads with the most far attention weight."""
    mass = torch.tensor(far_mass)
    n = round(share * mass.numel())
    out = torch.zeros(mass.numel(), dtype=torch.bool)
    if n:
        out[mass.flatten().topk(n).indices] = True
    return out.view(mass.shape)


class DuoSelector(StreamingSelector):
    cfg: DuoConfig

    def heads(self) -> torch.Tensor:
        if "retrieval" not in self.state_static:
            self.state_static["retrieval"] = retrieval_heads(calibration(self.model)["far_mass"], self.cfg.retrieval)
        return self.state_static["retrieval"]

    def choose(self, layer, q, k, mask, visible) -> Selection:
        sel = super().choose(layer, q, k, mask, visible)
        sel.dense = self.heads()[layer].to(k.device)
        return sel

    def held_columns(self, context: int, heads: int, layers: int) -> float:
        dense = int(self.heads().sum())
        window = min(context, self.cfg.budget)
        return float(dense * context + (heads * layers - dense) * window)


register_rule(
    "duo", DuoSelector, DuoConfig,
    description="DuoAttention: calibrated retrieval heads dense, streaming heads sinks + recent window.",
)
