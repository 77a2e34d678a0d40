"""Hydra's tree grown in one graph a step (`MedusaDrafter._in_graph`, `HydraGraph`; docs/gpu.md "Hydra's tree in one
graph"): every level's head forward, beam and children, then the kept nodes, captured together. On the simulated
device the graph grows what the levels grow: the same tokens, forwards, proposals and acceptances, greedy and seeded;
on the CPU its greedy output equals `ar.greedy` (lossless). The graphs are kept by the head for its next drafters, a
failed capture warns once, and the host does far less. Captured for real under FASTDECODE_TEST_DEVICE=cuda."""

from __future__ import annotations

import warnings

import pytest
from device_sim import emulated_capture, reads_per_forward, simulated

import fastdecode
from fastdecode.errors import FastDecodeWarning, ParameterError
from fastdecode.heads.io import head_for
from fastdecode.models.host_ops import HostOps
from fastdecode.speculative import step_graph
from fastdecode.speculative.drafters.medusa import MedusaDrafter
from fastdecode.speculative.step_graph import StepGraphs

PROMPTS = ["the quick brown fox", "Sort this", "def add(a, b):"]
SHAPES = [{}, {"width": 2, "total_tokens": 8}, {"depth": 2}, {"total_tokens": 40, "width": 8}]


def _run(model, prompt, graph: bool, new: int = 32, **kw):
    out = fastdecode.generate(model, prompt, "spec.medusa", hydra=True, max_new_tokens=new, graph=graph, **kw)
    return out.token_ids, out.stats.forwards, out.stats.draft_forwards, out.stats.accepted, out.stats.proposed


class _Kept:
    """A Hydra head's step graphs (`StepGraphs.of`): `graphs` kept, `runs` their counts and failure."""

    def __init__(self, runs: StepGraphs) -> None:
        self.graphs, self.runs = runs.kept, runs


def _kept(model):
    return _Kept(StepGraphs.of(head_for(model, "hydra"), "spec.medusa:hydra=true"))


@pytest.fixture(autouse=True)
def no_kept_graphs():
    """Each test starts with no graph kept by a head (a kept one would replay where a test counts captures)."""
    for runs in list(StepGraphs._owned.values()):
        runs.kept.clear()
        runs.failed = None
        runs.stats.update(captures=0, replays=0)


@pytest.mark.parametrize("params", SHAPES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_on_a_device_the_graph_grows_what_the_levels_grow(sim_model, params, temperature):
    sampled = {"temperature": temperature, "seed": 4} if temperature else {}
    with simulated():
        for prompt in PROMPTS:
            assert _run(sim_model, prompt, True, **params, **sampled) == \
                _run(sim_model, prompt, False, **params, **sampled)
        stats = _kept(sim_model).runs.stats
    assert stats["captures"] + stats["replays"] > 0


def test_on_a_device_one_read_a_step_stays_one(sim_model):
    with simulated():
        per, forwards, _ = reads_per_forward(lambda new: fastdecode.generate(
            sim_model, PROMPTS[1], "spec.medusa", hydra=True, max_new_tokens=new, graph=True))
    assert forwards > 0 and per["waits"] == 1.0, per


@pytest.mark.parametrize("params", SHAPES)
def test_greedy_in_one_graph_equals_ar_greedy(causal, params):
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=32)
    out = fastdecode.generate(causal, PROMPTS, "spec.medusa", hydra=True, max_new_tokens=32, graph=True, **params)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    assert _kept(causal).runs.stats["replays"] > 0


def test_captured_graphs_serve_later_generations_and_a_failed_capture_warns_once(sim_model, monkeypatch):
    with simulated():
        want = [_run(sim_model, p, False) for p in PROMPTS]
        monkeypatch.setattr(MedusaDrafter, "captures", True)
        monkeypatch.setattr(step_graph, "capture", emulated_capture)
        assert [_run(sim_model, p, True) for p in PROMPTS] == want
        stats = _kept(sim_model).runs.stats
        captured = stats["captures"]
        assert 0 < captured <= 4 and stats["replays"] > 0  # (a graph a depth: the last steps have fewer levels)
        assert _run(sim_model, PROMPTS[0], True) == want[0] and stats["captures"] == captured  # (replayed only)

        def fails(body, arg, device):
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        monkeypatch.setattr(step_graph, "capture", fails)
        _kept(sim_model).graphs.clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert [_run(sim_model, p, True) for p in PROMPTS] == want
    ours = [w for w in seen if issubclass(w.category, FastDecodeWarning)]
    assert len(ours) == 1 and "operation not permitted when stream is capturing)" in str(ours[0].message)
    assert _kept(sim_model).runs.failed is not None and not _kept(sim_model).graphs


def test_the_graph_replaces_most_host_operations(sim_model):
    with simulated():
        ops = {}
        for graph in (True, False):
            _run(sim_model, PROMPTS[1], graph)
            with HostOps() as count:
                _run(sim_model, PROMPTS[1], graph)
            ops[graph] = count.ops
    assert ops[True] < ops[False] * 0.8, ops


def test_graph_true_is_hydras_only(causal):
    with pytest.raises(ParameterError, match="hydra=true"):
        fastdecode.generate(causal, "x", "spec.medusa", graph=True, max_new_tokens=4)
