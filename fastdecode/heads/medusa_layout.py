"""Medusa heads in the layout the Medusa authors' code saves and loads (FasterDecoding/Medusa, `medusa_model.py`;
the same folders vLLM's and TensorRT-LLM's Medusa loaders read).

A folder holds `config.json` (`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`, and often
`hidden_size`/`vocab_size`) and `medusa_lm_head.safetensors`: for head i, residual block j, `{i}.{j}.linear.weight`
`[H, H]` and `{i}.{j}.linear.bias` `[H]`, then its own output layer `{i}.{num_layers}.weight` `[V, H]` (a checkpoint
of the whole model prefixes them with `medusa_head.`). Older releases ship `medusa_lm_head.pt`, a pickle, which is
never loaded here. Loading onto a target checks the shapes against it; heads whose output layers all equal the
target's lm_head become a tied fastdecode head. Saving writes the target's lm_head into every head, as the
authors' heads start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import ModelLoadError
from .base import Target
from .medusa import MedusaConfig, MedusaHead, target_lm_head

WEIGHTS = "medusa_lm_head.safetensors"
PICKLED = "medusa_lm_head.pt"
CONFIG = "config.json"


def is_medusa_layout(folder: str | Path) -> bool:
    """Whether `folder` holds Medusa heads in the authors' layout (safetensors or the refused pickle)."""
    path = Path(folder).expanduser()
    return (path / WEIGHTS).is_file() or (path / PICKLED).is_file()


def save_medusa_layout(head: MedusaHead, folder: str | Path, model: Any, dtype: torch.dtype = torch.bfloat16,
                       base_model: str = "") -> Path:
    """Write `head` as the Medusa authors' code saves heads; `model` is the target (a tied head's output layers are
    its lm_head)."""
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    config = head.config
    tensors: dict[str, torch.Tensor] = {}
    for name, value in head.state_dict().items():  # blocks.{i}.{j}.linear.* -> {i}.{j}.linear.*
        if name.startswith("blocks."):
            tensors[name.removeprefix("blocks.")] = value
    for i in range(config.num_heads):  # lm_heads.{i}.weight, or the target's -> {i}.{num_layers}.weight
        own = head.state_dict().get(f"lm_heads.{i}.weight")
        tensors[f"{i}.{config.num_layers}.weight"] = own if own is not None else target_lm_head(model)
    save_file({k: v.detach().to("cpu", dtype).clone().contiguous() for k, v in tensors.items()}, str(out / WEIGHTS),
              metadata={"format": "pt"})
    record = {"medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
              "base_model_name_or_path": base_model or str(getattr(model, "name", "")),
              "hidden_size": config.hidden_size, "vocab_size": config.vocab_size}
    (out / CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    return out


def load_medusa_layout(folder: str | Path, model: Any) -> MedusaHead:
    """The Medusa heads saved in `folder` (the authors' layout) on `model`'s device and dtype, refused with the
    cause named when the folder is malformed or its shapes do not fit `model`."""
    path = Path(folder).expanduser()
    if not (path / WEIGHTS).is_file():
        if (path / PICKLED).is_file():
            raise ModelLoadError(f"{path} holds {PICKLED}, a pickle, which fastdecode never loads (it can run code). "
                                 f"Convert it once where you trust it: load it with torch and save it with "
                                 f"safetensors.torch.save_file as {WEIGHTS}.")
        raise ModelLoadError(f"{path} has no {WEIGHTS}: it is not a Medusa head folder.")
    try:
        record = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path / CONFIG} is missing or not JSON ({e}); a Medusa folder has one with "
                             "medusa_num_heads and medusa_num_layers.") from None
    try:
        tensors = load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{path / WEIGHTS} is corrupt or truncated ({e}).") from None
    tensors = {k.removeprefix("medusa_head."): v for k, v in tensors.items()}
    heads, layers = _shape(record, tensors, path)
    H, V = int(model.config.hidden_size), int(model.config.vocab_size)
    lm = target_lm_head(model).detach().float().cpu()
    wrong = [f"{k} {tuple(v.shape)}" for k, v in tensors.items()
             if v.shape != ((V, H) if k.endswith(f".{layers}.weight") else (H, H) if k.endswith("weight") else (H,))]
    if wrong:
        raise ModelLoadError(f"{path / WEIGHTS} does not fit {getattr(model, 'name', 'this model')!r} (hidden "
                             f"{H}, vocabulary {V}): {', '.join(wrong[:3])}. Load the heads trained for this target.")
    tied = all(torch.equal(tensors[f"{i}.{layers}.weight"].float(), lm) for i in range(heads))
    head = MedusaHead(MedusaConfig(hidden_size=H, vocab_size=V, num_heads=heads, num_layers=layers,
                                   tie_lm_head=tied), Target.of(model))
    state = {}
    for i in range(heads):
        for j in range(layers):
            state[f"blocks.{i}.{j}.linear.weight"] = tensors[f"{i}.{j}.linear.weight"]
            state[f"blocks.{i}.{j}.linear.bias"] = tensors[f"{i}.{j}.linear.bias"]
        if not tied:
            state[f"lm_heads.{i}.weight"] = tensors[f"{i}.{layers}.weight"]
    head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    dtype = getattr(model, "dtype", None)
    return head.to(device=getattr(model, "device", None) or "cpu",
                   dtype=dtype if isinstance(dtype, torch.dtype) else None).eval()


def _shape(record: dict, tensors: dict[str, torch.Tensor], path: Path) -> tuple[int, int]:
    """(heads, residual blocks per head) from config.json, checked against the tensor names."""
    try:
        heads, layers = int(record["medusa_num_heads"]), int(record.get("medusa_num_layers", 1))
    except (KeyError, TypeError, ValueError):
        raise ModelLoadError(f"{path / CONFIG} gives no medusa_num_heads: it is not a Medusa config.") from None
    expected = {f"{i}.{j}.linear.{p}" for i in range(heads) for j in range(layers) for p in ("weight", "bias")}
    expected |= {f"{i}.{layers}.weight" for i in range(heads)}
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ModelLoadError(f"{path / WEIGHTS} does not hold {heads} heads of {layers} block(s) as config.json says: "
                             f"missing {missing[:3] or 'none'}, unexpected {extra[:3] or 'none'}.")
    return heads, layers
