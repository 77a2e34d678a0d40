"""EAGLE-3's drafting in one graph a step (`Eagle3Drafter._in_graph`, `HeadGraph`; docs/gpu.md "EAGLE-3's drafting
in one graph"): the chain's head forwards or the tree's levels captured together over the head's block cache. On
the simulated device the forward-by-forward path runs on the same block cache, so the graph gives the same drafts:
the same tokens, forwards, proposals and acceptances, greedy and seeded; on the CPU it equals `ar.greedy` (lossless).
The graph's outputs are cloned, a cache that grows is captured again, a failed capture warns once, and the host does
far less. A block cache holds a whole generation's entries, and a dead drafter's cache with its graphs serves the
next generation of the same room (the head's pool), which then replays from its first step and drafts what a new cache
would. Captured for real under FASTDECODE_TEST_DEVICE=cuda."""

from __future__ import annotations

import warnings

import pytest
import torch
from device_sim import emulated_capture, reads_per_forward, simulated

import fastdecode
from fastdecode.cache import pool as pool_module
from fastdecode.cache.pool import StoragePool
from fastdecode.errors import FastDecodeWarning, ParameterError
from fastdecode.heads.eagle3 import DraftCache
from fastdecode.models.host_ops import HostOps
from fastdecode.speculative import step_graph
from fastdecode.speculative.drafters import eagle3 as eagle3_module
from fastdecode.speculative.drafters.eagle3 import Eagle3Drafter, HeadStorage
from fastdecode.speculative.step_graph import StepGraphs

PROMPTS = ["the quick brown fox", "Sort this", "def add(a, b):"]
SHAPES = [{}, {"num_draft_tokens": 3}, {"tree": True}, {"tree": True, "width": 2, "total_tokens": 8}]


def _clear_pools() -> None:
    for pool in list(eagle3_module._POOLS.values()):
        pool.clear()
    for shared in list(StepGraphs._owned.values()):
        shared.failed = None  # (a failed capture is recorded for the head)


@pytest.fixture(autouse=True)
def no_pooled_caches():
    """Each test starts with no dead drafter's cache to take (a pooled one would skip the captures it counts)."""
    _clear_pools()


@pytest.fixture
def drafted(monkeypatch):
    """The drafters made, and how many of their steps ran in a graph."""
    made: list[Eagle3Drafter] = []
    original = Eagle3Drafter.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(Eagle3Drafter, "__init__", init)
    return made


def _graphed(made) -> int:
    return sum(d.graphs.stats["captures"] + d.graphs.stats["replays"] for d in made)


def _run(model, prompt, graph: bool, new: int = 32, **kw):
    out = fastdecode.generate(model, prompt, "spec.eagle3", max_new_tokens=new, graph=graph, **kw)
    return out.token_ids, out.stats.forwards, out.stats.draft_forwards, out.stats.accepted, out.stats.proposed


@pytest.mark.parametrize("params", SHAPES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_on_a_device_the_graph_drafts_what_the_forwards_draft(sim_model, drafted, params, temperature):
    sampled = {"temperature": temperature, "seed": 4} if temperature else {}
    with simulated():
        for prompt in PROMPTS:
            assert _run(sim_model, prompt, True, **params, **sampled) == \
                _run(sim_model, prompt, False, **params, **sampled)
    assert _graphed(drafted) > 0


def test_on_a_device_one_read_a_step_stays_one(sim_model):
    with simulated():
        for params in ({}, {"tree": True}):
            per, forwards, _ = reads_per_forward(lambda new, params=params: fastdecode.generate(
                sim_model, PROMPTS[1], "spec.eagle3", max_new_tokens=new, graph=True, **params))
            assert forwards > 0 and per["waits"] == 1.0, (params, per)


@pytest.mark.parametrize("params", SHAPES)
def test_greedy_in_one_graph_equals_ar_greedy(causal, drafted, params, monkeypatch):
    monkeypatch.setattr(Eagle3Drafter, "read_each_token", False)  # (the device's chain: no read a token)
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=32)
    out = fastdecode.generate(causal, PROMPTS, "spec.eagle3", max_new_tokens=32, graph=True, early_stop=False,
                              **params)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    assert _graphed(drafted) > 0


