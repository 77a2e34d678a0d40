"""Model adapters and loading: kinds, Auto classes, the diffusion logits conventions."""

from __future__ import annotations

import json
import shutil

import torch
from transformers import AutoModel, AutoModelForCausalLM, LlamaForCausalLM

import fastdecode
from fastdecode.models.mdlm import MDLMForMaskedDiffusion


def test_load_detects_kinds(causal, diffusion):
    assert causal.kind == "causal" and isinstance(causal, fastdecode.CausalLM)
    assert diffusion.kind == "diffusion" and diffusion.mask_token_id == 3 and not diffusion.shifted
    assert causal.dtype == torch.float32 and causal.device.type == "cpu"
    info = diffusion.describe()
    assert info["mask_token_id"] == 3 and info["vocab_size"] == 320


def test_diffusion_model_loads_through_auto_classes(diffusion_dir):
    model = AutoModel.from_pretrained(diffusion_dir)
    assert isinstance(model, MDLMForMaskedDiffusion)
    canvas = torch.tensor([[0, 10, 3, 3]])
    torch.testing.assert_close(model(canvas).logits, fastdecode.load(diffusion_dir).forward(canvas))


def test_causal_model_loads_through_auto_classes(causal_dir, causal):
    model = AutoModelForCausalLM.from_pretrained(causal_dir)
    ids = torch.tensor([[0, 10, 11]])
    torch.testing.assert_close(model(ids).logits, causal.forward(ids, torch.arange(3)[None]))


def test_diffusion_attention_is_bidirectional(diffusion):
    canvas = torch.tensor([[0, 10, 11, 3, 3, 12]])
    changed = canvas.clone()
    changed[0, -1] = 40  # change the last token: earlier positions must see it
    a, b = diffusion.forward(canvas), diffusion.forward(changed)
    assert not torch.allclose(a[0, 1], b[0, 1])


def test_shifted_convention_realigns_logits(tmp_path, diffusion_dir):
    shutil.copytree(diffusion_dir, tmp_path / "m")
    cfg_path = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["logits_shift"] = True
    cfg_path.write_text(json.dumps(cfg))
    same, shifted = fastdecode.load(diffusion_dir), fastdecode.load(tmp_path / "m")
    assert shifted.shifted
    canvas = torch.tensor([[0, 10, 11, 3, 3, 12]])
    raw = same.forward(canvas)
    torch.testing.assert_close(shifted.forward(canvas)[:, 1:], raw[:, :-1])


def test_mdlm_initialised_from_llama_with_causal_mask_matches_llama(causal):
    """Same parameter names and RoPE layout: the AR-to-diffusion initialisation is exact."""
    from fastdecode.models.mdlm import MDLMConfig

    llama: LlamaForCausalLM = causal.model
    c = llama.config
    cfg = MDLMConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                     num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
                     rope_theta=c.rope_parameters["rope_theta"])
    mdlm = MDLMForMaskedDiffusion(cfg).eval()
    missing, unexpected = mdlm.load_state_dict(llama.state_dict(), strict=False)
    assert not missing
    ids = torch.tensor([[0, 10, 11, 12, 13]])
    causal_mask = torch.ones(5, 5, dtype=torch.bool).tril()
    for layer in mdlm.model.layers:  # run the bidirectional blocks with a causal mask
        layer.self_attn.forward = _with_mask(layer.self_attn.forward, causal_mask)
    torch.testing.assert_close(mdlm(ids).logits, llama(ids).logits, rtol=1e-4, atol=1e-4)


def _with_mask(fn, mask):
    return lambda x, cos, sin, _mask: fn(x, cos, sin, mask)
