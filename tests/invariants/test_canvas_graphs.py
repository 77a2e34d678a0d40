"""CUDA graphs of the diffusion forward (models/canvas_graphs.py): every dlm method writes the eager tokens, each shape
runs eagerly once, is captured the second time and replayed after, outputs never alias a graph's buffers.

On the CPU `graphs="replay"` runs the graphs' static-buffer path without capturing; under
`FASTDECODE_TEST_DEVICE=cuda` the `graphs=True` tests capture real graphs.
"""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.cache.pool import _RETIRED, free_retired_graphs
from fastdecode.errors import FastDecodeWarning, ParameterError
from fastdecode.models.canvas_graphs import CanvasGraphs

PROMPTS = ["the quick brown fox", "def add(a, b):", "0123456789 ABC abc the lazy dog jumps"]
GEN = 16
METHODS = [m.name for m in fastdecode.methods("diffusion")]
KW = dict(max_new_tokens=GEN, block_length=8)


def kw(name: str, **extra) -> dict:
    params = {p for p, _ in fastdecode.get_method(name).params()}
    return {k: v for k, v in {**KW, **extra}.items() if k in params}


def sharpen(model):
    with torch.no_grad():
        model.model.lm_head.weight.mul_(50.0)  # confident predictions: the adaptive rules commit several per step
    return model


@pytest.fixture(scope="module")
def eager(diffusion_dir):
    return sharpen(fastdecode.load(diffusion_dir, graphs=False))


@pytest.fixture(scope="module", params=["replay", "cuda"])
def graphed(request, diffusion_dir, eager):
    if request.param == "cuda" and eager.device.type != "cuda":
        pytest.skip("capturing CUDA graphs needs a CUDA device (FASTDECODE_TEST_DEVICE=cuda)")
    return sharpen(fastdecode.load(diffusion_dir, graphs=request.param))


@pytest.mark.parametrize("name", METHODS)
def test_every_method_writes_the_eager_tokens_under_graphs(eager, graphed, name):
    before = dict(graphed.graphs.stats)
    for prompt in PROMPTS:
        want = fastdecode.generate(eager, prompt, name, **kw(name))
        got = fastdecode.generate(graphed, prompt, name, **kw(name))
        assert got.token_ids == want.token_ids, (name, prompt)
        assert got.stats.forwards == want.stats.forwards
    after = graphed.graphs.stats
    assert after["replays"] > before["replays"], f"{name}: no forward was replayed"


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_cached_methods_graph_their_refreshes_and_partial_forwards_and_write_the_eager_tokens(eager, graphed, cache):
    """A cache's full refresh returns keys and values from the graph, and its partial forwards (some columns against
    the others' keys and values, which are static inputs) replay too."""
    name = "dlm.threshold"
    graphed.graphs.clear()
    for prompt in PROMPTS:
        want = fastdecode.generate(eager, prompt, name, **kw(name, cache=cache))
        got = fastdecode.generate(graphed, prompt, name, **kw(name, cache=cache))
        assert got.token_ids == want.token_ids, (cache, prompt)
    assert {key[0] for key in graphed.graphs.entries} == {"refresh", "columns"}
    assert graphed.graphs.stats["replays"] > 0


