"""The zoo recipes: model shape, objective and optimisation, one frozen record each."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import FastDecodeError, close_names


@dataclass(frozen=True)
class Recipe:
    name: str
    objective: str  # "ar" (next-token) or "mdlm" (masked diffusion, LLaDA SFT)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    steps: int
    lr: float
    batch_tokens: int = 4096
    warmup: int = 100
    weight_decay: float = 0.1
    max_len: int = 384  # training sequence cap (positions: 512)
    init_from: str | None = None  # zoo model whose weights initialise this one (AR -> diffusion adaptation)
    tokenizer_from: str | None = None  # zoo model whose tokenizer to reuse; None trains a new one
    vocab_size: int = 4096
    description: str = ""
    mixture: dict[str, float] = field(default_factory=dict)  # overrides of train.data.DEFAULT_MIXTURE
    # curriculum: the first `curriculum_steps` steps draw only from these tasks (e.g. copy, to form induction heads)
    curriculum: dict[str, float] = field(default_factory=dict)
    curriculum_steps: int = 0


RECIPES = {
    r.name: r
    for r in [
        Recipe("ar-small", "ar", 256, 8, 8, 4, 704, steps=2000, lr=1e-3, batch_tokens=2048,
               description="the target: a LlamaForCausalLM"),
        Recipe("ar-tiny", "ar", 128, 3, 4, 2, 352, steps=850, lr=2e-3, warmup=60, tokenizer_from="ar-small",
               description="the drafter for speculative decoding"),
        Recipe("dlm-small", "mdlm", 256, 8, 8, 4, 704, steps=900, lr=5e-4, init_from="ar-small",
               tokenizer_from="ar-small", warmup=50, mixture={"code.complete": 0.5},
               description="a LLaDA-style masked-diffusion LM initialised from ar-small"),
    ]
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise FastDecodeError(f"No zoo recipe named {name!r}. {close_names(name, RECIPES)}")
    return RECIPES[name]
