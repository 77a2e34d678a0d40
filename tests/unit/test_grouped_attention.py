"""fastdecode's own dense attention (`attention.grouped`, switched by `use_grouped_attention`): equal to SDPA up to
rounding on grouped-query shapes with arbitrary masks, and exact mode's identity holds under it (every forward of a
generation runs it, so a verification and a decode step round alike)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastdecode
from fastdecode import attention

PROMPTS = ["the quick brown fox", "def add(a, b):", "0123456789 ABC abc the lazy dog jumps"]


@pytest.fixture
def grouped_on():
    attention.use_grouped_attention(True)
    try:
        yield
    finally:
        attention.use_grouped_attention(False)


@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 2), (6, 1)])
def test_grouped_equals_sdpa_on_any_mask(hq, hkv):
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    B, Q, K, D = 2, 5, 37, 16
    q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((hq, Q), (hkv, K), (hkv, K)))
    mask = torch.rand(B, 1, Q, K, generator=g) < 0.6
    mask[..., 0] = True  # every row sees a column (SDPA gives NaN for a row that sees none)
    scale = 0.3
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1),
                                          attn_mask=mask, scale=scale)
    got = attention.grouped(q, k, v, mask, scale)
    assert got.shape == want.shape == (B, hq, Q, D)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # bfloat16 inputs: computed in float32, returned in bfloat16
    low = attention.grouped(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, scale)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), want, atol=3e-2, rtol=3e-2)


def test_a_row_that_sees_nothing_stays_finite():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    mask = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, 1] = False
    assert torch.isfinite(attention.grouped(q, k, v, mask, 0.5)).all()


def test_switch_routes_the_plan_driven_forward(causal_dir, load_model, grouped_on):
    """On: the model's forward runs `grouped` (spied) and its logits stay SDPA's up to rounding (float32)."""
    model = load_model(causal_dir)
    ids = model.tokenizer(PROMPTS[2], return_tensors="pt").input_ids.to(model.device)
    positions = torch.arange(ids.shape[1], device=model.device)[None]
    calls = []
    real = attention.grouped

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    attention.grouped = spy
    try:
        on = model.forward(ids, positions)
    finally:
        attention.grouped = real
    attention.use_grouped_attention(False)
    off = model.forward(ids, positions)
    assert len(calls) == model.model.config.num_hidden_layers
    torch.testing.assert_close(on, off, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("method", "params"), [("spec.pld", {}), ("spec.suffix", {}), ("spec.ngram", {})])
def test_exact_mode_identity_holds_under_grouped_attention(causal_dir, load_model, grouped_on, method, params):
    """bfloat16 exact mode (width 8): chain methods equal ar.greedy, both run with the grouped attention."""
    model = load_model(causal_dir, dtype="bfloat16", exact=8)
    want = [r.token_ids for r in fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)]
    got = [r.token_ids for r in fastdecode.generate(model, PROMPTS, method, max_new_tokens=40, **params)]
    assert got == want
