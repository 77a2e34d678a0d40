"""The Llama-style building blocks that the zoo's own modules share: the diffusion model (`mdlm.py`) and the trained
heads (`heads/eagle3.py`, `heads/dflash.py`). Parameter names follow transformers' Llama (`weight`, `gate_proj`,
`up_proj`, `down_proj`), so checkpoints in those layouts load by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back before the weight, as Llama does (the same numbers in any dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, out: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add, then the next norm: (the new residual stream, its normed copy)."""
    x = x + out
    return x, rms_norm(x, weight, eps)


def gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's elementwise part: silu(gate) * up."""
    return F.silu(gate) * up


class RMSNorm(nn.Module):
    """`rms_norm` with its weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    """Llama's MLP: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gated(self.gate_proj(x), self.up_proj(x)))
