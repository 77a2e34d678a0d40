"""llama.cpp as a reference runtime: the GGUF converter's weight layout (checked here, without llama.cpp), the
refusal when the optional extra is missing, and, where llama-cpp-python is installed, greedy tokens equal to
ar.greedy on the same weights."""

from __future__ import annotations

import importlib.machinery
import importlib.util

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import fastdecode
from fastdecode.errors import IncompatibleMethodError, MissingDependencyError
from fastdecode.llamacpp.convert import _permute, check_convertible

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this"]


def _rope_pairs(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """llama.cpp's `llama` RoPE: adjacent pairs (0, 1), (2, 3), ... rotated, x: [T, heads, D]."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [D/2]
    angle = positions[:, None].double() * freqs[None]  # [T, D/2]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    even, odd = x[..., 0::2].double(), x[..., 1::2].double()
    out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return out.reshape(x.shape)


def test_permuted_projections_give_transformers_attention_scores():
    """Rotate-half RoPE on the original rows equals adjacent-pair RoPE on the permuted rows: same q·k per head."""
    torch.manual_seed(0)
    heads, d, hidden, T = 3, 8, 16, 5
    wq, wk, x = torch.randn(heads * d, hidden), torch.randn(heads * d, hidden), torch.randn(T, hidden)
    positions = torch.arange(T) * 7
    freqs = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.cat([positions[:, None].double() * freqs[None]] * 2, dim=-1)  # [T, D] (rotate-half layout)
    q = (x @ wq.T).double().reshape(T, heads, d).transpose(0, 1)[None]  # [1, H, T, D]
    k = (x @ wk.T).double().reshape(T, heads, d).transpose(0, 1)[None]
    q_hf, k_hf = apply_rotary_pos_emb(q, k, angle.cos()[None], angle.sin()[None])
    scores_hf = q_hf[0] @ k_hf[0].transpose(-1, -2)  # [H, T, T]
    q_cpp = _rope_pairs((x @ _permute(wq, heads).T).reshape(T, heads, d), positions).transpose(0, 1)
    k_cpp = _rope_pairs((x @ _permute(wk, heads).T).reshape(T, heads, d), positions).transpose(0, 1)
    assert torch.allclose(q_cpp @ k_cpp.transpose(-1, -2), scores_hf, atol=1e-9)
    assert not torch.allclose((x @ wq.T).reshape(T, heads, d), (x @ _permute(wq, heads).T).reshape(T, heads, d))


def test_gguf_file_holds_every_weight_in_llama_layout(causal, tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    from fastdecode.llamacpp.convert import cached_gguf, write_gguf

    path = write_gguf(causal, tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    cfg = causal.config
    assert len(tensors) == 2 + 9 * cfg.num_hidden_layers + (0 if cfg.tie_word_embeddings else 1)
    state = {k: v.cpu() for k, v in causal.model.state_dict().items()}  # the file's tensors are the host's
    wq = state["model.layers.1.self_attn.q_proj.weight"]
    q = torch.from_numpy(tensors["blk.1.attn_q.weight"].data.copy()).reshape(wq.shape)
    assert torch.equal(q, _permute(wq, cfg.num_attention_heads))
    down = tensors["blk.0.ffn_down.weight"].data
    assert torch.equal(torch.from_numpy(down.copy()).reshape(state["model.layers.0.mlp.down_proj.weight"].shape),
                       state["model.layers.0.mlp.down_proj.weight"])
    fields = {f.name: f for f in reader.fields.values()}
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "none"
    assert int(fields["llama.vocab_size"].parts[-1][0]) == causal.vocab_size
    assert not path.with_name(path.name + ".partial").exists()
    # the cache writes once per checkpoint and dtype
    first = cached_gguf(causal)
    assert cached_gguf(causal) == first and first.stat().st_size == path.stat().st_size


def test_models_llama_cpp_would_not_reproduce_are_refused(causal):
    cfg = causal.config
    cfg.attention_bias = True
    try:
        with pytest.raises(IncompatibleMethodError, match="biases"):
            check_convertible(causal)
    finally:
        cfg.attention_bias = False
    check_convertible(causal)


def test_missing_extra_says_how_to_install(causal, monkeypatch):
    method = fastdecode.get_method("llamacpp.greedy")
    real = importlib.util.find_spec

    def only_llama_cpp_missing(name, *a):  # gguf counts as installed whether or not this machine has it
        if name == "gguf":
            return importlib.machinery.ModuleSpec("gguf", None)
        return None if name == "llama_cpp" else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", only_llama_cpp_missing)
    assert method.missing() == ["llama-cpp-python"]
    with pytest.raises(MissingDependencyError, match="pip install 'llama-cpp-python'"):
        fastdecode.generate(causal, PROMPTS[0], "llamacpp.greedy", max_new_tokens=4)


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed (pip install 'fastdecode[llamacpp]')")
@pytest.mark.parametrize("method", ["llamacpp.greedy", "llamacpp.prompt_lookup"])
def test_llama_cpp_reproduces_ar_greedy(method, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    model = fastdecode.load("zoo:ar-small")
    prompts = ["Q: Sort these names: Ann Lee, Bob Moss, Cy Dunn\nA:", "def add(a, b):\n    return"]
    base = fastdecode.generate(model, prompts, "ar.greedy", max_new_tokens=24)
    out = fastdecode.generate(model, prompts, method, max_new_tokens=24)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    for r in out:
        assert r.stats.forwards <= r.stats.new_tokens and r.stats.accepted <= r.stats.proposed
