"""`mdlm`: masked diffusion as LLaDA's SFT, answers padded with EOS to the canvas the model decodes on."""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.nn.functional as F

from ...bench.evaluate import DETERMINISTIC_LIST_TASKS, task_accuracy
from ...models.mdlm import MDLMConfig, MDLMForMaskedDiffusion
from ..data import Packed
from ..recipes import Recipe
from .base import Batch, Objective


def mdlm_loss(model, ids, attention, answer, mask_id: int, gen: torch.Generator, eps: float = 1e-3,
              positions=None, doc=None) -> torch.Tensor:
    """LLaDA SFT: mask answer tokens with p ~ U(eps, 1), CE on masked tokens weighted 1/p, per answer length.

    One p per example: per row, or with packed rows (`doc`, `positions`, a `[B, 1, T, T]` mask) per example.
    """
    if doc is not None:
        return _mdlm_loss_packed(model, ids, attention, answer, mask_id, gen, eps, positions, doc)
    B, T = ids.shape
    p = (1 - eps) * torch.rand(B, 1, generator=gen) + eps  # [B, 1]
    masked = answer & (torch.rand(B, T, generator=gen) < p)  # [B, T]
    logits = model(input_ids=ids.masked_fill(masked, mask_id), attention_mask=attention).logits  # [B, T, V]
    if model.config.logits_shift:  # output i-1 scores token i (answer tokens never sit at position 0)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")  # [B, T]
    per_row = (ce * masked / p).sum(1) / answer.sum(1).clamp(min=1)
    return per_row.mean()


def _mdlm_loss_packed(model, ids, mask, answer, mask_id, gen, eps, positions, doc) -> torch.Tensor:
    B, T = ids.shape
    key = torch.arange(B)[:, None] * T + doc.clamp(min=0)  # [B, T]: one slot per example
    p = ((1 - eps) * torch.rand(B * T, generator=gen) + eps)[key]  # [B, T]: the example's mask ratio
    masked = answer & (torch.rand(B, T, generator=gen) < p)
    length = torch.zeros(B * T).index_add_(0, key[answer], torch.ones(int(answer.sum())))[key]  # answer length
    # the output layer runs on masked tokens only, or for a shifted model on the outputs just before them (the
    # same example: an answer token never starts one), in the same order
    at = torch.cat([masked[:, 1:], torch.zeros_like(masked[:, :1])], dim=1) if model.config.logits_shift else masked
    logits = model(input_ids=ids.masked_fill(masked, mask_id), attention_mask=mask, position_ids=positions,
                   logits_at=at).logits  # [N, V]
    ce = F.cross_entropy(logits, ids[masked], reduction="none")  # [N]
    n_examples = int(doc.amax(1).clamp(min=-1).add(1).sum())
    return (ce / (p * length.clamp(min=1))[masked]).sum() / max(1, n_examples)


def training_canvas(recipe: Recipe, task, tokenizer, rng: random.Random) -> int:
    """The canvas an answer is padded to: the task's fitted canvas, or for a `long_canvas` share of the answers
    of fitted-canvas tasks a longer one, a multiple of 16 drawn uniformly up to `long_canvas_to`."""
    canvas = task.canvas_length(tokenizer)
    longer = range(canvas // 16 + 1, recipe.long_canvas_to // 16 + 1)
    if canvas < task.max_new_tokens and longer and rng.random() < recipe.long_canvas:
        return 16 * rng.choice(longer)
    return canvas


class MDLM(Objective):
    name = "mdlm"
    causal = False

    def build(self, recipe: Recipe, tokenizer: Any, shape: dict[str, Any]) -> torch.nn.Module:
        config = MDLMConfig(mask_token_id=tokenizer.mask_token_id, logits_shift=recipe.logits_shift, **shape)
        return MDLMForMaskedDiffusion(config)

    def loss(self, model: torch.nn.Module, batch: Batch, mask_id: int, gen: torch.Generator) -> torch.Tensor:
        if isinstance(batch, Packed):
            return mdlm_loss(model, batch.ids, batch.mask, batch.answer, mask_id, gen, positions=batch.positions,
                             doc=batch.doc)
        ids, attention, answer = batch
        return mdlm_loss(model, ids, attention, answer, mask_id, gen)

    def answer_pad(self, recipe: Recipe, task: Any, tokenizer: Any, rng: random.Random) -> int | None:
        return training_canvas(recipe, task, tokenizer, rng)

    def evaluate(self, recipe: Recipe, model: Any, n: int) -> dict:
        """One token per step (dlm.baseline, block length 16) on the deterministic list tasks."""
        acc = {t: task_accuracy(model, t, n, "dlm.baseline", {"block_length": 16}) for t in DETERMINISTIC_LIST_TASKS}
        return {"method": "dlm.baseline, one token per step, block_length 16", "items_per_task": n,
                "accuracy": acc, "mean_deterministic_list_accuracy": sum(acc.values()) / len(acc)}

    def card_lines(self, recipe: Recipe) -> list[str]:
        if not recipe.long_canvas:
            return []
        return [f"Answers are padded with EOS to the task's fitted canvas (`Task.canvas_length`), "
                f"{recipe.long_canvas:.0%} of them to a longer one, a multiple of 16 drawn uniformly up to "
                f"{recipe.long_canvas_to} masks.", ""]
