"""The zoo recipes: model shape, objective and optimisation, one frozen record each."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..config import coerce_value
from ..errors import FastDecodeError, ParameterError, close_names
from .tokenizer import PRE_TOKENIZERS


@dataclass(frozen=True)
class Recipe:
    name: str
    objective: str  # a name in train/objectives: "ar" (next-token) or "mdlm" (masked diffusion, LLaDA SFT)
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
    pack_len: int = 0  # 0: batches of similar-length examples, padded; N: rows of N tokens packed with whole examples
    bf16: bool = False  # bfloat16 autocast for the matrix products (weights and optimiser state stay float32)
    # mdlm only: token i is scored at output i-1 (Dream's convention, which keeps an AR initialisation's next-token
    # head); the saved config says so and the adapter realigns, so the engine sees logits at position i either way
    logits_shift: bool = False
    pre_tokenizer: str = "joined"  # train.tokenizer.PRE_TOKENIZERS: how text is split before BPE merges
    # mdlm only: the share of padded answers drawn to a longer canvas (a multiple of 16 above the task's fitted
    # canvas, up to `long_canvas_to` masks) instead of the fitted one, so that the model also decodes on long
    # canvases; LLaDA's SFT pads to the batch's longest answer and so shows its model varying amounts of EOS
    long_canvas: float = 0.0
    long_canvas_to: int = 256

    def __post_init__(self) -> None:
        if self.pre_tokenizer not in PRE_TOKENIZERS:
            raise ParameterError(
                f"Unknown pre_tokenizer {self.pre_tokenizer!r}; choose one of {sorted(PRE_TOKENIZERS)}."
            )
        if not 0.0 <= self.long_canvas <= 1.0:
            raise ParameterError(f"long_canvas is a share of the answers, between 0 and 1; got {self.long_canvas}.")
        if self.long_canvas and self.long_canvas_to % 16:
            raise ParameterError(f"long_canvas_to is a canvas length, a multiple of 16; got {self.long_canvas_to}.")


# tasks of the first steps of the AR recipes: copying and reversing lists is where the copying (induction) heads form
COPY_CURRICULUM = {"lists.copy": 1.0, "letters.copy": 1.0, "lists.reverse": 1.0, "letters.reverse": 1.0}

# more of the tasks the small models learn last (sorting names by last name, sorting and repeating letters):
# trial I in docs/zoo.md, lists.sort 50 % -> 76 % for ar-small
SLOW_TASKS = {"lists.sort": 6.0, "letters.sort": 2.5, "letters.repeat": 2.0}

# every recipe: 6 rows of 384 tokens packed with whole examples of the whole mixture, bfloat16 matrix products
class _Packing(TypedDict):
    pack_len: int
    batch_tokens: int
    bf16: bool


PACKED = _Packing(pack_len=384, batch_tokens=6 * 384, bf16=True)

RECIPES = {
    r.name: r
    for r in [
        Recipe("ar-small", "ar", 320, 6, 5, 5, 864, steps=3200, lr=1e-3, curriculum_steps=500,
               curriculum=COPY_CURRICULUM, mixture=SLOW_TASKS, **PACKED,
               description="the target: a LlamaForCausalLM"),
        Recipe("ar-tiny", "ar", 128, 4, 4, 2, 352, steps=4000, lr=3e-3, warmup=60,
               curriculum_steps=500, curriculum=COPY_CURRICULUM, tokenizer_from="ar-small", **PACKED,
               description="the drafter for speculative decoding"),
        Recipe("dlm-small", "mdlm", 320, 6, 5, 5, 864, steps=4600, lr=1e-3, init_from="ar-small", logits_shift=True,
               tokenizer_from="ar-small", warmup=100,
               mixture={**SLOW_TASKS, "code.complete": 0.2, "puzzles.sudoku": 1.5}, **PACKED,
               description="a masked-diffusion LM (bidirectional attention, mask token, Dream-style shifted logits) "
                           "initialised from ar-small"),
    ]
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise FastDecodeError(f"No zoo recipe named {name!r}. {close_names(name, RECIPES)}")
    return RECIPES[name]


def override(recipe: Recipe, settings: dict[str, str]) -> Recipe:
    """A recipe with fields replaced from `name=value` strings (JSON for dicts), for recipe trials."""
    hints = typing.get_type_hints(Recipe)
    changes: dict[str, Any] = {}  # each value coerced to its field's type
    for name, value in settings.items():
        if name not in hints or name == "name":
            fields = [f.name for f in dataclasses.fields(Recipe)]
            raise ParameterError(f"Unknown recipe field {name!r}. {close_names(name, fields)}")
        if typing.get_origin(hints[name]) is dict:
            try:
                changes[name] = {str(k): float(v) for k, v in json.loads(value).items()}
            except (ValueError, AttributeError):
                raise ParameterError(
                    f"Recipe field {name} takes a JSON object, e.g. '{{\"lists.copy\": 1}}'."
                ) from None
        else:
            changes[name] = coerce_value(name, value, hints[name])
    return dataclasses.replace(recipe, **changes)
