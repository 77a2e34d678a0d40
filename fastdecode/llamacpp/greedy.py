"""llamacpp.greedy: llama.cpp's greedy decoding on the same weights (GGUF, float32), the reference engine to beat."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import MethodConfig
from ..models.causal import CausalLM
from ..registry import ConstraintSupport, RunContext, register
from ..types import PromptBatch, StepEvent
from .convert import check_convertible
from .driver import llamacpp_driver

REQUIRES = (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf"))
# llama.cpp runs its own decoding loop: fastdecode's grammar mask never sees its logits
NO_CONSTRAINT = ConstraintSupport(refused="runs llama.cpp's own decoding loop, which fastdecode's grammar mask does "
                                          "not reach; use ar.greedy or a spec.* method (llama.cpp's own GBNF grammars "
                                          "are not wired in)")


@register("llamacpp.greedy", kind="causal", config=MethodConfig, requires=REQUIRES, constraints=NO_CONSTRAINT)
def run(model: CausalLM, batch: PromptBatch, cfg: MethodConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """llama.cpp greedy decoding on the model's weights converted to GGUF (reference; optional extra)."""
    check_convertible(model)
    return llamacpp_driver(model, batch, cfg.max_new_tokens, should_stop=ctx.should_stop)
