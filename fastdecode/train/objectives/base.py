"""The training-objective contract: what the loop, the zoo build and the export ask of one objective.

An objective is one file in this folder with one `Objective` subclass; `__init__.py` finds it and lists it by name. The
loop looks it up once by `Recipe.objective`; nothing in `train/` tests an objective's name.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

import torch

from ..data import Packed
from ..recipes import Recipe

Batch = Packed | tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # packed rows, or (ids, attention, answer) padded


class Objective:
    """One training objective: the model it trains, its loss on a batch, how its answers are padded, its evaluation.

    `causal`: whether packed rows get a causal mask within each example (a next-token model) or a bidirectional one
    (a masked-diffusion model).
    """

    name: ClassVar[str]
    causal: ClassVar[bool]

    def build(self, recipe: Recipe, tokenizer: Any, shape: dict[str, Any]) -> torch.nn.Module:
        """A freshly initialised model of the recipe's `shape` (transformers config fields)."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Batch, mask_id: int, gen: torch.Generator) -> torch.Tensor:
        """The scalar loss on one batch; `gen` draws any noise (masks) so that a seeded run repeats."""
        raise NotImplementedError

    def answer_pad(self, recipe: Recipe, task: Any, tokenizer: Any, rng: random.Random) -> int | None:
        """The length an answer is padded to with EOS (the canvas the model will decode on), or None: unpadded.
        Only objectives that pad draw from `rng`, so the items drawn never depend on it."""
        return None

    def evaluate(self, recipe: Recipe, model: Any, n: int) -> dict:
        """The zoo card's measurements of the exported model (`n` test items per task)."""
        raise NotImplementedError

    def card_lines(self, recipe: Recipe) -> list[str]:
        """Extra model-card lines on how this objective's data was made (markdown, each paragraph ending in "")."""
        return []
