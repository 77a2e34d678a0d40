"""One resumable checkpoint for every trainer of the package (heads, the Learn2PD filter, dParallel, the image
tokenizer, teacher and evaluator, DD1/DD2): safetensors for the tensors, JSON for the rest.

`out/checkpoint/state.safetensors` holds each trained module's tensors under `NAME.` and each optimiser's moments
under `OPT.i.` (i its parameter's index over the param groups); `state.json` holds the record (what the run was asked:
its identity, and where it is: step, log, time). Both are written then renamed, so an interrupt never leaves half a
checkpoint. Every trainer draws its randomness from (seed, step), so a run resumed here ends with the weights an
uninterrupted one would; a checkpoint of another run (another identity) is refused, not silently continued.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import ParameterError

CHECKPOINT = "checkpoint"  # the out folder's sub-folder, removed once the trained part and its card are written


def save_checkpoint(folder: Path, modules: Mapping[str, nn.Module], opts: Mapping[str, torch.optim.Optimizer],
                    record: Mapping[str, Any]) -> None:
    """Write the modules' tensors, the optimisers' moments and `record` (JSON) to folder/checkpoint/."""
    where = Path(folder) / CHECKPOINT
    where.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, module in modules.items():
        for k, v in module.state_dict().items():
            t = v.detach().cpu().contiguous()
            # tied weights (an embedding shared with the output layer) share storage, which safetensors refuses:
            # the second name gets its own copy, and loading writes the same values into the one parameter
            tensors[f"{name}.{k}"] = t.clone() if t.untyped_storage().data_ptr() in seen else t
            seen.add(t.untyped_storage().data_ptr())
    for name, opt in opts.items():
        for i, p in enumerate(g for group in opt.param_groups for g in group["params"]):
            for key, value in opt.state.get(p, {}).items():
                tensors[f"{name}.{i}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, str(where / "state.safetensors.tmp"))
    (where / "state.safetensors.tmp").replace(where / "state.safetensors")
    (where / "state.json.tmp").write_text(json.dumps(record))
    (where / "state.json.tmp").replace(where / "state.json")


def load_checkpoint(folder: Path, modules: Mapping[str, nn.Module], opts: Mapping[str, torch.optim.Optimizer],
                    identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's record with the modules and optimisers loaded from it; None when there is none. `identity`
    (what the run was asked) must equal the record's same keys, or the resume is refused."""
    where = Path(folder) / CHECKPOINT
    if not (where / "state.json").is_file():
        return None
    record: dict[str, Any] = json.loads((where / "state.json").read_text())
    asked = json.loads(json.dumps(identity))  # tuples read back as lists
    found = {k: record.get(k) for k in asked}
    if found != asked:
        raise ParameterError(f"{folder} holds a checkpoint of another run ({found}): pass the same settings to "
                             f"resume it, or another --out (or delete {where}).")
    tensors = load_file(str(where / "state.safetensors"))
    for name, module in modules.items():
        module.load_state_dict({k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")})
    for name, opt in opts.items():
        for i, p in enumerate(g for group in opt.param_groups for g in group["params"]):
            prefix = f"{name}.{i}."
            moments = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
            if moments:  # AdamW keeps its step count as a float tensor on the host, its moments beside the weight
                opt.state[p] = {k: (v.float() if k == "step" else v.to(p.device)) for k, v in moments.items()}
    return record


def clear_checkpoint(folder: Path) -> None:
    """Remove folder/checkpoint/ and everything in it (a trainer may keep its data there too)."""
    where = Path(folder) / CHECKPOINT
    for f in sorted(where.rglob("*"), key=lambda p: -len(p.parts)):
        f.unlink() if f.is_file() else f.rmdir()
    if where.is_dir():
        where.rmdir()
