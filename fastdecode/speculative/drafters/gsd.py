"""spec.gsd: Grouped Speculative Decoding (So et al., ICCV 2025) over SJD's drafts.

The drafts are Speculative Jacobi Decoding's (`speculative/jacobi_window.py`); the verification accepts a draft
code with probability min(1, p(G)/q(G)) over its group G: codes near it in the target's probability ranking, of
similar probability and close in the codebook (`speculative/relaxed.py`). Lossy by design, image models only. With
`ranks=0` (a group of one) it is SJD's exact verification; at temperature 0, ar.greedy's tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import SpecConfig, register_spec
from ..driver import speculative
from ..jacobi_window import INITS, image_of, window_for
from ..relaxed import code_distances, verify_gsd


@dataclass(frozen=True)
class GSDConfig(SpecConfig):
    temperature: float = 1.0  # the grouping acts on sampling; 0 is plain (exact) greedy verification
    ranks: int = 7  # the group looks +-ranks around the draft in the target's ranking (the authors' 7)
    prob_gap: float = 0.3  # ... keeping codes whose target probability is within this of the draft's (authors' 0.15)
    max_dist: float = 1.0  # ... and whose codebook vector lies closer than this (L2) to the draft's (authors' 0.5)
    window: int = 16  # SJD's window L
    init: str = "auto"  # SJD's initialisation of new positions ("auto" = vertical on image models)
    coupling: bool = False  # MC-SJD's coupled redraft of the drafts

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.ranks >= 0, "ranks", self.ranks, "must be at least 0 (0 = exact SJD)")
        check(self.prob_gap >= 0, "prob_gap", self.prob_gap, "must be at least 0")
        check(self.max_dist >= 0, "max_dist", self.max_dist, "must be at least 0")
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.init in INITS, "init", self.init, f"must be one of {', '.join(INITS)}")


@register_spec("spec.gsd", config=GSDConfig, lossless=False, images_only=True)
def run(model: CausalLM, batch: PromptBatch, cfg: GSDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """GSD: SJD's drafts accepted over a group of close, similarly likely codes (min(1, p(G)/q(G))); lossy, images."""
    accept = partial(verify_gsd, ranks=cfg.ranks, prob_gap=cfg.prob_gap, max_dist=cfg.max_dist,
                     distances=code_distances(image_of(model).codebook))
    return speculative(model, batch, cfg, ctx,
                       lambda generator: window_for(model, cfg, cfg.window, cfg.init, cfg.coupling, generator),
                       accept=accept)