def test_the_graph_outputs_are_cloned_and_a_growing_cache_captures_again(sim_model, drafted):
    """Each step's draft keeps its tokens after the next replays (they are copies); a head cache that grows (here
    its room made too small for the generation) retires the graphs over the old storage."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = Eagle3Drafter.propose

    def propose(self, context, k):
        draft = original(self, context, k)
        kept.append((draft.tokens, draft.tokens.clone()))
        return draft
    with simulated(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(Eagle3Drafter, "propose", propose)
        mp.setattr(Eagle3Drafter, "captures", True)  # (replays that overwrite the captured outputs)
        mp.setattr(step_graph, "capture", emulated_capture)
        mp.setattr(Eagle3Drafter, "_room", lambda self, n: 64)
        _run(sim_model, PROMPTS[1], True, new=96)
    drafter = drafted[-1]
    assert drafter.graphs.stats["captures"] >= 2 and drafter.graphs.stats["replays"] > 0
    assert drafter.cache.version >= 2  # (made, then grown at least once)
    assert all(torch.equal(now, then) for now, then in kept if now.numel())


def test_emulated_captures_give_the_same_drafts_and_a_failed_one_warns_once(sim_model, drafted, monkeypatch):
    with simulated():
        want = [_run(sim_model, p, False) for p in PROMPTS]
        monkeypatch.setattr(Eagle3Drafter, "captures", True)

        monkeypatch.setattr(step_graph, "capture", emulated_capture)
        assert [_run(sim_model, p, True) for p in PROMPTS] == want
        assert sum(d.graphs.stats["captures"] for d in drafted) > 0

        def fails(body, arg, device):
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        monkeypatch.setattr(step_graph, "capture", fails)
        drafted.clear()
        _clear_pools()  # (the graphs captured above would replay: none would be captured)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert _run(sim_model, PROMPTS[1], True) == want[1]
            assert _run(sim_model, PROMPTS[2], True) == want[2]  # (a later generation tries no capture again)
    ours = [w for w in seen if issubclass(w.category, FastDecodeWarning)]
    assert len(ours) == 1 and "operation not permitted when stream is capturing)" in str(ours[0].message)
    assert _graphed(drafted) == 0 and all(d.graphs.failed is not None for d in drafted) and len(drafted) == 2


@pytest.mark.parametrize("params", [{}, {"tree": True}])
def test_a_generation_replays_from_its_first_step_on_an_earlier_ones_cache(sim_model, drafted, params, monkeypatch):
    """The second generation takes the first's dead cache and graphs: no capture, and what a new cache gives, after
    a longer text's entries too (stale, masked)."""
    with simulated():
        monkeypatch.setattr(Eagle3Drafter, "captures", True)
        monkeypatch.setattr(step_graph, "capture", emulated_capture)
        first = _run(sim_model, PROMPTS[2], True, new=48, **params)
        cache, captured = drafted[0].cache, drafted[0].graphs.stats["captures"]
        assert captured > 0 and cache.version == 1  # (its room held the whole generation: it never grew)
        drafted.clear()
        again = _run(sim_model, PROMPTS[2], True, new=48, **params)
        assert drafted[0].cache is cache and drafted[0].graphs.stats["captures"] == 0
        assert drafted[0].graphs.stats["replays"] > 0
        drafted.clear()
        other = _run(sim_model, PROMPTS[0], True, new=60, **params)
        drafted.clear()
        after = _run(sim_model, PROMPTS[2], True, new=48, **params)
        assert drafted[0].cache is cache
        drafted.clear()  # (its drafter dies: its cache goes back to the pool, which is then emptied)
        _clear_pools()
        assert after == again == first == _run(sim_model, PROMPTS[2], True, new=48, **params)
        assert drafted[0].cache is not cache
        assert _run(sim_model, PROMPTS[0], True, new=60, **params) == other


