"""`fastdecode train dd1`: Distilled Decoding 1's few-step generator, trained on the teacher's noise -> codes pairs.

The pairs come from the flow-matching map (`image/ddmap.py`, `image/dd.py`); the network is the teacher's copy of
`heads/dd.py`. Each batch picks for every row a step of the sampling schedule, t = 0 (all noise) or t = `second`
(the first `second` positions hold the pair's own codes as data, the rest its noise: the authors' `perturb_data`),
so one network serves 1- and 2-step sampling. Loss at the positions >= t: cross-entropy of the code logits where the
position is < `split`, the squared error of the regressed vector against the code's vector (summed over d) after it.
DD1's authors use LPIPS on decoded images for the regressed part (recalled, their training code is unreleased); our
decoders are tiny and our tokens are quantised in the end, so we stay in code space. AdamW, warm-up, cosine decay to
10 %; resumable (`ddstate.py`). Nothing prints: progress goes to `report`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ParameterError
from ..heads import load_head, save_head
from ..heads.dd import DDNet
from ..image.dd import dd_sample, noise, teacher_map
from .ddstate import Report, clear_state, load_state, save_state, teacher_pairs

LOG = "train_log.jsonl"


@dataclass(frozen=True)
class DD1Training:
    """Every field settable with `--set NAME=VALUE`."""

    pairs: int = 10000  # teacher (noise, codes) pairs
    eval_rows: int = 128  # fresh pairs (their own seed) on which the card measures agreement with the teacher's map
    steps: int = 1500
    batch: int = 64
    lr: float = 3e-4
    warmup: int = 50
    split: float = 0.3  # fraction of positions read off the logits head (the authors: 80 of 256 for LlamaGen-B)
    second: float = 0.3  # the 2-step schedule keeps this fraction of step 1's codes (0: train 1-step only)
    mse_weight: float = 1.0
    map_steps: int = 12  # RK4 steps of the noise -> token map
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.pairs < 1 or self.eval_rows < 1:
            raise ParameterError(f"need steps, batch, pairs and eval_rows >= 1; got {self}")
        if not (0 <= self.split <= 1 and 0 <= self.second < 1):
            raise ParameterError(f"split must lie in [0, 1] and second in [0, 1), got {self.split}, {self.second}")


def lr_at(step: int, cfg: Any) -> float:
    if step < cfg.warmup:
        return float(cfg.lr * (step + 1) / cfg.warmup)
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return float(cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))))


def dd1_loss(net: DDNet, labels: torch.Tensor, eps: torch.Tensor, codes: torch.Tensor, t: torch.Tensor,
             mse_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The DD1 loss of one batch: labels [B], eps [B, n, d], codes [B, n], t [B] (data count per row)."""
    B, n, _ = eps.shape
    target = net.codebook[codes]  # [B, n, d]
    pos = torch.arange(n)[None]  # [1, n]
    x = torch.where((pos < t[:, None])[..., None], target, eps)  # [B, n, d]
    logits, vectors = net(labels, x, t)
    live = pos >= t[:, None]  # [B, n]: positions this step predicts
    early = live & (pos < net.config.split)
    late = live & (pos >= net.config.split)
    ce = F.cross_entropy(logits[early], codes[early]) if early.any() else logits.sum() * 0
    mse = ((vectors - target) ** 2).sum(-1)[late].mean() if late.any() else vectors.sum() * 0
    loss = ce + mse_weight * mse
    return loss, {"ce": float(ce.detach()), "mse": float(mse.detach())}


def agreement(model: Any, net: DDNet, seed: int, rows: int, map_steps: int) -> dict[str, float]:
    """Share of codes where the network's 1- and 2-step samples equal the teacher's mapped codes, on `rows` fresh
    pairs drawn from their own seed (never trained on): the card's claim, which tests/image/test_dd_shipped.py
    measures again on the first rows."""
    image = model.image
    gen = torch.Generator().manual_seed(seed + 99_991)
    labels = image.K + torch.randint(image.C, (rows,), generator=gen)
    eps = noise(rows, image.tokens, image.d, gen)
    codes = teacher_map(model, labels, eps, map_steps)
    return {f"{s}-step": round(float((dd_sample(net, labels, eps, s) == codes).float().mean()), 4) for s in (1, 2)}


def train_dd1(model: Any, out: Path, seed: int = 0, cfg: DD1Training | None = None,
              report: Report | None = None, init: str | None = None) -> dict[str, Any]:
    """Train DD1 against the guided image teacher `model` into `out`; returns the card's numbers. `init`: a DD
    network folder to start from instead of the teacher's copy (e.g. one distilled from an earlier snapshot of the
    same teacher: a warm start)."""
    cfg = cfg or DD1Training()
    torch.manual_seed(seed)
    start = time.perf_counter()
    labels, eps, codes = teacher_pairs(model, cfg.pairs, seed, cfg.map_steps, report=report)
    data_s = time.perf_counter() - start
    n = model.image.tokens
    net = DDNet.for_target(model, split=round(cfg.split * n), second=round(cfg.second * n),
                           init=f"dd1 network {init}" if init else "teacher", cfg_scale=float(model.scale))
    if init:
        begin = load_head(init, device="cpu", dtype=torch.float32)
        if not isinstance(begin, DDNet) or begin.config.tokens != n or begin.config.hidden_size != \
                net.config.hidden_size:
            raise ParameterError(f"--init {init} is not a DD network of this teacher's shape")
        net.load_state_dict(begin.state_dict())
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    identity = {"kind": "dd1", "seed": seed, "init": init or "teacher", "training": dataclasses.asdict(cfg)}
    opts: dict[str, torch.optim.Optimizer] = {"net": opt}
    record = load_state(out, {"net": net}, opts, identity) or {"step": 0, "log": [], "elapsed_s": 0.0}
    train_n = cfg.pairs
    gen = torch.Generator().manual_seed(seed + 1)
    order = torch.cat([torch.randperm(train_n, generator=gen) for _ in range(cfg.steps * cfg.batch // train_n + 1)])
    tgen = torch.Generator().manual_seed(seed + 2)
    t_draws = torch.randint(2, (cfg.steps, cfg.batch), generator=tgen) * net.config.second  # [steps, B]
    log: list[dict] = record["log"]
    began = time.perf_counter() - record["elapsed_s"]
    for step in range(record["step"], cfg.steps):
        idx = order[step * cfg.batch: (step + 1) * cfg.batch]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, parts = dd1_loss(net, labels[idx], eps[idx], codes[idx], t_draws[step], cfg.mse_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        log.append({"step": step, "loss": round(float(loss.detach()), 4), **{k: round(v, 4) for k, v in parts.items()}})
        if report is not None:
            report("train", step + 1, cfg.steps, {"loss": float(loss.detach()), **parts})
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            save_state(out, {"net": net}, opts, {"identity": identity, "step": step + 1, "log": log,
                                                          "elapsed_s": time.perf_counter() - began})
    train_s = time.perf_counter() - began
    save_head(net.eval(), out, dtype="bfloat16")
    shipped = load_head(out, device="cpu", dtype=torch.float32)  # the card measures what ships (bfloat16 weights)
    assert isinstance(shipped, DDNet)
    card = {"kind": "dd1", "seed": seed, "init": init or "teacher", "training": dataclasses.asdict(cfg),
            "data_s": round(data_s, 1), "train_s": round(train_s, 1), "final_loss": log[-1] if log else None,
            "held_out_agreement": agreement(model, shipped, seed, cfg.eval_rows, cfg.map_steps)}
    (out / LOG).write_text("".join(json.dumps(row) + "\n" for row in log))
    clear_state(out)
    return card
