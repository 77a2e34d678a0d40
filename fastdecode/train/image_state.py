"""Resumable training state for the image trainers (img-vq, img-ar): safetensors for tensors, JSON for the rest.

A run's every random draw follows from (seed, step), so a run resumed from its checkpoint continues exactly as an
uninterrupted one would; the identity (what was asked: seed, settings) must match, or the resume is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..errors import ParameterError

CHECKPOINT = "checkpoint"


def save_state(folder: Path, module: torch.nn.Module, opt: torch.optim.Optimizer, record: dict[str, Any]) -> None:
    """The module's float32 tensors and the optimiser's moments, written then renamed (never half a checkpoint)."""
    where = Path(folder) / CHECKPOINT
    where.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().float().cpu().contiguous() for k, v in module.state_dict().items()}
    for i, p in enumerate(g for group in opt.param_groups for g in group["params"]):
        for name, value in opt.state.get(p, {}).items():
            tensors[f"opt.{i}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, str(where / "state.safetensors.tmp"))
    (where / "state.safetensors.tmp").replace(where / "state.safetensors")
    (where / "state.json.tmp").write_text(json.dumps(record))
    (where / "state.json.tmp").replace(where / "state.json")


def load_state(folder: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
               identity: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's record, its tensors loaded into `module` and `opt`; None when there is none."""
    where = Path(folder) / CHECKPOINT
    if not (where / "state.json").is_file():
        return None
    record = json.loads((where / "state.json").read_text())
    if record.get("identity") != identity:
        raise ParameterError(f"{folder} holds a checkpoint of another run ({record.get('identity')}): pass the same "
                             f"settings to resume it, or another --out (or delete {where}).")
    tensors = load_file(str(where / "state.safetensors"))
    module.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    params = [p for group in opt.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        moments = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"opt.{i}.")}
        if moments:
            opt.state[p] = {k: (v if k != "step" else v.float()) for k, v in moments.items()}
    return record


def clear_state(folder: Path) -> None:
    where = Path(folder) / CHECKPOINT
    for f in where.glob("*"):
        f.unlink()
    if where.is_dir():
        where.rmdir()
