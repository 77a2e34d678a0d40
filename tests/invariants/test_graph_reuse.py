"""Storage and CUDA graphs that outlive a generation (cache/pool.py): a graphed model's next cache of the same rows and
capacity runs on a dead cache's storage and replays its graphs from the first forward, with the tokens of a fresh
model; two live caches never share storage. On the CPU the graphs run in "replay" mode; with
FASTDECODE_TEST_DEVICE=cuda they are captured (and a reused graph reads the kept tensors' addresses)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import fastdecode
from fastdecode.ar.driver import ARSession
from fastdecode.ar.greedy import GreedyConfig
from fastdecode.cache import kv
from fastdecode.cache.pool import Storage, StoragePool, free_retired_graphs

SHORT, LONG = "Sort this", "0123456789 ABC abc the lazy dog jumps over the quick brown fox"


@pytest.fixture(scope="module")
def mode(device) -> str:
    return "cuda" if device.type == "cuda" else "replay"


@pytest.fixture()
def fresh(causal_dir, load_model, mode):
    """A new bfloat16 exact-mode model (width 8) with graphs: its pool starts empty."""
    def make():
        return load_model(causal_dir, dtype="bfloat16", exact=8, graphs=mode, fused=False)
    return make


class Spy:
    """Wraps `model.new_cache`: checks that every new cache's kept storage belongs to no live cache, and records
    whether it came from the pool (its storage allocated already) and its first key tensor's address."""

    def __init__(self, model) -> None:
        self.live: list[weakref.ref] = []
        self.reused: list[bool] = []
        self.stale: list[bool] = []
        self.addresses: list[int] = []
        self.rows: list[int] = []  # the kept storage's rows, against the rows asked
        make = model.new_cache

        def new_cache(*args, **kwargs):
            cache = make(*args, **kwargs)
            keys = cache.layers[0].keys
            if keys is not None:
                mine = {t.data_ptr() for layer in cache.layers for t in (layer.keys, layer.values)}
                for ref in self.live:
                    other = ref()
                    if other is not None and other.layers[0].keys is not None:
                        assert not mine & {t.data_ptr() for layer in other.layers for t in (layer.keys, layer.values)}
                self.addresses.append(keys.data_ptr())
                self.rows.append(keys.shape[0] - cache.batch)
                self.stale.append(bool(keys.abs().sum() > 0))  # a dead cache's keys are still there
            self.reused.append(keys is not None)
            self.live.append(weakref.ref(cache))
            return cache
        model.new_cache = new_cache


def run(model, prompt, method="ar.greedy", **kw):
    """Tokens of one generation, and what the graphs did during it."""
    before = dict(model.graphs.stats)
    out = fastdecode.generate(model, prompt, method, max_new_tokens=24, **kw)
    tokens = [r.token_ids for r in out] if isinstance(out, list) else out.token_ids
    return tokens, {k: model.graphs.stats[k] - before[k] for k in before}


def test_the_next_generation_replays_from_its_first_forward(fresh):
    model = fresh()
    spy = Spy(model)
    first, did = run(model, SHORT)
    assert did["eager"] == 1 and did["captures"] == 1  # a new model: the storage is allocated, then captured
    again, did = run(model, SHORT)
    assert again == first
    assert did == {"captures": 0, "eager": 0, "replays": did["replays"]} and did["replays"] > 1
    assert spy.reused == [False, True]


def test_stale_keys_past_the_new_lengths_change_no_token(fresh):
    """A long generation leaves its keys in the storage; a shorter one on that storage writes the tokens of a fresh
    model (the stale columns are masked, and a masked column adds exact zeros)."""
    model = fresh()
    spy = Spy(model)
    run(model, LONG)
    for prompt, method in ((SHORT, "ar.greedy"), ("def add(a, b):", "spec.suffix"), ("the quick", "spec.pld")):
        tokens, did = run(model, prompt, method)
        assert did["captures"] == did["eager"] == 0
        assert spy.reused[-1] and spy.stale[-1]
        assert tokens == run(fresh(), prompt, method)[0]
    assert len(set(spy.addresses)) == 1  # one storage served every generation after the first


def test_a_draft_of_the_same_model_gets_storage_of_its_own(fresh):
    """spec.draft_model with the model as its own draft: target and draft caches live at once (the Spy checks that
    no two share storage), and a second run replays from the start with the same tokens."""
    model = fresh()
    spy = Spy(model)
    first, _ = run(model, SHORT, "spec.draft_model", draft=model, num_draft_tokens=3)
    again, did = run(model, SHORT, "spec.draft_model", draft=model, num_draft_tokens=3)
    assert again == first == run(fresh(), SHORT)[0]
    assert did["eager"] == 0 and any(spy.reused)


def test_two_live_caches_never_share_and_rows_must_match(fresh):
    model = fresh()
    run(model, SHORT)
    gc.collect()
    capacity = model.exact.capacity(1) - model.exact.width  # (new_cache adds the width and rounds to the block)
    one = model.new_cache(batch=1, capacity=capacity)
    assert one.layers[0].keys is not None  # the kept storage
    two = model.new_cache(batch=1, capacity=capacity)
    assert two.layers[0].keys is None  # the one kept storage is taken: the second live cache allocates its own
    pair = model.new_cache(batch=2, capacity=capacity)
    assert pair.layers[0].keys is None  # a one-row storage never serves two rows
    keys = one.layers[0].keys.data_ptr()
    del one
    again = model.new_cache(batch=1, capacity=capacity)  # the first cache died: its storage is free again
    assert again.layers[0].keys.data_ptr() == keys
    assert not again.lengths[0] and not bool(again.valid.any())


