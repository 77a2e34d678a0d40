"""The direct forward's fused setting (`NativeForward.fuse`, models/native.py): the layers' elementwise runs through
`torch.compile`. On the CPU the functions are traced whole (`fullgraph=True`, so a graph break fails here) with the
`eager` backend, which runs the traced operations as they are: the logits must be the unfused forward's, bit for bit.
With FASTDECODE_TEST_DEVICE=cuda the functions are compiled to fused kernels (inductor), and the identity that exact
mode promises is checked under that setting: every lossless method equals `ar.greedy` run with the same setting."""

from __future__ import annotations

import importlib.util
import warnings

import device_sim
import pytest
import torch

import fastdecode
from fastdecode.errors import FastDecodeWarning, ParameterError
from fastdecode.models.causal import CausalLM
from fastdecode.models.native import fused_default

COMPILES = device_sim.compiling_tests()

PROMPTS = ["the quick brown fox", "def add(a, b):", "0123456789 ABC abc the lazy dog jumps"]


@pytest.fixture(scope="module")
def backend(device) -> str:
    return "inductor" if device.type == "cuda" else "eager"


@COMPILES
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
        with warnings.catch_warnings():
            warnings.simplefilter("error", FastDecodeWarning)  # a fallback to the unfused forward would prove nothing
            want = [r.token_ids for r in fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)]
            got = [r.token_ids for r in fastdecode.generate(model, PROMPTS, method, max_new_tokens=40, **params)]
        assert model.native.fused
    finally:
        model.native.fuse(False)
    assert got == want


def test_each_model_compiles_its_own_shapes_past_torchs_default_limit(causal_dir, load_model):
    """Twelve shapes through one model's fused functions, after another model compiled its own: no version limit is
    reached (each model's functions have their own code objects, and the limit is raised), so no fallback."""
    other = load_model(causal_dir)
    other.native.fuse(backend="eager")
    ids = other.tokenizer(PROMPTS[2], return_tensors="pt").input_ids.to(other.device)
    model = load_model(causal_dir)
    model.native.fuse(backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastDecodeWarning)
        for m in (other, model):
            for n in range(2, 14):
                m.forward(ids[:, :n], torch.arange(n, device=m.device)[None])
    assert model.native.fused and other.native.fused


def test_load_resolves_the_setting(causal_dir, load_model, device):
    """None: on only with CUDA graphs on a CUDA device (and Triton); True on anywhere (compiled at the first forward,
    not at load); a bad value is refused before the weights are read; no direct forward, no fusing."""
    cuda = torch.device("cuda")
    assert not fused_default(torch.device("cpu"), "replay") and not fused_default(cuda, None)
    assert fused_default(cuda, "cuda") == (importlib.util.find_spec("triton") is not None)
    plain = load_model(causal_dir, fused=False)
    assert plain.native is not None and not plain.native.fused
    if device.type == "cpu":
        assert not load_model(causal_dir, dtype="bfloat16", exact=8, graphs="replay").native.fused
    assert load_model(causal_dir, fused=True).native.fused
    with pytest.raises(ParameterError, match="fused='yes'.*True, False or None"):
        fastdecode.load(causal_dir, fused="yes")
    with pytest.raises(ParameterError, match="direct forward.*leave fused=None or False"):
        CausalLM(plain.model, plain.tokenizer, "x", native=False, fused=True)


@COMPILES
def test_a_compiler_that_fails_leaves_the_model_unfused_with_a_warning(causal_dir, load_model):
    model = load_model(causal_dir)
    ids = model.tokenizer(PROMPTS[0], return_tensors="pt").input_ids.to(model.device)
    positions = torch.arange(ids.shape[1], device=model.device)[None]
    want = model.forward(ids, positions)

    def broken(graph, inputs):
        raise RuntimeError("no compiler here")

    model.native.fuse(backend=broken)
    with pytest.warns(FastDecodeWarning, match="could not be built here.*no compiler here.*runs unfused"):
        got = model.forward(ids, positions)
    assert not model.native.fused
    assert torch.equal(got, want)
