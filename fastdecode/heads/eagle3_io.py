"""EAGLE-3 heads in the layout SpecForge trains and SGLang and vLLM serve, read and written.

Their folder is a transformers-style `config.json` (`architectures: ["LlamaForCausalLMEagle3"]`, a one-layer Llama
config plus `draft_vocab_size`, `target_hidden_size`) and `model.safetensors` with `fc.weight`, `midlayer.*`,
`norm.weight`, `lm_head.weight`, `d2t` (draft id -> offset to the target id) and `t2d` (bool over the target
vocabulary): the names `Eagle3Head` already uses, so the tensors map one to one.

The fused target layers are written in both conventions in use: SGLang and SpecForge read
`eagle_config.eagle_aux_hidden_state_layer_ids` as layer outputs (ours: 0-based, output of decoder layer i); vLLM
reads the top-level `eagle_aux_hidden_state_layer_ids` as hidden-state indices (i + 1: 0 is the embeddings). A folder
without either gets SGLang's default for the target, (2, L//2, L-3) in vLLM's indexing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..errors import IncompatibleMethodError, ModelLoadError
from .base import Target
from .eagle3 import Eagle3Config, Eagle3Head
from .io import CONFIG, WEIGHTS, _dtype, fit_tensors, head_for, held, read_weights, resolve_head

ARCHITECTURE = "LlamaForCausalLMEagle3"


def is_eagle3_layout(folder: str | Path) -> bool:
    """Whether `folder` holds an EAGLE-3 head in SpecForge/SGLang/vLLM's layout (not one written by save_head)."""
    path = Path(folder).expanduser() / CONFIG
    if not path.is_file():
        return False
    try:
        record = json.loads(path.read_text())
    except ValueError:
        return False
    return isinstance(record, dict) and "fastdecode_head" not in record and (
        any("eagle3" in str(a).lower() for a in record.get("architectures") or []) or "draft_vocab_size" in record)


def save_eagle3(head: Eagle3Head, folder: str | Path, dtype: str | torch.dtype = "bfloat16") -> Path:
    """Write `head` in SpecForge/SGLang/vLLM's layout (floating tensors in `dtype`); the target record rides along
    under `fastdecode_target`, which those engines ignore."""
    c = head.config
    cast = _dtype(dtype)
    tensors = {k: v.detach().to("cpu", dtype=cast if v.is_floating_point() else v.dtype, copy=True).contiguous()
               for k, v in head.state_dict().items()}
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    ours = list(c.layers)
    record: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "max_position_embeddings": 2048,
        "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False, "torch_dtype": str(cast).removeprefix("torch."),
        "norm_before_residual": c.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in ours],  # vLLM: hidden-state index, 0 = embeddings
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ours, "use_aux_hidden_state": True},  # SGLang
        "fastdecode_target": dataclasses.asdict(head.target) if head.target is not None else None,
    }
    (out / CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    return out


def load_eagle3(folder: str | Path, model: Any | None = None, device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None) -> Eagle3Head:
    """An EAGLE-3 head from a SpecForge/SGLang/vLLM folder, for `model` (a loaded target: its layer count gives the
    default fused layers; its embeddings, if the folder carries a copy, must match). Safetensors only."""
    root = Path(folder).expanduser()
    record = json.loads((root / CONFIG).read_text())
    config = _config(record, model)
    saved = record.get("fastdecode_target")
    target = Target(**saved) if isinstance(saved, dict) else (Target.of(model) if model is not None else None)
    head = Eagle3Head(config, target)
    tensors = _tensors(root)
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is not None and model is not None:
        _check_embeddings(embed, model, root)
    if "d2t" not in tensors:  # full-vocabulary heads may leave the maps out
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    if "t2d" not in tensors:
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(config.draft_vocab_size) + tensors["d2t"].long()] = True
        tensors["t2d"] = t2d
    tensors["d2t"], tensors["t2d"] = tensors["d2t"].long(), tensors["t2d"].bool()
    fit_tensors(head, tensors, root / WEIGHTS, "an EAGLE-3 head with its config.json",
                "Only single-layer Llama EAGLE-3 heads load.")
    head = head.to(device=device) if device is not None else head
    if dtype is not None:
        head = head.to(dtype=_dtype(dtype))
    return head.eval()


