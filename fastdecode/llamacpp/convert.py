"""Write a loaded Llama-family model as a GGUF file that llama.cpp runs on the same weights.

Only the weights and the shape travel: the file declares no vocabulary of its own (llama.cpp's "none" tokenizer
with the model's vocabulary size), because fastdecode tokenises with the model's own tokenizer and hands llama.cpp
token ids, so both runtimes see the same ids. transformers' Llama rotates query/key halves (rotate_half), llama.cpp's
`llama` architecture rotates adjacent pairs: the query and key projections are permuted so both give the same
attention. A converted file is cached by the checkpoint's identity (`cached_gguf`), so a benchmark converts once.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import IncompatibleMethodError, MissingDependencyError
from ..models.causal import CausalLM

# model types whose tensors map one to one onto llama.cpp's `llama` architecture
LLAMA_TYPES = ("llama", "mistral")
DTYPES = {"f32": (torch.float32, 0), "f16": (torch.float16, 1)}  # name -> (tensor dtype, GGUF file type)


def check_convertible(model: CausalLM) -> None:
    """Refuse, with the reason, a model whose forward the `llama` GGUF architecture would not reproduce."""
    cfg = model.config
    model_type = str(getattr(cfg, "model_type", ""))
    why = ""
    if model_type not in LLAMA_TYPES:
        why = f"its model_type is {model_type!r}; the converter writes llama.cpp's `llama` architecture ({LLAMA_TYPES})"
    elif getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        why = "it has attention or MLP biases, which the converter does not write"
    elif (getattr(cfg, "sliding_window", None) or 0) and model_type == "mistral":
        why = f"it has a sliding window ({cfg.sliding_window}), which llama.cpp's `llama` architecture does not apply"
    else:
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if kind not in (None, "default"):
            why = f"it uses RoPE scaling {kind!r}, which the converter does not write"
    if why:
        raise IncompatibleMethodError(
            f"{model.name!r} cannot be converted to GGUF for llama.cpp: {why}. Compare with hf.greedy instead, or "
            "convert the checkpoint with llama.cpp's own convert_hf_to_gguf.py and load it in llama.cpp directly."
        )


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a query/key projection from rotate-half order to llama.cpp's adjacent-pair order, per head."""
    out, inp = w.shape
    return w.reshape(heads, 2, out // heads // 2, inp).transpose(1, 2).reshape(out, inp)


def write_gguf(model: CausalLM, path: str | Path, dtype: str = "f32") -> Path:
    """Write `model`'s weights to `path` as a GGUF file of llama.cpp's `llama` architecture; returns the path."""
    try:
        import gguf
    except ImportError as e:
        raise MissingDependencyError(
            "Writing GGUF needs the gguf package: pip install 'fastdecode[llamacpp]'."
        ) from e
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    check_convertible(model)
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0)
    state = {k: v.detach() for k, v in model.model.state_dict().items()}
    torch_dtype, file_type = DTYPES[dtype]

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    writer: Any = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(model.name)
    writer.add_context_length(int(model.max_positions or 2048))
    writer.add_embedding_length(int(cfg.hidden_size))
    writer.add_block_count(int(cfg.num_hidden_layers))
    writer.add_feed_forward_length(int(cfg.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_file_type(file_type)
    writer.add_vocab_size(model.vocab_size)
    writer.add_tokenizer_model("none")  # ids come from the model's own tokenizer (module docstring)

    def put(name: str, tensor: torch.Tensor, keep_f32: bool = False) -> None:
        writer.add_tensor(name, tensor.to(torch.float32 if keep_f32 else torch_dtype).cpu().contiguous().numpy())

    put("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(int(cfg.num_hidden_layers)):
        pre = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", state[pre + "input_layernorm.weight"], keep_f32=True)
        put(f"blk.{i}.attn_q.weight", _permute(state[pre + "self_attn.q_proj.weight"], heads))
        put(f"blk.{i}.attn_k.weight", _permute(state[pre + "self_attn.k_proj.weight"], kv_heads))
        put(f"blk.{i}.attn_v.weight", state[pre + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", state[pre + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", state[pre + "post_attention_layernorm.weight"], keep_f32=True)
        put(f"blk.{i}.ffn_gate.weight", state[pre + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", state[pre + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", state[pre + "mlp.down_proj.weight"])
    put("output_norm.weight", state["model.norm.weight"], keep_f32=True)
    if not getattr(cfg, "tie_word_embeddings", False):
        put("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)  # the library never prints
    writer.close()
    os.replace(tmp, path)  # a half-written file never sits under the final name
    return path


def fingerprint(model: CausalLM, dtype: str) -> str:
    """A short digest of the weights (a strided sample of every tensor) and the config, naming a cached file."""
    digest = hashlib.sha256(f"{model.config.to_json_string()}|{dtype}".encode())
    for name, tensor in model.model.state_dict().items():
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy()
        digest.update(name.encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """Where converted files are kept: $FASTDECODE_CACHE/gguf, else ~/.cache/fastdecode/gguf."""
    root = os.environ.get("FASTDECODE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fastdecode")
    return Path(root) / "gguf"


def cached_gguf(model: CausalLM, dtype: str = "f32") -> Path:
    """The GGUF file of `model` in the cache, written on first use."""
    check_convertible(model)
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model.name)[-48:] or "model"
    path = cache_dir() / f"{safe}-{fingerprint(model, dtype)}-{dtype}.gguf"
    return path if path.exists() else write_gguf(model, path, dtype)
