"""The direct forward's fused setting (`NativeForward.fuse`, models/native.py): the layers' elementwise runs through
`torch.compile`. On the CPU the functions are traced whole (`fullgraph=True`, so a graph break fails here) with the
`eager` backend, which runs the traced operations as they are: the logits must be the unfused forward's, bit for bit.
With FASTDECODE_TEST_DEVICE=cuda the functions are compiled to fused kernels (inductor), and the identity that exact
mode promises is checked under that setting: every lossless method equals `ar.greedy` run with the same setting."""

from __future__ import annotations

import pytest
import torch

import fastdecode

PROMPTS = ["the quick brown fox", "def add(a, b):", "0123456789 ABC abc the lazy dog jumps"]


@pytest.fixture(scope="module")
def backend(device) -> str:
    return "inductor" if device.type == "cuda" else "eager"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_traced_fused_forward_gives_the_plain_logits(causal_dir, load_model, backend, dtype):
    if backend != "eager":
        pytest.skip("inductor's kernels round differently: the device test below checks identity under the setting")
    model = load_model(causal_dir, dtype=dtype)
    assert model.native is not None and not model.native.fused
    ids = model.tokenizer(PROMPTS[2], return_tensors="pt").input_ids.to(model.device)
    positions = torch.arange(ids.shape[1], device=model.device)[None]
    plain = model.forward(ids, positions)
    traced = []

    def eager(graph, inputs):  # the "eager" backend, recording what dynamo traced
        traced.append(graph)
        return graph.forward

    model.native.fuse(backend=eager)
    try:
        assert model.native.fused
        fused = model.forward(ids, positions)
    finally:
        model.native.fuse(False)
    assert not model.native.fused
    # each function traced whole, once per shape: the norms, add + norm, the gated MLP, the rotary on queries and on
    # keys (fewer key heads: another shape)
    assert len(traced) == 5
    assert torch.equal(plain, fused)


@pytest.mark.parametrize(("method", "params"), [("spec.suffix", {}), ("spec.pld", {}), ("spec.suffix", {"tree": True})])
def test_lossless_methods_equal_greedy_under_the_fused_setting(causal_dir, load_model, backend, method, params):
    """bfloat16 exact mode (width 8), graphs as the device gives them (captured on CUDA, replayed on the CPU)."""
    model = load_model(causal_dir, dtype="bfloat16", exact=8,
                       graphs="cuda" if backend == "inductor" else "replay")
    assert model.native is not None
    model.native.fuse(backend=backend)
    try:
        want = [r.token_ids for r in fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)]
        got = [r.token_ids for r in fastdecode.generate(model, PROMPTS, method, max_new_tokens=40, **params)]
    finally:
        model.native.fuse(False)
    assert got == want
