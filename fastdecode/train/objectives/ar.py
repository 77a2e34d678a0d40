"""`ar`: next-token cross-entropy on answer tokens, a Llama-shaped causal LM."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ...bench.evaluate import DETERMINISTIC_LIST_TASKS, bits_per_byte, greedy_agreement, task_accuracy
from ...bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from ...engine import generate
from ...models.causal import CausalLM
from ...models.loading import load
from ..data import Packed
from ..recipes import Recipe
from .base import Batch, Objective


def ar_loss(model, ids, attention, answer, positions=None) -> torch.Tensor:
    """Next-token cross-entropy on answer tokens; the output layer runs only where a loss is taken.

    `attention` is `[B, T]` (padding) or, for packed rows, a `[B, 1, T, T]` mask with `positions`.
    """
    hidden = model.model(input_ids=ids, attention_mask=attention, position_ids=positions).last_hidden_state[:, :-1]
    learn = answer[:, 1:]  # [B, T-1]: position t predicts token t+1
    logits = model.lm_head(hidden[learn])  # [N, V]
    return F.cross_entropy(logits, ids[:, 1:][learn])


class AR(Objective):
    name = "ar"
    causal = True

    def build(self, recipe: Recipe, tokenizer: Any, shape: dict[str, Any]) -> torch.nn.Module:
        return LlamaForCausalLM(LlamaConfig(**shape))

    def loss(self, model: torch.nn.Module, batch: Batch, mask_id: int, gen: torch.Generator) -> torch.Tensor:
        if isinstance(batch, Packed):
            return ar_loss(model, batch.ids, batch.mask, batch.answer, batch.positions)
        ids, attention, answer = batch
        return ar_loss(model, ids, attention, answer)

    def evaluate(self, recipe: Recipe, model: Any, n: int) -> dict:
        """Greedy accuracy on every non-code task, code bits per byte and samples, agreement with ar-small."""
        assert isinstance(model, CausalLM)
        names = [t for t in TASKS if TASKS[t].family != "code"]
        acc = {t: task_accuracy(model, t, n, "ar.greedy") for t in names}
        code_items = TASKS["code.complete"].items(DEFAULT_TEST_SEED, 100)
        samples = generate(model, [format_prompt(i.prompt) for i in code_items[:3]], max_new_tokens=64)  # greedy
        out = {
            "method": "ar.greedy", "items_per_task": n, "accuracy": acc,
            "mean_deterministic_list_accuracy": (
                sum(acc[t] for t in DETERMINISTIC_LIST_TASKS) / len(DETERMINISTIC_LIST_TASKS)
            ),
            "code_bits_per_byte": round(bits_per_byte(model, code_items), 4),
            "code_similarity": task_accuracy(model, "code.complete", 50, "ar.greedy"),
            "code_samples": [
                {"prompt_tail": i.prompt[-160:], "completion": r.text}
                for i, r in zip(code_items[:3], samples, strict=True)
            ],
        }
        if recipe.name != "ar-small":
            target = load("zoo:ar-small", device="cpu", dtype="float32")
            assert isinstance(target, CausalLM)
            items = [i for t in TASKS.values() for i in t.items(DEFAULT_TEST_SEED, 10)]
            out["greedy_agreement_with_ar_small"] = round(greedy_agreement(model, target, items), 4)
        return out
