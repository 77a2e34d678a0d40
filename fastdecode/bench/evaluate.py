"""Model quality on the test split: task accuracy, code bits per byte, drafter/target agreement."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..engine import generate
from ..models.base import ModelAdapter
from ..models.causal import CausalLM
from ..speculative.memory import DrafterMemory
from ..types import Result
from .suites import BenchError, check_test_seed
from .tasks import DEFAULT_TEST_SEED, TASKS, Item, Task, format_prompt, get_task

DETERMINISTIC_LIST_TASKS = [n for n, t in TASKS.items() if t.family in ("lists", "letters") and t.deterministic]


def default_budget(task: Task, model: ModelAdapter) -> int:
    """`max_new_tokens` for a task: its budget, or for a masked-diffusion model the canvas fitted to its tokenizer."""
    return task.canvas_length(model.tokenizer) if model.kind == "diffusion" else task.max_new_tokens


@dataclass(frozen=True)
class ItemRun:
    """One suite item run as `fastdecode bench` runs it."""

    item: Item  # item.prompt is the raw question, item.reference the expected answer
    prompt: str  # what the model was given: the item's prompt in the zoo's template (format_prompt)
    result: Result
    score: float  # the task's score of result.text, in [0, 1], as the row's `score`


def run_item(model: ModelAdapter, task_name: str, index: int = 0, method: str = "ar.greedy", *,
             test_seed: int = DEFAULT_TEST_SEED, draft: ModelAdapter | None = None, **params: Any) -> ItemRun:
    """Run item `index` of a task (the row with that `task`, `item` and `seed` in a bench file) with `method`.

    `params` are the method's (`seed` among them is a sampler's; the row's item seed is `test_seed`).

    The bench's way, so that one row can be looked at or reproduced from Python: the prompt formatted with the
    template the zoo models are trained on (a raw `item.prompt` makes them answer something else),
    `max_new_tokens` the task's budget for this model unless given, a drafter's memory empty (as at the first
    row of a run).
    """
    task = get_task(task_name)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise BenchError(f"index must be an item number (0, 1, ...), not {index!r}.")
    item = task.items(check_test_seed(test_seed), index + 1)[index]
    prompt = format_prompt(item.prompt)
    result = generate(model, prompt, method, draft=draft, memory=DrafterMemory(),
                      **{"max_new_tokens": default_budget(task, model), **params})
    return ItemRun(item, prompt, result, task.score(item, result.text))


def task_accuracy(
    model: ModelAdapter, task_name: str, n: int, method: str, params: dict | None = None,
    seed: int = DEFAULT_TEST_SEED, batch_size: int = 25, on_batch: Callable[[int], None] | None = None,
) -> float:
    """Mean score of `method` on the first n test items of a task (batched generation)."""
    task = TASKS[task_name] if task_name in TASKS else get_task(task_name)
    items = task.items(seed, n)
    params = {"max_new_tokens": default_budget(task, model), **(params or {})}
    total = 0.0
    for start in range(0, n, batch_size):
        chunk = items[start : start + batch_size]
        results = generate(model, [format_prompt(i.prompt) for i in chunk], method, **params)
        total += sum(task.score(i, r.text) for i, r in zip(chunk, results, strict=True))
        if on_batch is not None:
            on_batch(len(chunk))
    return total / n


def _teacher_forced(model: CausalLM, item: Item) -> tuple[torch.Tensor, list[int], int]:
    """Logits `[T, V]` over prompt + reference, the ids, and where the reference starts."""
    prompt = model.encode(format_prompt(item.prompt))
    ids = prompt + model.tokenizer(item.reference, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids], device=model.device)
    logits = model.forward(x, torch.arange(len(ids), device=model.device)[None])[0]
    return logits, ids, len(prompt)


def bits_per_byte(model: CausalLM, items: Sequence[Item]) -> float:
    """Cross-entropy of the reference continuations in bits, divided by their UTF-8 bytes."""
    bits, nbytes = 0.0, 0
    for item in items:
        logits, ids, start = _teacher_forced(model, item)
        logp = logits[start - 1 : -1].log_softmax(-1)  # predicts ids[start:]
        target = torch.tensor(ids[start:], device=logp.device)
        bits += -logp.gather(1, target[:, None]).sum().item() / math.log(2)
        nbytes += len(item.reference.encode())
    return bits / nbytes


def greedy_agreement(draft: CausalLM, target: CausalLM, items: Sequence[Item]) -> float:
    """Share of reference positions where the two models' teacher-forced argmax tokens agree."""
    agree = total = 0
    for item in items:
        a, _, start = _teacher_forced(draft, item)
        b, _, _ = _teacher_forced(target, item)
        agree += int((a[start - 1 :].argmax(-1) == b[start - 1 :].argmax(-1)).sum())
        total += a.shape[0] - start + 1
    return agree / total
