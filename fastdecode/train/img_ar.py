"""`fastdecode train img-ar`: the class-conditional image teacher zoo:img-ar (Llama over [class] + 49 VQ codes).

Data: every MNIST-5k training digit at its 9 shifts (+-1 pixel), encoded once by the shipped VQ tokenizer
(`zoo/img-ar/vq`), so an epoch is 36,000 sequences of 50 tokens. Each batch is drawn from (seed, step) alone; its
class tokens are replaced by the null class with probability `class_dropout`, which trains the unconditional model
classifier-free guidance needs. The loss is cross-entropy on the 49 codes. A checkpoint every `checkpoint_every`
steps makes the run resumable; `save_every` also ships the current weights (with image.json, a provisional card)
so a usable teacher exists before the run ends.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ..image.data import mnist5k, shifted
from ..models.image import ImageSpec, write_image_spec
from ..models.vq import load_vq
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint

Progress = Callable[[int, int, dict[str, float]], None]  # (step, total, metrics)
DIGITS = tuple(str(i) for i in range(10))
SHIFTS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]


@dataclass(frozen=True)
class ARTraining:
    steps: int = 1100
    batch: int = 64
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.05
    class_dropout: float = 0.1
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    mlp: int = 384
    cfg_scale: float = 2.0  # the default guidance written to image.json
    checkpoint_every: int = 100
    save_every: int = 400  # ship the weights so far (bfloat16) every this many steps
    eval_samples: int = 200  # generated images for the card's class-accuracy proxy


def teacher_config(spec: ImageSpec, cfg: ARTraining) -> LlamaConfig:
    return LlamaConfig(vocab_size=spec.vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.mlp,
                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                       max_position_embeddings=1 + spec.tokens, bos_token_id=None, eos_token_id=None,
                       pad_token_id=spec.null_token, tie_word_embeddings=False)


def encode_split(spec: ImageSpec, split: str, shifts: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes `[N * len(shifts), 49]` and labels of a split at every shift."""
    images, labels = mnist5k(split)  # type: ignore[arg-type]
    codes = [spec.encode(shifted(images, dy, dx)) for dy, dx in shifts]
    return torch.cat(codes), torch.from_numpy(np.tile(labels, len(shifts)))


def sequences(spec: ImageSpec, codes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`[N, 1 + 49]`: the class token, then the codes."""
    return torch.cat([(spec.K + labels)[:, None], codes], dim=1)


def batch_at(seqs: torch.Tensor, step: int, seed: int, cfg: ARTraining, null: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rows = seqs[torch.randint(len(seqs), (cfg.batch,), generator=gen)].clone()  # [B, 50]
    drop = torch.rand(cfg.batch, generator=gen) < cfg.class_dropout
    rows[drop, 0] = null
    return rows


def lr_at(step: int, cfg: ARTraining) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def code_loss(model: LlamaForCausalLM, rows: torch.Tensor, K: int) -> torch.Tensor:
    """Mean cross-entropy (nats) of the codes of `rows` `[B, 50]`, over the code ids only."""
    logits = model(input_ids=rows[:, :-1]).logits[..., :K]  # [B, 49, K]
    return F.cross_entropy(logits.reshape(-1, K).float(), rows[:, 1:].reshape(-1))


def train_img_ar(out: Path, seed: int = 0, cfg: ARTraining | None = None, progress: Progress | None = None,
                 command: str = "", threads: int = 1) -> dict[str, Any]:
    """Train the teacher into `out` (resuming from its checkpoint; the VQ must be in `out/vq`), ship it in bfloat16
    with image.json and its card."""
    cfg = cfg or ARTraining()
    out = Path(out)
    spec = ImageSpec(load_vq(out / "vq"), DIGITS, cfg.cfg_scale)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(teacher_config(spec, cfg))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    identity = {"seed": seed, "training": {k: v for k, v in dataclasses.asdict(cfg).items()
                                           if k not in ("save_every", "eval_samples", "cfg_scale", "steps")}}
    record = (load_checkpoint(out, {"model": model}, {"opt": opt}, {"identity": identity})
              or {"step": 0, "elapsed_s": 0.0, "log": []})
    start, elapsed, log = int(record["step"]), float(record["elapsed_s"]), list(record["log"])
    seqs = sequences(spec, *encode_split(spec, "train", SHIFTS))
    began = time.perf_counter()
    model.train()
    for step in range(start, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = code_loss(model, batch_at(seqs, step, seed, cfg, spec.null_token), spec.K)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 50 == 0:
            log.append({"step": step + 1, "loss": round(float(loss.detach()), 4)})
        if progress is not None:
            progress(step + 1, cfg.steps, {"loss": float(loss.detach())})
        spent = elapsed + time.perf_counter() - began
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(out, {"model": model}, {"opt": opt},
                            {"identity": identity, "step": step + 1, "log": log, "elapsed_s": spent})
        if (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            ship(model, spec, out, cfg, seed, threads, command, step + 1, spent, log, final=False)
    spent = elapsed + time.perf_counter() - began
    metrics = ship(model, spec, out, cfg, seed, threads, command, cfg.steps, spent, log, final=True)
    clear_checkpoint(out)
    return metrics


def ship(model: LlamaForCausalLM, spec: ImageSpec, out: Path, cfg: ARTraining, seed: int, threads: int,
         command: str, step: int, seconds: float, log: list[dict], final: bool) -> dict[str, Any]:
    """Save the weights in bfloat16 with image.json, measure the shipped model and write its card."""
    from .img_ar_card import measure_teacher, write_teacher_card

    was_training = model.training
    model.eval()
    tmp = out / "weights.tmp"
    exported: Any = copy.deepcopy(model)  # the trained model keeps its float32 weights
    exported.to(torch.bfloat16).save_pretrained(tmp)
    for f in tmp.iterdir():
        shutil.move(str(f), str(out / f.name))
    tmp.rmdir()
    write_image_spec(spec, out)
    (out / "train_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in log))
    metrics = measure_teacher(out, cfg.eval_samples, seed)
    metrics.update({"steps": step, "tokens": step * cfg.batch * spec.tokens, "minutes": round(seconds / 60, 1),
                    "final": final})
    write_teacher_card(out, cfg, seed, threads, command, metrics)
    model.train(was_training)
    return metrics
