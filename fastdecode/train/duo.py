"""`fastdecode train duo`: DuoAttention's gate optimisation (Xiao et al. 2025, mit-han-lab/duo-attention's train.py).

One gate alpha in [0, 1] per (layer, key/value head), initialised to 1; the model is frozen. Each step runs one
batch of two copies of a synthetic pass-key prompt: the first attends densely (the teacher), the second, in every
head, mixes alpha * the teacher's full attention output of that layer + (1 - alpha) * its own streaming attention
(the first `sinks` tokens and the last `window`), as the authors' two-way forward does. The loss is the mean squared
distance between the two copies' final hidden states (after the final norm) on the question-and-answer positions,
plus `reg` (0.05) times the mean |alpha|; AdamW (no weight decay) with the authors' schedule (linear warm-up over
the first fifth, linear decay over the last fifth, floor 0.1), and the gates clamped to [0, 1] before each step.

Data: training-seed items of the `longctx.passkey` task (RULER's noise haystack, a 5-digit key at a random depth,
the zoo's Q/A template, the key as the answer), each at a context drawn from `lengths` values spaced evenly over
[context_min, context_max] (the authors: 10 passkeys of 32 NATO words in BookSum, 50 lengths over 1k-32k).

Every step draws its item from (seed, step), and a checkpoint is written every `checkpoint_every` steps, so an
interrupted run resumes where it stopped and ends with the gates an uninterrupted one would. Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..bench.tasks import format_prompt
from ..bench.tasks.longctx import PasskeyTask
from ..errors import ParameterError
from ..heads import save_head
from ..heads.duo import DuoGates, weights_fingerprint
from .checkpoint import load_checkpoint, save_checkpoint

LOG = "train_log.jsonl"
ATTENTION = "fastdecode_duo_train"  # the transformers attention implementation of the two-way forward
Progress = Callable[[int, int, dict[str, float]], None]  # (step, steps, metrics)


@dataclass(frozen=True)
class DuoTraining:
    """How the gates train (every field settable with `--set NAME=VALUE`)."""

    steps: int = 200
    lr: float = 0.02  # the authors' scripts
    reg: float = 0.05  # weight of the L1 term (mean |alpha|)
    sinks: int = 128  # streaming pattern while training (the authors' train.sh: sink 128, recent 256)
    window: int = 256
    context_min: int = 1024
    context_max: int = 2048
    lengths: int = 5  # contexts spaced evenly over [context_min, context_max]
    checkpoint_every: int = 10

    def __post_init__(self) -> None:
        if self.steps < 1 or self.lr <= 0 or self.reg < 0 or self.sinks < 0 or self.window < 1:
            raise ParameterError(f"steps >= 1, lr > 0, reg >= 0, sinks >= 0 and window >= 1, got {self}")
        if not 0 < self.context_min <= self.context_max or self.lengths < 1 or self.checkpoint_every < 1:
            raise ParameterError(f"0 < context_min <= context_max, lengths >= 1 and checkpoint_every >= 1, "
                                 f"got {self}")


@dataclass
class _Mix:
    """What the two-way attention of one forward needs: the gates and the streaming mask."""

    alpha: torch.Tensor  # [layers, kv_heads], requires grad
    stream: torch.Tensor  # [T, T] bool: causal, and a sink or within the window


_MIX: ContextVar[_Mix | None] = ContextVar("fastdecode_duo_mix", default=None)


def streaming_mask(T: int, sinks: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """`[T, T]` bool: query i reads key j <= i when j is one of the first `sinks` or i - j < `window`."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    return (j <= i) & ((j < sinks) | (i - j < window))


