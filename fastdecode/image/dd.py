"""Distilled Decoding's two halves that touch a model: the teacher's noise -> sequence map and the DD sampler.

`teacher_map` runs the teacher once per position (batched, on its KV cache) and sends each position's noise vector
through the flow-matching map of `ddmap.py` under that position's distribution, the mapped code conditioning the next
position: noise [B, n, d] -> codes [B, n], a deterministic function whose outputs are teacher samples when the noise
is Gaussian. `dd_sample` is the trained network's 1- or 2-step sampler (the DD1 authors' `eval_fewstep.py`: step 1
reads all noise; step 2 keeps the first `second` codes of step 1 as data and re-reads the same noise after them).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from ..heads.dd import DDNet
from .ddmap import DEFAULT_STEPS, flow_map


def noise(batch: int, tokens: int, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """Standard Gaussian noise [B, n, d] (float32, CPU: the same draws whatever the device)."""
    return torch.randn(batch, tokens, dim, generator=generator)


@torch.inference_mode()
def teacher_map(model, labels: Tensor, eps: Tensor, steps: int = DEFAULT_STEPS) -> Tensor:
    """Codes [B, m] the teacher's flow maps noise `eps` [B, m, d] to, for class tokens `labels` [B]: the first m
    positions of the image (m = h*w for whole images; fewer for tests of the first tokens).

    `model` is the image adapter at the guidance the samples should follow (`model.with_scale(s)`); its logits are
    already restricted to codes. One forward per position, the cache holding the prefix."""
    image = model.image
    B, n, _ = eps.shape
    if not 1 <= n <= image.tokens or eps.shape[2] != image.d:
        raise ValueError(f"noise must be [B, m, {image.d}] with m <= {image.tokens} for this model, got "
                         f"{tuple(eps.shape)}")
    device = model.device
    codebook = image.codebook.float()  # [K, d]
    cache = model.new_cache(B, n + 1)
    ids = labels.to(device)[:, None]  # [B, 1]
    codes = torch.empty(B, n, dtype=torch.long)
    for i in range(n):
        positions = torch.full((B, 1), i, dtype=torch.long, device=device)
        logits = model.forward(ids, positions, cache)[:, -1, : image.K].float().cpu()  # [B, K]
        codes[:, i] = flow_map(eps[:, i], torch.log_softmax(logits, dim=-1), codebook, steps)
        ids = codes[:, i: i + 1].to(device)
    return codes


@torch.inference_mode()
def dd_steps(net: DDNet, labels: Tensor, eps: Tensor, steps: int = 1) -> Iterator[tuple[int, Tensor]]:
    """After each forward of the DD network: (the first position that forward decided, codes [B, n] so far).

    labels [B] class tokens, eps [B, n, d]; `steps` 1 or 2 (2 re-reads the noise after the first `second` codes)."""
    if steps not in (1, 2):
        raise ValueError(f"Distilled Decoding samples in 1 or 2 steps, not {steps}")
    dev = net.codebook.device
    labels, eps = labels.to(dev), eps.to(dev, net.codebook.dtype)
    B = eps.shape[0]
    logits, vectors = net(labels, eps, torch.zeros(B, dtype=torch.long, device=dev))
    codes = net.tokens_from(logits, vectors)  # [B, n]
    yield 0, codes.cpu()
    second = net.config.second
    if steps == 2:
        keep = second if 0 < second < eps.shape[1] else 0
        x = torch.cat([net.codebook[codes[:, :keep]], eps[:, keep:]], dim=1)  # [B, n, d]
        logits, vectors = net(labels, x, torch.full((B,), keep, dtype=torch.long, device=dev))
        codes = torch.cat([codes[:, :keep], net.tokens_from(logits, vectors)[:, keep:]], dim=1)
        yield keep, codes.cpu()


def dd_sample(net: DDNet, labels: Tensor, eps: Tensor, steps: int = 1) -> Tensor:
    """Codes [B, n] from the DD network in `steps` (1 or 2) forwards; labels [B], eps [B, n, d]."""
    return list(dd_steps(net, labels, eps, steps))[-1][1]
