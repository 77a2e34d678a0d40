"""sparse.lychee: LycheeDecode's hybrid heads (Lin et al. 2026). In every sparse layer a few retrieval heads
attend densely and pick the top-`budget` columns by their attention weights; the other (sparse) heads of that
layer and of the following layers read the columns the latest retrieval heads picked, shared by all sparse heads.
The retrieval heads are the `retrieval_heads` heads per layer with the most far attention weight in the model's
calibration (`calibration.py`; LycheeDecode trains HardKuma gates instead, with no code released)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig, query_scores
from .calibration import calibration


@dataclass(frozen=True)
class LycheeConfig(SparseConfig):
    retrieval_heads: int = 1  # per sparse layer

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.retrieval_heads >= 1, "retrieval_heads", self.retrieval_heads, "must be >= 1")


class LycheeSelector(Selector):
    cfg: LycheeConfig

    def retrieval(self, layer: int, heads: int) -> torch.Tensor:
        mass = torch.tensor(calibration(self.model)["far_mass"][layer])
        out = torch.zeros(heads, dtype=torch.bool)
        out[mass.topk(min(self.cfg.retrieval_heads, heads)).indices] = True
        return out

    def choose(self, layer, q, k, mask, visible) -> Selection:
        B, Hkv = k.shape[:2]
        dense = self.retrieval(layer, Hkv).to(k.device)
        g = q.shape[1] // Hkv
        qr = q.reshape(B, Hkv, g, *q.shape[2:])[:, dense].reshape(B, -1, *q.shape[2:])  # retrieval query heads
        picked = self.top(query_scores(qr, k[:, dense], mask).sum(1, keepdim=True), visible)  # [B, 1, n]
        shared = self.state.get("cols", picked)  # the latest retrieval heads' choice (this layer's at the first)
        self.state["cols"] = picked
        return Selection(shared.expand(B, Hkv, -1), dense)


register_rule(
    "lychee", LycheeSelector, LycheeConfig,
    description="LycheeDecode-style hybrid heads: a few dense retrieval heads pick top-k for the sparse heads.",
)