def test_the_pool_keeps_a_few_caches_and_retires_the_rest(monkeypatch):
    retired: list[object] = []
    monkeypatch.setattr(pool_module, "retire_graphs", lambda graphs: (retired.extend(graphs.values()),
                                                                       graphs.clear()))
    pool = StoragePool(2)  # (a head's: `_pool`, POOLED of them)
    caches = []
    for size in (64, 128, 64):
        cache = DraftCache(block=64)
        cache.room = size
        cache.append(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
        caches.append(cache)
        eagle3_module._give_back(pool, [HeadStorage(graphs={("chain", size): f"graph {len(caches)}"}, cache=cache)])
    kept = pool._free
    assert retired == ["graph 1"] and [s.cache for s in kept] == caches[1:]
    assert kept[1].cache is not None and kept[1].cache.length == 0  # (given back empty)
    taken = pool.take((64,))
    assert pool.take((256,)) is None and taken is not None
    assert (taken.cache, taken.graphs) == (caches[2], {("chain", 64): "graph 3"})
    host = DraftCache()
    host.append(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    eagle3_module._give_back(pool, [HeadStorage(graphs={"x": "graph 4"}, cache=host)])  # (a host cache: not kept)
    assert retired == ["graph 1", "graph 4"] and len(pool) == 1
    pool.clear()
    assert retired == ["graph 1", "graph 4", "graph 2"] and not len(pool)


def test_a_block_cache_is_made_for_its_generation():
    drafter = Eagle3Drafter.__new__(Eagle3Drafter)
    drafter.cfg, drafter.vocab = eagle3_module.Eagle3SpecConfig(max_new_tokens=100), 320
    assert drafter._room(20) == 128  # (20 + 100 + 5, rounded up to a power of two)
    drafter.cfg = eagle3_module.Eagle3SpecConfig(max_new_tokens=100, tree=True, width=4)
    assert drafter._room(20) == 256  # (20 + 100 + 4 levels of 4 nodes)
    assert drafter._room(0) >= eagle3_module.BLOCK


def test_the_graph_replaces_most_host_operations(sim_model):
    with simulated():
        ops = {}
        for graph in (True, False):
            _run(sim_model, PROMPTS[1], graph, tree=True)
            with HostOps() as count:
                _run(sim_model, PROMPTS[1], graph, tree=True)
            ops[graph] = count.ops
    assert ops[True] < ops[False] * 0.7, ops


def test_graph_true_refuses_the_early_stop(causal):
    with pytest.raises(ParameterError, match="early_stop"):
        fastdecode.generate(causal, "x", "spec.eagle3", tree=True, graph=True, early_stop=True, max_new_tokens=4)


def test_a_block_cache_attends_over_its_whole_storage():
    cache = DraftCache(block=4)
    k, v = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 5)
    keys, values = cache.append(k, v)
    assert cache.capacity == 4 and cache.version == 1 and keys.shape[2] == 3
    allow = torch.ones(2, 3, dtype=torch.bool)
    whole_k, whole_v, padded = cache.attended(keys, values, allow)
    assert whole_k.shape[2] == 4 and padded.tolist() == [[True, True, True, False]] * 2
    assert torch.equal(whole_v[:, :, 3], torch.zeros(1, 2, 5))  # (zeroed: a masked entry adds nothing, never NaN)
    cache.reserve(6)
    assert cache.capacity == 8 and cache.version == 2 and torch.equal(cache.k, k)
    cache.write(torch.tensor([3, 4]), k[:, :, :2], v[:, :, :2])
    assert torch.equal(cache.storage()[0][:, :, 3:5], k[:, :, :2])
    host = DraftCache()
    assert host.attended(k, v, allow)[2] is allow  # (a host cache attends over what it holds)
