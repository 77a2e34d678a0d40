"""sparse.duo: DuoAttention (Xiao et al. 2025). A share of the key/value heads are retrieval heads and attend to
the whole cache; the others are streaming heads that read the first `sinks` tokens and a window of the recent ones
(`budget` columns in all) and need keep nothing else. Every layer takes part (no dense layers).

Which heads retrieve: the top `retrieval` share of (layer, head) pairs by their trained gate value, as the authors
deploy (`sparsify_attention_heads(alpha, sparsity)` keeps the gates at or above the `sparsity` quantile; they use a
share of 0.25 for MHA models and 0.5 for GQA ones). The gates are DuoAttention's optimisation (`fastdecode train
duo`, `fastdecode/train/duo.py`) and ship beside a zoo model as its head `duo` (`zoo:ar-long/duo`). A model without
gates, or whose weights differ from those the gates were trained on, is ranked instead by its far attention mass
(`calibration.py`: a training-free proxy of our own, not the authors' method): `gates="far_mass"` asks for it.

Sizes: the authors evaluate with 64 sinks and a 256-token window (they train with 128 + 256). The default budget is
320 columns (64 + 256); `sinks=-1` (the default) takes 64 sinks where the budget holds them and a 256-token window,
else a fifth of the budget (the same 1 : 4 split), so that the smaller budgets of a sweep remain valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..attention import register_rule
from ..config import check
from ..errors import IncompatibleMethodError
from .base import Selection
from .calibration import calibration
from .streaming import StreamingConfig, StreamingSelector

SINKS, WINDOW = 64, 256  # the authors' evaluation (scripts/longbench.sh, scripts/niah.sh)
FAR_MASS = "far_mass"


@dataclass(frozen=True)
class DuoConfig(StreamingConfig):
    budget: int = SINKS + WINDOW
    sinks: int = -1  # -1: 64 where the budget holds 64 + 256, else budget // 5
    retrieval: float = 0.25  # share of (layer, head) pairs that stay dense
    dense_layers: int = 0
    gates: str = ""  # "": the model's shipped gates, else the far-mass ranking; "far_mass"; or a gates folder

    def __post_init__(self) -> None:
        if self.sinks == -1:
            object.__setattr__(self, "sinks", SINKS if self.budget >= SINKS + WINDOW else max(1, self.budget // 5))
        super().__post_init__()
        check(0 <= self.retrieval <= 1, "retrieval", self.retrieval, "must be in [0, 1]")


def top_share(scores: torch.Tensor, share: float) -> torch.Tensor:
    """`[layers, heads]` bool: the `share` of heads with the largest `scores` (ties: the earlier head)."""
    n = round(share * scores.numel())
    out = torch.zeros(scores.numel(), dtype=torch.bool)
    if n:
        order = torch.sort(scores.flatten().float(), descending=True, stable=True).indices
        out[order[:n]] = True
    return out.view(scores.shape)


def retrieval_heads(far_mass: list[list[float]], share: float) -> torch.Tensor:
    """`[layers, heads]` bool: the `share` of heads with the most far attention weight."""
    return top_share(torch.tensor(far_mass), share)


def head_scores(model: Any, gates: str) -> tuple[torch.Tensor, str]:
    """`[layers, kv_heads]` scores to rank heads by, and their source: "gates" (trained) or "far_mass"."""
    if gates != FAR_MASS:
        found = _gates(model, gates)
        if found is not None:
            return found, "gates"
    return torch.tensor(calibration(model)["far_mass"]), FAR_MASS


def _gates(model: Any, source: str) -> torch.Tensor | None:
    """The gates named by `source` ("" = those shipped beside a zoo model), or None where none fit the model."""
    from ..heads import head_for, head_names
    from ..heads.duo import DuoGates

    name = str(getattr(model, "name", ""))
    if not source and not (name.startswith("zoo:") and f"{name[4:]}/duo" in head_names()):
        return None
    head = head_for(model, "duo", source or None)
    if not isinstance(head, DuoGates):
        raise IncompatibleMethodError(f"{source or name} does not hold DuoAttention gates.")
    if not head.fits(model):
        if source:
            raise IncompatibleMethodError(
                f"the gates {source} were trained on other weights than {name or 'this model'}'s: train gates for "
                "it (fastdecode train duo --target MODEL) or pass gates=far_mass.")
        return None  # stale shipped gates (the model was retrained): the far-mass ranking
    return head.gates()


class DuoSelector(StreamingSelector):
    cfg: DuoConfig

    def heads(self) -> torch.Tensor:
        if "retrieval" not in self.state_static:
            scores, source = head_scores(self.model, self.cfg.gates)
            self.state_static["retrieval"] = top_share(scores, self.cfg.retrieval)
            self.state_static["source"] = source
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
    description="DuoAttention: retrieval heads (trained gates) dense, streaming heads 64 sinks + a 256-token window.",
)
