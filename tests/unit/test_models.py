"""Model adapters and loading: kinds, Auto classes, the diffusion logits conventions."""

from __future__ import annotations

import json
import shutil

import torch
from transformers import AutoModel, AutoModelForCausalLM, LlamaForCausalLM

import fastdecode
from fastdecode.models.mdlm import MDLMForMaskedDiffusion


def test_load_detects_kinds(causal, diffusion, device):
    assert causal.kind == "causal" and isinstance(causal, fastdecode.CausalLM)
    assert diffusion.kind == "diffusion" and diffusion.mask_token_id == 3 and not diffusion.shifted
    assert causal.dtype == torch.float32 and causal.device.type == device.type  # the test device (conftest)
    info = diffusion.describe()
    assert info["mask_token_id"] == 3 and info["vocab_size"] == 320


def test_diffusion_model_loads_through_auto_classes(diffusion_dir, device, to_device):
    model = to_device(AutoModel.from_pretrained(diffusion_dir))
    assert isinstance(model, MDLMForMaskedDiffusion)
    canvas = torch.tensor([[0, 10, 3, 3]], device=device)
    torch.testing.assert_close(model(canvas).logits, fastdecode.load(diffusion_dir).forward(canvas))


def test_causal_model_loads_through_auto_classes(causal_dir, causal, device, to_device):
    model = to_device(AutoModelForCausalLM.from_pretrained(causal_dir))
    ids = torch.tensor([[0, 10, 11]], device=device)
    torch.testing.assert_close(model(ids).logits, causal.forward(ids, torch.arange(3, device=device)[None]))


def test_diffusion_attention_is_bidirectional(diffusion):
    canvas = torch.tensor([[0, 10, 11, 3, 3, 12]], device=diffusion.device)
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
    canvas = torch.tensor([[0, 10, 11, 3, 3, 12]], device=same.device)
    raw = same.forward(canvas)
    torch.testing.assert_close(shifted.forward(canvas)[:, 1:], raw[:, :-1])


def test_mdlm_initialised_from_llama_with_causal_mask_matches_llama(causal, to_device):
    """Same parameter names and RoPE layout: the AR-to-diffusion initialisation is exact."""
    from fastdecode.models.mdlm import MDLMConfig

    llama: LlamaForCausalLM = causal.model
    c = llama.config
    cfg = MDLMConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                     num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
                     rope_theta=c.rope_parameters["rope_theta"])
    mdlm = to_device(MDLMForMaskedDiffusion(cfg).eval())
    missing, unexpected = mdlm.load_state_dict(llama.state_dict(), strict=False)
    assert not missing
    ids = torch.tensor([[0, 10, 11, 12, 13]], device=causal.device)
    causal_mask = torch.ones(5, 5, dtype=torch.bool, device=causal.device).tril()
    for layer in mdlm.model.layers:  # run the bidirectional blocks with a causal mask
        layer.self_attn.forward = _with_mask(layer.self_attn.forward, causal_mask)
    torch.testing.assert_close(mdlm(ids).logits, llama(ids).logits, rtol=1e-4, atol=1e-4)


def _with_mask(fn, mask):
    return lambda x, cos, sin, _mask, *rest: fn(x, cos, sin, mask, *rest)


def test_causal_forward_returns_the_last_hidden_states_only_when_asked(causal):
    """`hidden=True` gives transformers' hidden_states[-1]: after the final norm, what the LM head reads."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fastdecode.models.causal import CausalOutput

    ids = torch.tensor([causal.encode("the quick brown fox")], device=causal.device)
    pos = torch.arange(ids.shape[1], device=causal.device)[None]
    plain = causal.forward(ids, pos, num_logits=2)
    assert isinstance(plain, torch.Tensor) and plain.shape[:2] == (1, 2)
    out = causal.forward(ids, pos, num_logits=2, hidden=True)
    assert isinstance(out, CausalOutput) and torch.equal(out.logits, plain)
    with torch.no_grad():
        ref = causal.model(input_ids=ids, output_hidden_states=True)
        base = causal.model.model(input_ids=ids).last_hidden_state
    assert out.hidden.shape == (1, ids.shape[1], causal.config.hidden_size)  # every position, not only num_logits
    assert torch.equal(out.hidden, ref.hidden_states[-1]) and torch.allclose(out.hidden, base)
    with torch.inference_mode():
        assert torch.allclose(causal.model.lm_head(out.hidden[:, -2:]), plain, atol=1e-5)  # after model.norm
    # with a cache: the hidden states of the new positions only, as the logits
    cache = causal.new_cache()
    causal.forward(ids[:, :3], pos[:, :3], cache)
    rest = causal.forward(ids[:, 3:], pos[:, 3:], cache, hidden=True)
    assert torch.allclose(rest.hidden, ref.hidden_states[-1][:, 3:], atol=1e-5)
    # GPT-2 applies its final norm (ln_f) outside the layers too: hidden_states[-1] is after it
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    gpt2 = fastdecode.CausalLM(GPT2LMHeadModel(config))
    x = torch.tensor([[3, 4, 5, 6]])
    g = gpt2.forward(x, torch.arange(4)[None], hidden=True)
    with torch.inference_mode():
        assert torch.allclose(gpt2.model.lm_head(g.hidden), g.logits, atol=1e-5)
        assert torch.equal(g.hidden, gpt2.model(input_ids=x, output_hidden_states=True).hidden_states[-1])
