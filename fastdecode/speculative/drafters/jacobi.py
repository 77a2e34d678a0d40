"""spec.jacobi: Jacobi decoding (Santilli et al. 2023), fixed-point iteration on a window of guessed tokens.

Each step feeds the last token and the current guess y_1..y_m in one forward; the target's argmax at every
position is one Jacobi update y_i <- argmax p(. | x, y_<i). The verifier accepts the prefix that has reached its
fixed point; the updates after it become the next guess. The draft is built from the target's own logits, so
the drafter runs no model and is deterministic (verified with q one-hot when sampling).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import speculative


@dataclass(frozen=True)
class JacobiConfig(SpecConfig):
    window: int = 8  # m, tokens guessed and refined per step

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.window >= 1, "window", self.window, "must be at least 1")


class JacobiDrafter(BaseDrafter):
    def __init__(self, cfg: JacobiConfig) -> None:
        self.window = cfg.window
        self.guess: list[int] = []

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        m = min(k, self.window)
        fill = self.guess[-1] if self.guess else int(context[-1])  # new positions start as a copy
        self.guess = (self.guess + [fill] * m)[:m]
        return Draft(torch.tensor(self.guess, dtype=torch.long))

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        return logits[: 1 + num_draft].argmax(-1)  # [m + 1]: row i predicts the token after guess i

    def observe(self, verification: Verification) -> None:
        # the rows after the emitted token are the Jacobi updates
        self.guess = self.asked(verification).tolist()[verification.accepted + 1 :]


@register_spec("spec.jacobi", config=JacobiConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: JacobiConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Jacobi decoding: refine a window of guesses by fixed-point iteration, accept the converged prefix."""
    return speculative(model, batch, cfg, ctx, lambda generator: JacobiDrafter(cfg))
