"""spec.lantern: LANTERN's relaxed acceptance (Jang et al., ICLR 2025, arXiv 2410.03355) over SJD's drafts.

The drafts are Speculative Jacobi Decoding's (`speculative/jacobi_window.py`); the verification accepts a draft
code with the target mass of its nearest codebook neighbours added (`speculative/relaxed.py`), up to a total
variation of `delta` from the target: lossy by design, image models only (the neighbours come from the codebook).
At temperature 0 it is SJD's greedy verification, i.e. ar.greedy's tokens.
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
from ..relaxed import neighbour_order, verify_lantern


@dataclass(frozen=True)
class LanternConfig(SpecConfig):
    temperature: float = 1.0  # the relaxation acts on sampling; 0 is plain (exact) greedy verification
    delta: float = 0.1  # the most target mass (total variation) moved onto the draft from its neighbours
    k: int = 8  # neighbours considered per code, nearest first (1/8 of a 64-code book; the authors' 1000 of 16384)
    window: int = 16  # SJD's window L
    init: str = "auto"  # SJD's initialisation of new positions ("auto" = vertical on image models)
    coupling: bool = False  # MC-SJD's coupled redraft of the drafts

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 <= self.delta <= 1.0, "delta", self.delta, "must be between 0 and 1 (0 = exact SJD)")
        check(self.k >= 0, "k", self.k, "must be at least 0 (0 = exact SJD)")
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.init in INITS, "init", self.init, f"must be one of {', '.join(INITS)}")


@register_spec("spec.lantern", config=LanternConfig, lossless=False, images_only=True)
def run(model: CausalLM, batch: PromptBatch, cfg: LanternConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """LANTERN: SJD's drafts accepted with their k nearest codes' mass (up to TVD delta) added; lossy, images."""
    image = image_of(model)
    neighbours = neighbour_order(image.codebook)[:, : cfg.k]  # [K, k]
    accept = partial(verify_lantern, neighbours=neighbours, delta=cfg.delta)
    return speculative(model, batch, cfg, ctx,
                       lambda generator: window_for(model, cfg, cfg.window, cfg.init, cfg.coupling, generator),
                       accept=accept)
