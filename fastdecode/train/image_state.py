"""Resumable training state for the image trainers (img-vq, img-ar): safetensors for tensors, JSON for the rest.

A run's every random draw follows from (seed, step), so a run resumed from its checkpoint continues exactly as an
uninterrupted one would; the identity (what was asked: seed, settings) must match, or the resume is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .checkpoint import CHECKPOINT, clear_checkpoint, load_checkpoint, save_checkpoint

__all__ = ["CHECKPOINT", "clear_state", "load_state", "save_state"]


def save_state(folder: Path, module: torch.nn.Module, opt: torch.optim.Optimizer, record: dict[str, Any]) -> None:
    """The module's tensors and the optimiser's moments, written then renamed (never half a checkpoint)."""
    save_checkpoint(folder, {"model": module}, {"opt": opt}, record)


def load_state(folder: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
               identity: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's record, its tensors loaded into `module` and `opt`; None when there is none."""
    return load_checkpoint(folder, {"model": module}, {"opt": opt}, {"identity": identity})


clear_state = clear_checkpoint