def two_way_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature over a batch `[teacher; student]` (query `[2, Hq, T, D]`, key/value
    `[2, Hkv, T, D]`): the teacher attends causally, the student mixes per head alpha * the teacher's full output +
    (1 - alpha) * its own streaming attention. Returns `[2, T, Hq, D]`."""
    mix = _MIX.get()
    if mix is None:
        raise RuntimeError("the DuoAttention training attention runs only inside train.duo's forward")
    g = query.shape[1] // key.shape[1]
    if g > 1:
        key, value = key.repeat_interleave(g, dim=1), value.repeat_interleave(g, dim=1)
    with torch.no_grad():
        full = F.scaled_dot_product_attention(query[:1], key[:1], value[:1], is_causal=True, scale=scaling)
    stream = F.scaled_dot_product_attention(query[1:], key[1:], value[1:], attn_mask=mix.stream, scale=scaling)
    a = mix.alpha[getattr(module, "layer_idx", 0)].clamp(0, 1).repeat_interleave(g)[None, :, None, None]  # [1,Hq,1,1]
    student = a * full + (1 - a) * stream  # [1, Hq, T, D]
    return torch.cat([full, student]).transpose(1, 2).contiguous(), None


def _no_mask(*args: object, **kwargs: object) -> None:
    return None


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, two_way_attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


def passkey_example(tokenizer: Any, seed: int, step: int, cfg: DuoTraining) -> tuple[torch.Tensor, int]:
    """The training prompt of `step`: a training-seed pass-key item at one of the configured contexts."""
    rng = random.Random(seed * 1_000_003 + step)
    sizes = torch.linspace(cfg.context_min, cfg.context_max, cfg.lengths).round().long().tolist()
    task = PasskeyTask("1k")
    task.context = int(rng.choice(sizes))
    item = task.make_item(random.Random(rng.randrange(500_000)))  # train seeds, never a test seed
    return passkey_ids(tokenizer, item)


def passkey_ids(tokenizer: Any, item: Any) -> tuple[torch.Tensor, int]:
    """A pass-key item's prompt (the zoo's template) with its answer: token ids `[1, T]` and how many trailing
    tokens (the question and the answer) the loss reads."""
    haystack, _, question = format_prompt(item.prompt).rpartition("\n")
    text = f"{haystack}\n{question}{item.reference}\n"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]  # [1, T]
    before = tokenizer(haystack, return_tensors="pt")["input_ids"].shape[1]
    return ids, max(1, ids.shape[1] - before)


def distill_step(lm: Any, alpha: torch.Tensor, ids: torch.Tensor, labels: int, cfg: DuoTraining
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(distillation loss, L1 term) of one prompt `ids` `[1, T]`: the final hidden states of the gated copy against
    the dense one's on the last `labels` positions."""
    T = ids.shape[1]
    token = _MIX.set(_Mix(alpha, streaming_mask(T, cfg.sinks, cfg.window, ids.device)))
    before = lm.config._attn_implementation
    lm.config._attn_implementation = ATTENTION
    try:
        hidden = lm.model(input_ids=ids.expand(2, T)).last_hidden_state  # [2, T, H], after the final norm
    finally:
        lm.config._attn_implementation = before
        _MIX.reset(token)
    teacher, student = hidden[0, -labels:].float(), hidden[1, -labels:].float()
    distill = (teacher.detach() - student).pow(2).mean(-1).mean()
    return distill, alpha.clamp(0, 1).abs().mean()


def lr_at(step: int, cfg: DuoTraining) -> float:
    """The authors' schedule: min(1, warm-up over the first fifth, decay over the last fifth), floor 0.1."""
    fifth = max(1, cfg.steps // 5)
    return cfg.lr * min(1.0, max((step + 1) / fifth, 0.1), max((cfg.steps - step) / fifth, 0.1))


def train_gates(model: Any, out: str | Path, *, seed: int = 0, cfg: DuoTraining | None = None,
                progress: Progress | None = None) -> tuple[DuoGates, dict[str, Any]]:
    """Train `model`'s gates (resuming from `out`'s checkpoint), save them in bfloat16 into `out` with the training
    log, and return them (as saved) with the numbers for the card."""
    cfg = cfg or DuoTraining()
    folder = Path(out).expanduser()
    register_attention()
    lm = model.model
    for p in lm.parameters():
        p.requires_grad_(False)
    gates = DuoGates.for_target(model, sinks=cfg.sinks, window=cfg.window,
                                weights_sha256=weights_fingerprint(model)).float()
    opt = torch.optim.AdamW(gates.parameters(), lr=cfg.lr, weight_decay=0.0)
    identity = {"seed": seed, "training": dataclasses.asdict(cfg), "target": gates.config.weights_sha256}
    state = (load_checkpoint(folder, {"gates": gates}, {"opt": opt}, identity)
             or {"step": 0, "log": [], "elapsed_s": 0.0})
    log: list[dict[str, Any]] = state["log"]
    elapsed, tick = float(state["elapsed_s"]), time.perf_counter()
    for step in range(int(state["step"]), cfg.steps):
        with torch.no_grad():
            gates.alpha.clamp_(0, 1)
        ids, labels = passkey_example(model.tokenizer, seed, step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        distill, l1 = distill_step(lm, gates.alpha, ids.to(model.device), labels, cfg)
        loss = distill + cfg.reg * l1
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        row = {"step": step + 1, "tokens": int(ids.shape[1]), "loss": round(loss.item(), 5),
               "distill": round(distill.item(), 5), "l1": round(l1.item(), 4), "lr": round(lr_at(step, cfg), 5)}
        log.append(row)
        if progress is not None:
            progress(step + 1, cfg.steps, {k: row[k] for k in ("distill", "l1")})
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(folder, {"gates": gates}, {"opt": opt},
                            {**identity, "step": step + 1, "log": log,
                             "elapsed_s": elapsed + time.perf_counter() - tick})
    with torch.no_grad():
        gates.alpha.clamp_(0, 1)
    train_s = elapsed + time.perf_counter() - tick
    save_head(gates.eval(), folder, dtype="bfloat16")
    (folder / LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    from ..heads import load_head

    saved = load_head(folder, device="cpu", dtype=torch.float32)
    assert isinstance(saved, DuoGates)
    tail = log[-max(1, len(log) // 5):]
    card = {"seed": seed, "training": dataclasses.asdict(cfg), "train_s": round(train_s, 1),
            "gates": [[round(float(a), 4) for a in row] for row in saved.gates()],
            "loss_first": log[0]["loss"] if log else None,
            "distill_last_fifth": round(sum(r["distill"] for r in tail) / len(tail), 5) if log else None,
            "l1_last": log[-1]["l1"] if log else None}
    return saved, card
