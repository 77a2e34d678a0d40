"""CUDA graphs of exact mode's forwards (models/graphs.py): the captured path gives the eager path's tokens, captures
once per cache and batch, and captures again when the cache's storage moves. On the CPU the graphs run in "replay"
mode (the same static buffers, without capturing); with FASTDECODE_TEST_DEVICE=cuda they are captured."""

from __future__ import annotations

import gc

import pytest
import torch

import fastdecode
from fastdecode.ar.driver import ARSession
from fastdecode.ar.greedy import GreedyConfig
from fastdecode.cache import kv
from fastdecode.cache.kv import free_retired_graphs
from fastdecode.errors import ParameterError
from fastdecode.models.graphs import graphs_mode

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
METHODS = [("ar.greedy", {}), ("spec.pld", {}), ("spec.suffix", {}), ("spec.suffix", {"tree": True}),
           ("spec.draft_model", {"num_draft_tokens": 5})]


@pytest.fixture(scope="module")
def mode(device) -> str:
    return "cuda" if device.type == "cuda" else "replay"


@pytest.fixture(scope="module")
def pair(causal_dir, load_model, mode):
    """The same weights in bfloat16 exact mode (width 8), eager and graphed."""
    # (unfused both: on CUDA the graphed model's default would fuse its kernels, which round otherwise)
    eager = load_model(causal_dir, dtype="bfloat16", exact=8, graphs=False, fused=False)
    graphed = load_model(causal_dir, dtype="bfloat16", exact=8, graphs=mode, fused=False)
    return eager, graphed


@pytest.mark.parametrize(("method", "params"), METHODS)
def test_graphed_forwards_give_the_eager_tokens(pair, method, params):
    eager, graphed = pair
    before = dict(graphed.graphs.stats)
    for model in (eager, graphed):
        kw = {"draft": model} if method == "spec.draft_model" else {}
        out = fastdecode.generate(model, PROMPTS, method, max_new_tokens=40, **params, **kw)
        if model is eager:
            want = [r.token_ids for r in out]
        else:
            assert [r.token_ids for r in out] == want
    # the graphs ran: captured (by this method's caches, or by an earlier method's whose storage and graphs the pool
    # kept: cache/pool.py), then replayed
    stats = graphed.graphs.stats
    assert stats["captures"] >= 1
    assert stats["replays"] - before["replays"] > stats["captures"] - before["captures"]
    assert eager.graphs is None


def test_a_forward_that_asks_for_layer_outputs_runs_captured_with_the_eager_outputs(pair):
    """EAGLE-3 and DFlash read the target's layers from its verification forward: such a forward is graphed too (the
    layers among the graph's outputs, a graph of its own per set of layers), with the eager forward's logits and
    layers; and spec.eagle3 writes the eager tokens."""
    eager, graphed = pair
    ids = graphed.tokenizer(PROMPTS[3], return_tensors="pt").input_ids.to(graphed.device)
    outs = []
    for model in (eager, graphed):
        cache = model.new_cache(capacity=64)
        n = ids.shape[1]
        model.forward(ids, torch.arange(n, device=ids.device)[None], cache)  # (the storage: allocated eagerly)
        got = []
        before = dict(graphed.graphs.stats)
        for i in range(3):  # a block of 5, then a block of 3, then one token: each asking for three layers
            T = (5, 3, 1)[i]
            block = ids[:, :T]
            pos = torch.arange(cache.length, cache.length + T, device=ids.device)[None]
            got.append(model.forward(block, pos, cache, hidden=(0, 1, 1)))
        outs.append(got)
    stats = graphed.graphs.stats  # (the three forwards with layers: a capture, then two replays of it)
    assert (stats["captures"] - before["captures"], stats["replays"] - before["replays"]) == (1, 2)
    for want, have in zip(*outs, strict=True):
        assert torch.equal(want.logits, have.logits) and len(have.layers) == 3
        assert all(torch.equal(a, b) for a, b in zip(want.layers, have.layers, strict=True))
    for model in (eager, graphed):
        out = fastdecode.generate(model, PROMPTS, "spec.eagle3", max_new_tokens=24)
        if model is eager:
            want_tokens = [r.token_ids for r in out]
    assert [r.token_ids for r in out] == want_tokens


def test_a_cache_captures_once_and_again_when_its_storage_moves(pair):
    _, graphed = pair
    stats = graphed.graphs.stats
    ids = graphed.tokenizer(PROMPTS[0], return_tensors="pt").input_ids.to(graphed.device)
    cfg = GreedyConfig(max_new_tokens=30)
    graphed.graphs.pool.clear()  # (as a fresh model: no storage of earlier tests' caches to reuse)
    session = ARSession(graphed, cfg, slots=2)
    start = dict(stats)
    session.join(ids)  # a one-chunk prefill: the storage is allocated eagerly
    for _ in range(5):
        session.step()
    assert stats["captures"] - start["captures"] == 1 and stats["replays"] - start["replays"] == 4
    version = session.cache.storage_version
    slot = session.join(ids)[0]  # a second row: the cache grows to two rows (new storage): the next forward captures
    assert session.cache.storage_version > version
    mid = dict(stats)
    late: list[int] = []
    while picked := session.step():
        late += [token for s, _, token, _ in picked if s == slot]
    assert stats["captures"] - mid["captures"] == 1  # one capture for the two rows, replayed to the end
    # the row that joined late writes the tokens of a run of its own
    assert late == fastdecode.generate(graphed, PROMPTS[0], "ar.greedy", max_new_tokens=30).token_ids


def test_graphs_need_exact_mode_and_say_how():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert graphs_mode(None, cuda, object()) == "cuda"
    assert graphs_mode(None, cuda, None) is None  # float32 on CUDA: exact mode off, so no graphs
    assert graphs_mode(None, cpu, object()) is None
    assert graphs_mode(False, cuda, object()) is None
    assert graphs_mode("replay", cpu, object()) == "replay"
    with pytest.raises(ParameterError, match="CUDA device"):
        graphs_mode(True, cpu, object())
    with pytest.raises(ParameterError, match="exact=True"):
        graphs_mode(True, cuda, None)
    with pytest.raises(ParameterError, match="exact=True"):
        graphs_mode("replay", cpu, None)
    with pytest.raises(ParameterError, match="graphs="):
        graphs_mode("sometimes", cpu, object())


def test_a_dead_cache_retires_its_graphs_until_the_next_graphed_forward(pair):
    """A cache can die while another stream captures (torch.compile's graphs): the graphs it does not hand to the pool
    (here the pool keeps none) are only retired then, and destroyed at the next graphed forward."""
    _, graphed = pair
    gc.collect()  # caches of earlier tests
    free_retired_graphs()
    pool = graphed.graphs.pool
    pool.clear()
    limit, pool.limit = pool.limit, 0
    try:
        fastdecode.generate(graphed, PROMPTS[0], "ar.greedy", max_new_tokens=12)
        gc.collect()
        first = len(kv._RETIRED)
        assert first >= 1  # the generation's cache died: its graph waits
        fastdecode.generate(graphed, PROMPTS[1], "ar.greedy", max_new_tokens=12)
        gc.collect()
        assert len(kv._RETIRED) == first  # the first generation's graphs were freed; the second's wait
        assert free_retired_graphs() == first and not kv._RETIRED
    finally:
        pool.limit = limit
