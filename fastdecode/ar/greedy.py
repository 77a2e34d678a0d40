"""ar.greedy: the lossless reference every faster method is compared with."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import MethodConfig
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..sampling import greedy as argmax
from ..types import PromptBatch, StepEvent
from .driver import autoregressive


@register("ar.greedy", kind="causal", config=MethodConfig, lossless=True)
def run(model: CausalLM, batch: PromptBatch, cfg: MethodConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Greedy decoding: the argmax token, one forward per token (the baseline)."""
    return autoregressive(model, batch, cfg, lambda logits, seen: argmax(logits))