def eagle3_for(model: Any, head: str | Path | None = None) -> Eagle3Head:
    """The EAGLE-3 head spec.eagle3 decodes `model` with: `head` a folder in our layout or SpecForge/SGLang/vLLM's,
    or `zoo:<model>/<name>`; None = the head shipped for a zoo model. On the model's device and dtype."""
    if head is not None and not str(head).startswith("zoo:") and is_eagle3_layout(head):
        dtype = getattr(model, "dtype", None)
        found = held(model, ("eagle3-layout", str(head)), Path(head).expanduser(),
                     lambda: load_eagle3(head, model, getattr(model, "device", None),
                                         dtype if isinstance(dtype, torch.dtype) else None))
        _check_target(found, model, str(head))
        return found
    if head is not None:
        resolve_head(head)  # a clear error for a missing folder before the kind is looked at
    loaded = head_for(model, "eagle3", head)
    assert isinstance(loaded, Eagle3Head)
    return loaded


def _config(record: dict[str, Any], model: Any | None) -> Eagle3Config:
    def need(key: str) -> Any:
        if key not in record:
            raise ModelLoadError(f"config.json of this EAGLE-3 head has no {key!r}: it is not a "
                                 f"{ARCHITECTURE} checkpoint.")
        return record[key]

    if int(record.get("num_hidden_layers", 1)) != 1:
        raise ModelLoadError(f"This EAGLE-3 head has {record['num_hidden_layers']} draft layers; fastdecode runs "
                             "single-layer EAGLE-3 heads (LlamaForCausalLMEagle3).")
    hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    vocab = int(need("vocab_size"))
    return Eagle3Config(
        hidden_size=hidden, target_hidden_size=int(record.get("target_hidden_size") or hidden),
        num_heads=heads, num_kv_heads=int(record.get("num_key_value_heads") or heads),
        head_dim=int(record.get("head_dim") or hidden // heads), intermediate_size=int(need("intermediate_size")),
        vocab_size=vocab, draft_vocab_size=int(record.get("draft_vocab_size") or vocab),
        layers=_aux_layers(record, model), rms_norm_eps=float(record.get("rms_norm_eps", 1e-6)),
        rope_theta=float(record.get("rope_theta") or 10000.0),
        norm_before_residual=bool(record.get("norm_before_residual", False)))


def _aux_layers(record: dict[str, Any], model: Any | None) -> tuple[int, ...]:
    """Our 0-based layer-output indices from SGLang's (same), vLLM's (+1) or SGLang's default (needs the target)."""
    sglang = (record.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if sglang:
        return tuple(int(i) for i in sglang)
    vllm = record.get("eagle_aux_hidden_state_layer_ids")
    if vllm:
        return tuple(int(i) - 1 for i in vllm)
    if model is None:
        raise ModelLoadError("This EAGLE-3 head names no target layers (eagle_aux_hidden_state_layer_ids): load it "
                             "for its target model, whose depth gives the default layers.")
    L = Target.of(model).num_layers
    return tuple(i - 1 for i in (2, L // 2, L - 3))


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    return read_weights(root / WEIGHTS, "EAGLE-3 head weights")


def _check_embeddings(embed: torch.Tensor, model: Any, root: Path) -> None:
    """A head that ships embeddings must ship its target's: this head always reads the target's own."""
    mine = model.model.get_input_embeddings().weight
    if embed.shape != mine.shape or not torch.allclose(embed.float(), mine.detach().float().cpu(), atol=1e-2,
                                                       rtol=1e-2):
        raise ModelLoadError(f"{root} carries token embeddings that differ from {model.name!r}'s: it was trained "
                             "for another target (spec.eagle3 reads the target's embeddings).")


def _check_target(head: Eagle3Head, model: Any, name: str) -> None:
    c, found = head.config, Target.of(model)
    if head.target is not None and head.target.num_layers:
        head.target.check(model, f"the eagle3 head {name}")
    wrong = [f"{what} {theirs} (the head expects {mine})" for what, mine, theirs in (
        ("hidden size", c.target_hidden_size, found.hidden_size), ("vocabulary", c.vocab_size, found.vocab_size))
        if theirs and mine != theirs]
    if any(i >= found.num_layers or i < 0 for i in c.layers):
        wrong.append(f"{found.num_layers} layers (the head reads layers {list(c.layers)})")
    if wrong:
        raise IncompatibleMethodError(f"The EAGLE-3 head {name} does not fit {found.name!r}: it has "
                                      f"{', '.join(wrong)}. Load the head trained for this target.")
