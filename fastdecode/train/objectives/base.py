"""The training-objective contract: what the loop, the zoo build and the export ask of one objective.

An objective is one file in this folder with one `Objective` subclass; `__init__.py` finds it and lists it by name. The
loop looks it up once by `Recipe.objective`; nothing in `train/` tests an objective's name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
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


@dataclass
class TargetBatch:
    """One batch of what a head learns from: the frozen target's own text and what it computed on it.

    The text is self-distilled: prompts of the training seeds and the target's own greedy answers, so a head learns
    the distribution it will have to guess at decoding time. Everything the target computed is without gradient.
    """

    ids: torch.Tensor  # [B, T] long: prompt + the target's greedy answer, right-padded
    attention: torch.Tensor  # [B, T] bool: real tokens (False on padding)
    answer: torch.Tensor  # [B, T] bool: answer tokens, the ones a drafter has to guess
    hidden: torch.Tensor  # [B, T, H] the target's last hidden states (after the final norm, what its lm_head reads)
    layers: tuple[torch.Tensor, ...]  # one [B, T, H] per index of `HeadObjective.target_layers`, before the final norm
    logits: torch.Tensor  # [B, T, V] float32: the target's logits at every position

    def to(self, device: torch.device) -> TargetBatch:
        """The same batch on `device`: the loop builds it on the CPU, a head's loss runs where the head is (a GPU);
        tensors already there are not copied."""
        return TargetBatch(self.ids.to(device), self.attention.to(device), self.answer.to(device),
                           self.hidden.to(device), tuple(t.to(device) for t in self.layers), self.logits.to(device))


def head_device(head: torch.nn.Module) -> torch.device:
    """Where `head`'s parameters are: its loss runs there."""
    return next(head.parameters()).device


class HeadObjective:
    """How one head kind is trained against a frozen target (one file in this folder, the head in `heads/KIND.py`).

    The loop (`train/heads.py`) runs the target without gradient on self-distilled batches, asks it for the layers
    `target_layers` names, and steps the head's parameters on `head_loss`. `kind` is the head kind trained (the name
    `register_head` gave it); `HEAD_OBJECTIVES` in `__init__.py` lists every subclass by it.
    """

    kind: ClassVar[str]
    # the registered method that decodes with this head kind ("" = none): the loop measures it for the card
    method: ClassVar[str] = ""

    def method_params(self, folder: str) -> dict[str, Any]:
        """The method's parameters that make it decode with the head saved in `folder` (default: `head=folder`)."""
        return {"head": folder}

    def card_lines(self, options: dict[str, Any]) -> list[str]:
        """Extra card lines on the head's shape and loss (markdown, each paragraph ending in "")."""
        return []

    def target_layers(self, target: Any, options: dict[str, Any]) -> tuple[int, ...]:
        """The target's decoder layers the head reads (`CausalLM.forward(hidden=...)` indices); () = none."""
        return ()

    def build_head(self, target: Any, options: dict[str, Any]) -> Any:
        """A freshly initialised head for `target` (a loaded `CausalLM`), shaped by `options` (the command's
        `--set NAME=VALUE` pairs, parsed); the head's `Target` record is `Target.of(target)`."""
        raise NotImplementedError

    def prepare(self, head: Any, examples: list[Any]) -> None:
        """Fit what a fresh head takes from the training data itself before any step (EAGLE-3: its draft vocabulary,
        the most frequent answer tokens); `examples` are the self-distilled `data.Example`s. Default: nothing."""

    def head_loss(self, head: Any, target: Any, batch: TargetBatch,
                  gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss on one batch and the metrics the progress bar and the log show (e.g. `acc0`, the
        agreement of the head's first guess with the target's argmax on answer positions)."""
        raise NotImplementedError