def test_a_batch_that_shrinks_keeps_both_row_counts(fresh):
    """A batch of 2 whose last row finishes first resizes to 1 row (new storage; the two-row one goes to the pool);
    the next batch of 2 runs on both kept storages, and a batch of 1 after it gets the tokens of a fresh model."""
    model = fresh()
    spy = Spy(model)
    prompts = [SHORT, LONG]
    first, did = run(model, prompts)
    again, did = run(model, prompts)
    assert again == first
    assert did["captures"] == did["eager"] == 0
    alone, did = run(model, [LONG])  # on the one-row storage of the resize (its graphs, if it ran a forward)
    assert alone == run(fresh(), [LONG])[0] and did["eager"] == 0
    assert spy.reused[-1] and not any(spy.rows)  # every kept storage had the rows its cache asked for


def test_a_session_holding_a_cache_while_another_generation_runs(fresh):
    """A running session (continuous batching's driver) holds the kept storage; a generation in the middle of it gets
    storage of its own (the Spy checks), and both write the tokens of fresh models."""
    model = fresh()
    run(model, SHORT)
    spy = Spy(model)
    ids = model.tokenizer(SHORT, return_tensors="pt").input_ids.to(model.device)
    session = ARSession(model, GreedyConfig(max_new_tokens=24), slots=1)
    slot = session.join(ids)[0]
    tokens: list[int] = []
    other = None
    while picked := session.step():
        tokens += [token for s, _, token, _ in picked if s == slot]
        if other is None:
            other, _ = run(model, LONG)
    assert spy.reused[0] and not spy.reused[1]  # the session took the kept storage, the generation made its own
    assert tokens == run(fresh(), SHORT)[0]
    assert other == run(fresh(), LONG)[0]


def test_a_cache_that_moves_keeps_no_stale_graphs(fresh):
    model = fresh()
    run(model, SHORT)
    gc.collect()
    cache = model.new_cache()
    assert cache.graphs  # the kept graphs
    pool = model.graphs.pool
    assert len(pool) == 0
    cache.ready_for(cache.capacity + 1)  # grows: new storage
    assert not cache.graphs
    del cache
    assert len(pool) == 0  # nothing captured over the new storage: nothing kept


def test_release_hands_the_storage_back_and_the_cache_goes_on(fresh):
    model = fresh()
    run(model, SHORT)
    gc.collect()
    cache = model.new_cache()
    keys = cache.layers[0].keys.data_ptr()
    cache.release()
    assert cache.layers[0].keys is None and not cache.graphs and len(model.graphs.pool) == 1
    ids = model.tokenizer(SHORT, return_tensors="pt").input_ids.to(model.device)
    positions = torch.arange(ids.shape[1], device=model.device)[None]
    logits = model.forward(ids, positions, cache)  # new storage of its own
    assert cache.layers[0].keys.data_ptr() != keys and logits.shape[1] == ids.shape[1]
    assert model.new_cache().layers[0].keys.data_ptr() == keys


def test_the_pool_keeps_a_few_bundles_the_newest():
    free_retired_graphs()
    pool = StoragePool(limit=2)
    key = (1, 64, ("full_attention",), True, "cpu")

    def bundle(rows: int) -> Storage:
        storage = Storage(graphs={(rows, 8, 64): object()})
        storage.fill((rows, *key[1:]), [torch.zeros(rows, 1, 64, 2)], [torch.zeros(rows, 1, 64, 2)],
                     torch.zeros(rows, 64, dtype=torch.long), torch.zeros(rows, 64, dtype=torch.bool))
        return storage

    first, second, third = bundle(1), bundle(2), bundle(1)
    for storage in (first, second, third):
        pool.give(storage)
    assert len(pool) == 2 and not first.graphs and first.key is None  # the oldest left, its graph retired
    assert len(kv._RETIRED) == 1
    pool.give(third)  # (a bundle is kept once)
    assert len(pool) == 2 and third.graphs
    assert pool.take(key) is third and pool.take(key) is None and len(pool) == 1
    assert pool.take((2, *key[1:])) is second and not len(pool)
    pool.give(Storage(graphs={(1, 8, 64): object()}))  # never filled: retired, not kept
    assert not len(pool) and len(kv._RETIRED) == 2
    pool.give(bundle(1))
    pool.clear()
    assert not len(pool) and free_retired_graphs() == 3
    with pytest.raises(ValueError, match="limit"):
        StoragePool(limit=-1)


def test_a_reused_bundle_captures_anew_when_a_setting_changed(fresh, device):
    """A graph records the kernels of its settings: after `fuse` or the grouped attention is switched, the next
    generation on a kept bundle captures again instead of replaying the other setting's graph (and switching back
    replays the first one)."""
    from fastdecode import attention

    model = fresh()
    backend = "eager" if device.type == "cpu" else "inductor"
    stats = model.graphs.stats

    def run() -> tuple[list[int], int]:
        before = stats["captures"]
        out = fastdecode.generate(model, SHORT, "ar.greedy", max_new_tokens=12).token_ids
        gc.collect()
        return out, stats["captures"] - before

    plain, first = run()
    assert first == 1 and run() == (plain, 0)  # reused: no capture
    model.native.fuse(backend=backend)
    try:
        fused, captured = run()
        assert captured == 1
        if backend == "eager":
            assert fused == plain  # traced, not compiled: the same operations
    finally:
        model.native.fuse(False)
    assert run() == (plain, 0)  # the unfused graph again
    attention.use_grouped_attention(True)
    try:
        assert run()[1] == 1
    finally:
        attention.use_grouped_attention(False)
