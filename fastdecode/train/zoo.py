"""`fastdecode train NAME`: tokenizer, training, export, evaluation and model card for one zoo model."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer

from ..models.loading import load, resolve
from .export import save_folder, write_card
from .loop import Progress, make_tokenizer, train, uses_bf16
from .objectives import objective
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
    """The card's measurements of the exported model in `folder`, as its recipe's objective takes them."""
    return objective(recipe.objective).evaluate(recipe, load(folder, device="cpu", dtype="float32"), n)