def canvas(model, seed: int, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randint(4, model.vocab_size, (2, length))  # drawn on the CPU: the same canvases on every device
    attention = torch.ones(2, length, dtype=torch.long)
    attention[1, :3] = 0
    return x.to(model.device), attention.to(model.device)


def test_a_shape_runs_eagerly_then_is_captured_then_replayed(diffusion_dir, eager):
    model = sharpen(fastdecode.load(diffusion_dir, graphs="replay"))
    at = torch.tensor([[4, 5, 6], [7, 8, 9]], device=model.device)
    outputs = []
    for seed in range(4):  # the same shape, different canvases: each forward sees its own inputs
        x, attention = canvas(model, seed)
        got = model.forward(x, attention, at=at)
        close(got, eager.forward(x, attention, at=at))
        outputs.append(got)
    assert model.graphs.stats == {"eager": 1, "captures": 1, "replays": 2}
    assert not torch.equal(outputs[2], outputs[3])  # a replay's output is a copy, not the graph's buffer
    assert all(o.data_ptr() != e.outputs[0].data_ptr() for o in outputs for e in model.graphs.entries.values())
    x, attention = canvas(model, 0, length=10)  # 10 and 12 columns: one bucket of 16, the same graph
    close(model.forward(x, attention, at=at[:, :2]), eager.forward(x, attention, at=at[:, :2]))
    assert model.graphs.stats == {"eager": 1, "captures": 1, "replays": 3}
    x, attention = canvas(model, 0, length=20)  # another bucket: eager again
    model.forward(x, attention, at=at)
    full = model.forward(x, attention)  # no `at`: another signature too
    assert full.shape[1] == 20
    close(full, eager.forward(x, attention))
    assert model.graphs.stats == {"eager": 3, "captures": 1, "replays": 3}


def test_without_buckets_each_length_has_its_own_graph_and_the_eager_bits(diffusion_dir):
    """The padding to a bucket moves the last bits (a longer canvas can take another summation order); without it
    a replay computes exactly the eager forward."""
    model = fastdecode.load(diffusion_dir, graphs="replay")
    plain = fastdecode.load(diffusion_dir, graphs=False)
    model.graphs.bucket = model.graphs.bucket_columns = 1
    at = torch.tensor([[4, 5, 6], [7, 8, 9]], device=model.device)
    for length in (10, 12, 10, 12, 12):
        x, attention = canvas(model, length, length)
        assert torch.equal(model.forward(x, attention, at=at), plain.forward(x, attention, at=at))
    assert model.graphs.stats == {"eager": 2, "captures": 2, "replays": 1}


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Logits of a padded canvas against the unpadded forward's: equal up to float32 rounding."""
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_refresh_returns_its_own_keys_and_values(diffusion_dir):
    model = fastdecode.load(diffusion_dir, graphs="replay")
    plain = fastdecode.load(diffusion_dir, graphs=False)
    runs = []
    for seed in range(3):
        x, attention = canvas(model, seed)
        logits, kv = model.forward_columns(x, attention, None, None)
        want_logits, want_kv = plain.forward_columns(x, attention, None, None)
        close(logits, want_logits)
        for (k, v), (k2, v2) in zip(kv, want_kv, strict=True):
            close(k, k2)
            close(v, v2)
        runs.append(kv)
    assert model.graphs.stats == {"eager": 1, "captures": 1, "replays": 1}
    assert not torch.equal(runs[1][0][0], runs[2][0][0])  # the replay did not overwrite what the capture returned


def test_the_least_recently_used_graphs_go_first(diffusion_dir):
    model = fastdecode.load(diffusion_dir, graphs="replay")
    model.graphs.limit = 2
    for length in (12, 20, 40):
        x, attention = canvas(model, 0, length)
        for _ in range(2):
            model.forward(x, attention)
    assert len(model.graphs.entries) == 2 and len(_RETIRED) == 1
    assert [k[1][1] for k in model.graphs.entries] == [(2, 32), (2, 48)]  # the (padded) canvas shapes kept
    x, attention = canvas(model, 0, 60)
    model.forward(x, attention)  # every run first destroys the retired graphs
    assert not _RETIRED
    free_retired_graphs()


def test_a_forward_that_cannot_be_captured_runs_eagerly_with_a_warning():
    """A body that reads a tensor on the host cannot be captured (and on a machine without CUDA nothing can): the
    graphs turn off, once, and every forward gives the eager result."""
    def body(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * float(x.sum().item()),)

    graphs = CanvasGraphs("cuda")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(6.0, device=device)
    assert torch.equal(graphs.run("f", body, {"x": x})[0], body(x)[0])
    with pytest.warns(FastDecodeWarning, match="could not be captured"):
        assert torch.equal(graphs.run("f", body, {"x": x})[0], body(x)[0])
    assert graphs.failed and not graphs.entries
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second try
        assert torch.equal(graphs.run("f", body, {"x": x + 1})[0], body(x + 1)[0])
    assert graphs.stats == {"eager": 3, "captures": 0, "replays": 0}


def test_load_sets_the_diffusion_graphs(diffusion_dir):
    assert fastdecode.load(diffusion_dir, device="cpu").graphs is None  # off on the CPU by default
    assert fastdecode.load(diffusion_dir, device="cpu", graphs="replay").graphs.mode == "replay"
    with pytest.raises(ParameterError, match="CUDA device"):
        fastdecode.load(diffusion_dir, device="cpu", graphs=True)
    with pytest.raises(ParameterError, match="graphs='sometimes'"):
        fastdecode.load(diffusion_dir, device="cpu", graphs="sometimes")


class Foreign(torch.nn.Module):
    """A diffusion model without the zoo's partial-forward protocol (a checkpoint's own code: LLaDA, Dream)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask=None, **_):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


def test_a_checkpoints_own_model_is_graphed_at_its_own_length(diffusion):
    """Its mask may hide padded queries too, so its canvas is never padded: one graph per length, the eager bits."""
    from fastdecode.models.diffusion import MaskedDiffusionLM

    model = MaskedDiffusionLM(Foreign(diffusion.model), mask_token_id=3, shifted=True, graphs="replay")
    plain = MaskedDiffusionLM(Foreign(diffusion.model), mask_token_id=3, shifted=True)
    assert not model.supports_cache
    at = torch.tensor([[4, 5, 6], [7, 8, 9]], device=diffusion.device)
    for seed in range(3):
        x, attention = canvas(diffusion, seed)
        assert torch.equal(model.forward(x, attention, at=at), plain.forward(x, attention, at=at))
    assert [key[1][1] for key in model.graphs.entries] == [(2, 12)]  # the canvas as it came
    assert model.graphs.stats == {"eager": 1, "captures": 1, "replays": 1}
