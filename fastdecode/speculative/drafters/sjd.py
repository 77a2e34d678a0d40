"""spec.sjd: Speculative Jacobi Decoding (Teng et al., ICLR 2025, arXiv 2410.01699), with MC-SJD's coupled redraft.

A Jacobi window whose drafts are the target's own samples from the last iteration, verified by speculative sampling
against the distributions they were drawn from: lossless in distribution (exactly ar.sample's) and, at temperature 0,
Jacobi decoding (exactly ar.greedy's tokens). The window itself is `speculative/jacobi_window.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import SpecConfig, register_spec
from ..driver import speculative
from ..jacobi_window import INITS, window_for


@dataclass(frozen=True)
class SJDConfig(SpecConfig):
    window: int = 16  # L, tokens drafted and verified per forward (the authors' max_num_new_tokens)
    # how a new window position starts: "random" (q uniform over the generable ids), "vertical" (the token one image
    # row above, q one-hot; image models only), "auto" (vertical on image models, random on text models)
    init: str = "auto"
    coupling: bool = False  # MC-SJD: redraft by maximal coupling with the old draft (also lossless)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.init in INITS, "init", self.init, f"must be one of {', '.join(INITS)}")


@register_spec("spec.sjd", config=SJDConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: SJDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Speculative Jacobi Decoding: a window of sampled Jacobi guesses, verified by speculative sampling (lossless);
    coupling=True is MC-SJD."""
    window_for(model, cfg, cfg.window, cfg.init, cfg.coupling, None)  # refuse a bad init before the first step
    return speculative(model, batch, cfg, ctx,
                       lambda generator: window_for(model, cfg, cfg.window, cfg.init, cfg.coupling, generator))
