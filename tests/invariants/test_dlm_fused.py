"""The zoo diffusion architecture's fused setting (`MDLMForMaskedDiffusion.fuse`, models/mdlm.py): the norms, rotary
products and gated MLP through `torch.compile`. On the CPU the functions are traced whole (`fullgraph=True`) with the
`eager` backend, which runs the traced operations as they are: the logits must be the plain forward's, bit for bit.
With FASTDECODE_TEST_DEVICE=cuda they are compiled to fused kernels (inductor) and the lossless diffusion method
(dlm.freedave) must equal dlm.baseline run with the same setting, under the canvas graphs as `load` gives them."""

from __future__ import annotations

import warnings

import device_sim
import pytest
import torch

import fastdecode
from fastdecode.errors import FastDecodeWarning, ParameterError
from fastdecode.models.mdlm import LayerKV

COMPILES = device_sim.compiling_tests()

PROMPTS = ["the quick brown fox", "def add(a, b):", "0123456789 ABC abc the lazy dog jumps"]
KW = dict(max_new_tokens=16, block_length=8)


@pytest.fixture(scope="module")
def backend(device) -> str:
    return "inductor" if device.type == "cuda" else "eager"


def recording(traced: list):
    def eager(graph, inputs):  # the "eager" backend, recording what dynamo traced
        traced.append(graph)
        return graph.forward
    return eager


def canvas(model, seed: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randint(4, model.vocab_size, (2, length))  # drawn on the CPU: the same canvases on every device
    attention = torch.ones(2, length, dtype=torch.long)
    attention[1, :3] = 0
    return x.to(model.device), attention.to(model.device)


def forwards(module, x, attention) -> list[torch.Tensor]:
    """A whole-canvas forward with its cache, then a partial forward of two columns against that cache."""
    full = module(input_ids=x, attention_mask=attention, use_cache=True)
    cache = [LayerKV(layer.k, layer.v) for layer in full.cache]
    columns = torch.tensor([[1, 4], [5, 6]], device=x.device)
    part = module(input_ids=x.gather(1, columns), attention_mask=attention, cache=cache, query_index=columns,
                  use_cache=True)
    return [full.logits, part.logits, *(t for layer in part.cache for t in (layer.k, layer.v))]


@COMPILES
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_traced_fused_forward_gives_the_plain_logits_at_any_canvas_length(diffusion_dir, backend, dtype):
    if backend != "eager":
        pytest.skip("inductor's kernels round differently: the device test below checks identity under the setting")
    model = fastdecode.load(diffusion_dir, dtype=dtype, graphs=False)
    module = model.model
    assert not module.fused and not model.fused
    canvases = [canvas(model, seed, length) for seed, length in enumerate((12, 20, 29))]
    plain = [forwards(module, x, attention) for x, attention in canvases]
    traced: list = []
    module.fuse(backend=recording(traced))
    try:
        assert model.fused
        fused = [forwards(module, x, attention) for x, attention in canvases]
    finally:
        module.fuse(False)
    assert not model.fused
    for want, got in zip(plain, fused, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), dtype
    # each function traced whole and once, for every canvas length and the partial forwards' columns (dynamic
    # shapes): the norm, the residual add with the next norm, the rotary products, the gated MLP
    assert len(traced) == 4


@COMPILES
def test_a_fused_forward_that_cannot_be_compiled_runs_unfused_with_one_warning(diffusion_dir):
    model = fastdecode.load(diffusion_dir, graphs=False)
    x, attention = canvas(model, 0, 12)
    plain = forwards(model.model, x, attention)

    def failing(graph, inputs):
        raise RuntimeError("no compiler here")

    model.model.fuse(backend=failing)
    with pytest.warns(FastDecodeWarning, match="could not be built here .*no compiler here") as caught:
        got = forwards(model.model, x, attention)
    assert len([w for w in caught if issubclass(w.category, FastDecodeWarning)]) == 1
    assert not model.fused  # unfused from then on
    assert all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        forwards(model.model, x, attention)  # no second warning


def test_freedave_equals_the_baseline_under_the_fused_setting(diffusion_dir, backend):
    """bfloat16, the canvas graphs as the device gives them (captured on CUDA, replayed on the CPU)."""
    model = fastdecode.load(diffusion_dir, dtype="bfloat16", graphs="cuda" if backend == "inductor" else "replay")
    with torch.no_grad():
        model.model.lm_head.weight.mul_(50.0)  # confident predictions: the adaptive rules commit several per step
    model.model.fuse(backend=backend)
    try:
        for prompt in PROMPTS:
            base = fastdecode.generate(model, prompt, "dlm.baseline", **KW)
            got = fastdecode.generate(model, prompt, "dlm.freedave", **KW)
            assert got.token_ids == base.token_ids, prompt
        assert model.fused  # no fallback happened
        assert model.graphs is not None and model.graphs.stats["replays"] > 0
    finally:
        model.model.fuse(False)


def test_load_fuses_by_default_only_with_cuda_graphs_and_refuses_a_model_without_the_architecture(diffusion_dir,
                                                                                                    diffusion):
    from fastdecode.models.diffusion import MaskedDiffusionLM

    assert not fastdecode.load(diffusion_dir, device="cpu").fused  # no CUDA graphs: off
    fused = fastdecode.load(diffusion_dir, device="cpu", fused=True)  # asked: on anywhere
    assert fused.fused
    fused.model.fuse(False)

    class Foreign(torch.nn.Module):  # a checkpoint's own code (LLaDA, Dream): nothing to fuse
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.config = inner.config

    with pytest.raises(ParameterError, match="fused=True compiles the zoo diffusion architecture"):
        MaskedDiffusionLM(Foreign(diffusion.model), mask_token_id=3, shifted=True, fused=True)
    assert not MaskedDiffusionLM(Foreign(diffusion.model), mask_token_id=3, shifted=True, fused=None).fused
    with pytest.raises(ParameterError, match="fused='yes'"):
        fastdecode.load(diffusion_dir, device="cpu", fused="yes")
