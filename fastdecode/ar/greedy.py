"""ar.greedy: the lossless reference every faster method is compared with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..attention import check_attention, make_selector
from ..config import MethodConfig, check
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .driver import ar_session, autoregressive


@dataclass(frozen=True)
class GreedyConfig(MethodConfig):
    """The argmax after the processors that can change it (spec.* methods at temperature 0 take the same)."""

    repetition_penalty: float = 1.0  # 1 = off
    # "dense" only: ar.greedy is registered lossless, so a sparse rule is refused (`Method.check_attention`) with
    # the method that decodes greedily through it, sparse.<rule>; the field stays for the parameter's validation
    attention: str = "dense"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "must be > 0 (1 = off)")
        check_attention(self.attention)


@register("ar.greedy", kind="causal", config=GreedyConfig, lossless=True, session=ar_session)
def run(model: CausalLM, batch: PromptBatch, cfg: GreedyConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Greedy decoding: the argmax token, one forward per token (the baseline)."""
    return autoregressive(model, batch, cfg, constraint=ctx.constraint, sparse=make_selector(cfg.attention, model))
