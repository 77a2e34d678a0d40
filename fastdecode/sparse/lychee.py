"""sparse.lychee: LycheeDecode's hybrid heads (Lin et al. 2026). Selected tokens are shared per *head*: each
key/value head index has its own set of columns. In every sparse layer a few retrieval heads attend densely and
refresh the set of their head index with the top-`budget` columns of their own attention weights (summed over the
head's grouped queries); a sparse head reads the latest set of its index, picked by a retrieval head of that index in
an earlier layer. A head index with no set yet in this step (the first sparse layer, or an index no retrieval head
has served so far) acts as a retrieval head: it attends densely and picks its set, as TidalDecode's first selection
layer does. Sets are chosen anew at every decode step.
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

    def choose(self, layer, q, k, mask, visible) -> Selection | None:
        B, Hkv = k.shape[:2]
        sets: torch.Tensor | None = self.state.get("sets")  # [B, Hkv, n]: each head index's latest set
        served = self.state.get("served", torch.zeros(Hkv, dtype=torch.bool, device=k.device))  # [Hkv]
        dense = self.retrieval(layer, Hkv).to(k.device) | ~served  # retrieval heads, and indices with no set yet
        g = q.shape[1] // Hkv
        qr = q.reshape(B, Hkv, g, *q.shape[2:])[:, dense].reshape(B, -1, *q.shape[2:])  # [B, nd*g, Q, D]
        picked = self.top(query_scores(qr, k[:, dense], mask), visible)  # [B, nd, n]
        sets = picked.new_full((B, Hkv, picked.shape[-1]), -1) if sets is None else sets.clone()
        sets[:, dense] = picked  # the retrieval heads refresh their index's set
        self.state["sets"], self.state["served"] = sets, served | dense
        if bool(dense.all()):
            return None  # every head attends densely in this layer
        return Selection(sets, dense)  # the sparse heads read their index's set from an earlier layer


register_rule(
    "lychee", LycheeSelector, LycheeConfig,
    description="LycheeDecode-style hybrid heads: dense retrieval heads pick top-k for the later sparse heads "
                "of their head index.",
)
