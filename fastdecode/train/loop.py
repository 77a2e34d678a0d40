"""Train a zoo model from a recipe and a seed; the loss log and progress go to a callback."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ..bench.tasks import TASKS
from ..bench.tasks.code import training_sources
from ..models.mdlm import MDLMConfig, MDLMForMaskedDiffusion
from .data import (
    DEFAULT_MIXTURE,
    Example,
    Packed,
    batches,
    collate,
    collate_packed,
    encode,
    item_stream,
    packed_batches,
)
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
    if recipe.objective == "ar":
        return LlamaForCausalLM(LlamaConfig(**shape))
    config = MDLMConfig(mask_token_id=tokenizer.mask_token_id, logits_shift=recipe.logits_shift, **shape)
    return MDLMForMaskedDiffusion(config)


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def ar_loss(model, ids, attention, answer, positions=None) -> torch.Tensor:
    """Next-token cross-entropy on answer tokens; the output layer runs only where a loss is taken.

    `attention` is `[B, T]` (padding) or, for packed rows, a `[B, 1, T, T]` mask with `positions`.
    """
    hidden = model.model(input_ids=ids, attention_mask=attention, position_ids=positions).last_hidden_state[:, :-1]
    learn = answer[:, 1:]  # [B, T-1]: position t predicts token t+1
    logits = model.lm_head(hidden[learn])  # [N, V]
    return F.cross_entropy(logits, ids[:, 1:][learn])


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


def examples(recipe: Recipe, tokenizer, seed: int, mixture: dict[str, float] | None = None):
    mixture = mixture or {**DEFAULT_MIXTURE, **recipe.mixture}
    rng = random.Random(f"canvas-{seed}")  # its own stream: the items drawn do not depend on the canvases
    for item in item_stream(mixture, seed):
        # mdlm as LLaDA's SFT: answers padded with EOS to a fixed length, the canvas the model will decode on
        pad = training_canvas(recipe, TASKS[item.task], tokenizer, rng) if recipe.objective == "mdlm" else None
        yield encode(tokenizer, item, pad)


def training_canvas(recipe: Recipe, task, tokenizer, rng: random.Random) -> int:
    """The canvas an answer is padded to: the task's fitted canvas, or for a `long_canvas` share of the answers
    of fitted-canvas tasks a longer one, a multiple of 16 drawn uniformly up to `long_canvas_to`."""
    canvas = task.canvas_length(tokenizer)
    longer = range(canvas // 16 + 1, recipe.long_canvas_to // 16 + 1)
    if canvas < task.max_new_tokens and longer and rng.random() < recipe.long_canvas:
        return 16 * rng.choice(longer)
    return canvas


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
    stream = _batches(recipe, tokenizer, seed)
    if recipe.curriculum_steps:
        first = _batches(recipe, tokenizer, seed, recipe.curriculum)
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
            loss = _loss(recipe, model, batch, tokenizer.mask_token_id, gen)
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


def _batches(recipe: Recipe, tokenizer, seed: int, mixture: dict[str, float] | None = None):
    """Padded length-grouped batches (`pack_len` 0) or packed rows that mix tasks in every batch."""
    stream = examples(recipe, tokenizer, seed, mixture)
    pad = tokenizer.pad_token_id
    if recipe.pack_len:
        causal = recipe.objective == "ar"
        return (collate_packed(b, pad, recipe.pack_len, causal)
                for b in packed_batches(stream, recipe.pack_len, recipe.batch_tokens, seed=seed))
    return (collate(b, pad, recipe.max_len) for b in batches(stream, recipe.batch_tokens, seed=seed))


def _loss(recipe: Recipe, model, batch, mask_id: int, gen: torch.Generator) -> torch.Tensor:
    if isinstance(batch, Packed):
        if recipe.objective == "ar":
            return ar_loss(model, batch.ids, batch.mask, batch.answer, batch.positions)
        return mdlm_loss(model, batch.ids, batch.mask, batch.answer, mask_id, gen, positions=batch.positions,
                         doc=batch.doc)
    ids, attention, answer = batch
    if recipe.objective == "ar":
        return ar_loss(model, ids, attention, answer)
    return mdlm_loss(model, ids, attention, answer, mask_id, gen)


def make_tokenizer(recipe: Recipe, seed: int):
    return train_tokenizer(tokenizer_corpus(seed, {**DEFAULT_MIXTURE, **recipe.mixture}), recipe.vocab_size,
                           recipe.pre_tokenizer)


__all__ = ["Example", "MAX_POSITIONS", "SPECIAL_TOKENS", "build_model", "make_tokenizer", "train", "Path"]
