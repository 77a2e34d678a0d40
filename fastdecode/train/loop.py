"""Train a zoo model from a recipe and a seed; the loss log and progress go to a callback."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..bench.tasks import TASKS
from ..bench.tasks.code import training_sources
from .data import (
    DEFAULT_MIXTURE,
    Example,
    batches,
    collate,
    collate_packed,
    encode,
    item_stream,
    packed_batches,
)
from .objectives import Objective, objective
from .recipes import Recipe
from .tokenizer import SPECIAL_TOKENS, train_tokenizer

Progress = Callable[[int, int, float], None]  # (step, total, loss)
MAX_POSITIONS = 512


def tokenizer_corpus(
    seed: int, mixture: dict[str, float], n_items: int = 6000, code_chars: int = 3_000_000
) -> list[str]:
    """Texts the BPE is trained on: task prompts and answers plus training-module source."""
    items = itertools.islice(item_stream(mixture, seed), n_items)
    texts = [f"{i.prompt}\n{i.reference}" for i in items]
    total = 0
    for _, source in sorted(training_sources()):
        texts.append(source)
        total += len(source)
        if total > code_chars:
            break
    return texts


def build_model(recipe: Recipe, tokenizer) -> torch.nn.Module:
    shape = dict(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers, num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    return objective(recipe.objective).build(recipe, tokenizer, shape)


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def examples(recipe: Recipe, tokenizer, seed: int, mixture: dict[str, float] | None = None):
    mixture = mixture or {**DEFAULT_MIXTURE, **recipe.mixture}
    rng = random.Random(f"canvas-{seed}")  # its own stream: the items drawn do not depend on the canvases
    goal = objective(recipe.objective)
    for item in item_stream(mixture, seed):
        # e.g. mdlm as LLaDA's SFT: answers padded with EOS to a fixed length, the canvas the model will decode on
        yield encode(tokenizer, item, goal.answer_pad(recipe, TASKS[item.task], tokenizer, rng))


def cpu_bf16_is_fast() -> bool:
    """Whether oneDNN runs bfloat16 matrix products natively on this CPU (AVX-512 or AMX).

    Elsewhere (AVX2) autocast emulates them: an ar-small step took 30 s instead of 2.5 s in float32.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def uses_bf16(recipe: Recipe) -> bool:
    """A recipe's `bf16` applies where the CPU is fast at it; elsewhere training runs in float32."""
    return recipe.bf16 and cpu_bf16_is_fast()


def train(recipe: Recipe, tokenizer, seed: int, init: torch.nn.Module | None = None,
          steps: int | None = None, progress: Progress | None = None) -> tuple[torch.nn.Module, list[dict]]:
    """Train and return (model, loss log). Deterministic for a given seed, thread count and CPU (`uses_bf16`)."""
    goal = objective(recipe.objective)
    torch.manual_seed(seed)
    random.seed(seed)
    model = build_model(recipe, tokenizer)
    if init is not None:
        missing, _ = model.load_state_dict(init.state_dict(), strict=False)
        if missing:
            raise ValueError(f"initialisation lacks {missing[:3]}")
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    stream = _batches(recipe, goal, tokenizer, seed)
    if recipe.curriculum_steps:
        first = _batches(recipe, goal, tokenizer, seed, recipe.curriculum)
        stream = itertools.chain(itertools.islice(first, recipe.curriculum_steps), stream)
    total = steps or recipe.steps
    log: list[dict] = []
    bf16 = uses_bf16(recipe)
    start = time.perf_counter()
    for step in range(total):
        batch = next(stream)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = goal.loss(model, batch, tokenizer.mask_token_id, gen)
        ids = batch[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log.append({"step": step, "loss": round(loss.item(), 4), "lr": group["lr"], "tokens": int(ids.numel()),
                    "elapsed_s": round(time.perf_counter() - start, 1)})
        if progress is not None:
            progress(step + 1, total, loss.item())
    model.eval()
    return model, log


def _batches(recipe: Recipe, goal: Objective, tokenizer, seed: int, mixture: dict[str, float] | None = None):
    """Padded length-grouped batches (`pack_len` 0) or packed rows that mix tasks in every batch."""
    stream = examples(recipe, tokenizer, seed, mixture)
    pad = tokenizer.pad_token_id
    if recipe.pack_len:
        return (collate_packed(b, pad, recipe.pack_len, goal.causal)
                for b in packed_batches(stream, recipe.pack_len, recipe.batch_tokens, seed=seed))
    return (collate(b, pad, recipe.max_len) for b in batches(stream, recipe.batch_tokens, seed=seed))


def make_tokenizer(recipe: Recipe, seed: int):
    return train_tokenizer(tokenizer_corpus(seed, {**DEFAULT_MIXTURE, **recipe.mixture}), recipe.vocab_size,
                           recipe.pre_tokenizer)


__all__ = ["Example", "MAX_POSITIONS", "SPECIAL_TOKENS", "build_model", "make_tokenizer", "train", "Path"]
