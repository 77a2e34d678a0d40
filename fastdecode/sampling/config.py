"""Sampling parameters shared by every method that samples from the target distribution (ar.sample and every
spec.* method): the same fields build the same `LogitsPipeline`, so they apply identically."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import MethodConfig, check


@dataclass(frozen=True)
class SamplingConfig(MethodConfig):
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    seed: int | None = None  # None draws from torch's global RNG; a seed makes the run repeat
    min_p: float = 0.0  # 0 keeps every token
    repetition_penalty: float = 1.0  # 1 = off; applies at temperature 0 too

    def __post_init__(self) -> None:
        super().__post_init__()
        # NaN and inf fail too: an infinite temperature would flatten the logits to NaN and ignore top_k
        check(0 <= self.temperature < math.inf, "temperature", self.temperature,
              "must be a finite number >= 0 (0 means greedy)")
        check(self.top_k >= 0, "top_k", self.top_k, "must be >= 0 (0 keeps all tokens)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(0 <= self.min_p < 1, "min_p", self.min_p, "must be in [0, 1)")
        check(self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "must be > 0 (1 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
