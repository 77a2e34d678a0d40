"""`fastdecode train NAME`: tokenizer, training, export, evaluation and model card for one zoo model."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer

from ..bench.evaluate import DETERMINISTIC_LIST_TASKS, bits_per_byte, greedy_agreement, task_accuracy
from ..bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from ..engine import generate
from ..models.causal import CausalLM
from ..models.loading import load, resolve
from .export import save_folder, write_card
from .loop import Progress, make_tokenizer, train, uses_bf16
from .recipes import Recipe

Status = Callable[[str], None]


def zoo_folder(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "zoo" / name


def build(recipe: Recipe, out: Path, seed: int, threads: int, steps: int | None, eval_items: int,
          command: str, progress: Progress | None = None, status: Status = lambda s: None) -> dict:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    if recipe.tokenizer_from:
        tokenizer = AutoTokenizer.from_pretrained(resolve(f"zoo:{recipe.tokenizer_from}"))
    else:
        status("training the tokenizer")
        tokenizer = make_tokenizer(recipe, seed)
    init = load(f"zoo:{recipe.init_from}", device="cpu", dtype="float32").model if recipe.init_from else None
    model, log = train(recipe, tokenizer, seed, init=init, steps=steps, progress=progress)
    minutes = (time.perf_counter() - start) / 60
    save_folder(model, tokenizer, out, log)
    status("evaluating on the test split")
    metrics = evaluate_zoo_model(recipe, out, eval_items)
    metrics["train_minutes"] = round(minutes, 1)
    metrics["final_loss"] = sum(r["loss"] for r in log[-50:]) / len(log[-50:])
    # the card states what ran: bfloat16 autocast only where this CPU is fast at it
    write_card(out, dataclasses.replace(recipe, bf16=uses_bf16(recipe)), command, minutes, threads, metrics)
    return metrics


def evaluate_zoo_model(recipe: Recipe, folder: Path, n: int) -> dict:
    model = load(folder, device="cpu", dtype="float32")
    if recipe.objective == "mdlm":
        acc = {t: task_accuracy(model, t, n, "dlm.baseline", {"block_length": 16}) for t in DETERMINISTIC_LIST_TASKS}
        return {"method": "dlm.baseline, one token per step, block_length 16", "items_per_task": n,
                "accuracy": acc, "mean_deterministic_list_accuracy": sum(acc.values()) / len(acc)}
    assert isinstance(model, CausalLM)  # an "ar" recipe
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
