"""DFlash drafters in the layout their users already have: the authors' (z-lab/dflash `DFlashDraftModel`, a Qwen3
config with `block_size`, `num_target_layers` and `dflash_config.{mask_token_id, target_layer_ids}`), which SpecForge
writes and vLLM and SGLang read (`--speculative-algorithm DFLASH`, `method: "dflash"`).

Tensor names are the authors' module's: `fc.weight`, `hidden_norm.weight`, `norm.weight` and
`layers.{i}.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj, input_layernorm,
post_attention_layernorm}.weight`; `DFlashHead` uses the same names, so the mapping is the config alone. The drafter
carries no embeddings or lm_head (it shares the target's). Weights are read from safetensors only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..errors import IncompatibleMethodError, ModelLoadError
from .base import Target
from .dflash import DFlashConfig, DFlashHead, mask_token_of
from .io import fit_tensors, read_weights

ARCHITECTURE = "DFlashDraftModel"
SHARED = ("embed_tokens.weight", "lm_head.weight")  # the target's, ignored if a checkpoint carries them


def authors_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The authors' default `target_layer_ids` (`build_target_layer_ids`), for configs that do not list them."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers))


def is_dflash_layout(folder: str | Path) -> bool:
    """Whether `folder` holds a DFlash checkpoint in the authors' layout (its config.json names the architecture or
    has a `dflash_config`)."""
    path = Path(folder).expanduser() / "config.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and (ARCHITECTURE in (record.get("architectures") or [])
                                         or "dflash_config" in record)


def save_dflash(head: DFlashHead, folder: str | Path, target: Any = None, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `head` as the authors' layout: config.json + model.safetensors (floating tensors in `dtype`). `target`
    (the loaded target model) fills the config's `vocab_size` and `max_position_embeddings` when given."""
    cfg = head.config
    rec = head.target or Target()
    vocab = int(getattr(target, "vocab_size", 0) or rec.vocab_size)
    positions = int(getattr(target, "max_positions", 0) or 0) if target is not None else 0
    record = {
        "architectures": [ARCHITECTURE],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layers)},
        "dtype": str(dtype).removeprefix("torch."),
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "layer_types": ["full_attention"] * cfg.num_layers,
        "max_position_embeddings": positions or 4096,
        "max_window_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_target_layers": rec.num_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": cfg.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
        "fastdecode_target": {"name": rec.name, "architecture": rec.architecture},
    }
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
               for k, v in head.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def load_dflash(folder: str | Path, model: Any, device: Any = None, dtype: torch.dtype | None = None) -> DFlashHead:
    """The DFlash checkpoint in `folder` (authors' layout) as a `DFlashHead` on `model` (the loaded target), on the
    model's device and dtype unless given. A checkpoint for another target (hidden size, layer count, vocabulary) or
    with options this drafter does not implement is refused, naming the field."""
    root = Path(folder).expanduser()
    if not is_dflash_layout(root):
        raise ModelLoadError(f"{root} is not a DFlash checkpoint: its config.json names no {ARCHITECTURE} and has no "
                             "dflash_config.")
    record = json.loads((root / "config.json").read_text())
    config = _config(record, model, root)
    target = Target.of(model)
    head = DFlashHead(config, target)
    state = _tensors(root)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if k not in SHARED}
    fit_tensors(head, state, root, "a DFlash drafter with its config")
    model_dtype = getattr(model, "dtype", None)
    dtype = dtype or (model_dtype if isinstance(model_dtype, torch.dtype) else None)
    return head.to(device=device or getattr(model, "device", None), dtype=dtype).eval()


def _config(record: dict[str, Any], model: Any, root: Path) -> DFlashConfig:
    """The `DFlashConfig` a checkpoint's config.json describes, checked against the target `model`."""
    target = Target.of(model)
    found = {"hidden_size": record.get("hidden_size"), "num_layers": record.get("num_target_layers"),
             "vocab_size": record.get("vocab_size")}
    wrong = [f"{k} {v} (the target has {getattr(target, k)})" for k, v in found.items()
             if v is not None and getattr(target, k) and int(v) != getattr(target, k)]
    if wrong:
        raise IncompatibleMethodError(
            f"The DFlash drafter {root} was made for another target: its config gives {', '.join(wrong)}. Load the "
            f"drafter trained for {target.name or 'this model'}.")
    if record.get("attention_bias"):
        raise ModelLoadError(f"{root} uses attention biases, which this DFlash drafter does not implement.")
    types = set(record.get("layer_types") or ["full_attention"])
    if types != {"full_attention"} or record.get("use_sliding_window"):
        raise ModelLoadError(f"{root} has sliding-window draft layers ({sorted(types)}), which this DFlash drafter "
                             "does not implement.")
    rope = record.get("rope_parameters") or record.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ModelLoadError(f"{root} uses rope scaling {rope!r}; this DFlash drafter implements the default rotary "
                             "embedding only.")
    extra = record.get("dflash_config") or {}
    layers = int(record["num_hidden_layers"])
    ids = extra.get("target_layer_ids") or authors_layer_ids(int(record.get("num_target_layers") or 0), layers)
    H, heads = int(record["hidden_size"]), int(record["num_attention_heads"])
    mask = extra.get("mask_token_id")
    if mask is None:
        mask = mask_token_of(model)
    return DFlashConfig(
        hidden_size=H, num_layers=layers, num_heads=heads,
        num_kv_heads=int(record.get("num_key_value_heads") or heads),
        head_dim=int(record.get("head_dim") or H // heads), intermediate_size=int(record["intermediate_size"]),
        target_layers=tuple(int(i) for i in ids), block_size=int(record.get("block_size") or 16),
        mask_token_id=int(mask), rms_norm_eps=float(record.get("rms_norm_eps") or 1e-6),
        rope_theta=float(rope.get("rope_theta") or record.get("rope_theta") or 10000.0))


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: model.safetensors, or the shards its index lists; pickles are refused."""
    index = root / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else \
        ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(read_weights(root / name, "DFlash weights"))
    return state
