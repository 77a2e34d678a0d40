"""KV cache: trim (roll back) then regenerate gives identical tokens and logits."""

from __future__ import annotations

import pytest
import torch


def greedy_steps(model, cache, token, pos, n):
    tokens, logits = [], []
    for _ in range(n):
        out = model.forward(token.view(1, 1), torch.tensor([[pos]], device=model.device), cache)[:, -1]
        token = out.argmax(-1)
        tokens.append(int(token))
        logits.append(out)
        pos += 1
    return tokens, torch.cat(logits)


def test_trim_then_regenerate_is_identical(causal):
    dev = causal.device
    ids = torch.tensor([causal.encode("the quick brown fox")], device=dev)
    L = ids.shape[1]
    cache = causal.new_cache()
    first = causal.forward(ids, torch.arange(L, device=dev)[None], cache)[:, -1].argmax(-1)
    assert cache.length == L and cache.can_rollback()
    tokens_a, logits_a = greedy_steps(causal, cache, first, L, 8)
    assert cache.length == L + 8
    cache.trim(5)
    assert cache.length == L + 3
    tokens_b, logits_b = greedy_steps(causal, cache, torch.tensor(tokens_a[2], device=dev), L + 3, 5)
    assert tokens_b == tokens_a[3:]
    torch.testing.assert_close(logits_b, logits_a[3:], rtol=0, atol=0)


def test_trim_everything_and_crop(causal):
    dev = causal.device
    ids = torch.tensor([causal.encode("abc")], device=dev)
    cache = causal.new_cache()
    causal.forward(ids, torch.arange(ids.shape[1], device=dev)[None], cache)
    cache.crop(1)
    assert cache.length == 1
    cache.trim(1)
    assert cache.length == 0


def test_trim_out_of_range_is_refused(causal):
    dev = causal.device
    cache = causal.new_cache()
    causal.forward(torch.tensor([[5, 6]], device=dev), torch.tensor([[0, 1]], device=dev), cache)
    try:
        cache.trim(3)
    except ValueError as e:
        assert "cannot trim 3" in str(e)
    else:
        raise AssertionError("trim beyond the cache length must fail")


def test_cache_is_allocated_once_and_grows_in_chunks(causal):
    """Storage is preallocated; a run longer than the capacity grows it once per chunk and keeps every entry."""
    dev = causal.device
    ids = torch.tensor([causal.encode("the quick brown fox jumps")], device=dev)
    L = ids.shape[1]
    small = causal.new_cache(capacity=L + 2)
    small.chunk = 4
    big = causal.new_cache(capacity=256)
    first = causal.forward(ids, torch.arange(L, device=dev)[None], small)[:, -1].argmax(-1)
    causal.forward(ids, torch.arange(L, device=dev)[None], big)
    storage = big.layers[0].keys
    tokens_small, logits_small = greedy_steps(causal, small, first, L, 9)
    tokens_big, logits_big = greedy_steps(causal, big, first, L, 9)
    assert big.layers[0].keys is storage  # never reallocated
    assert small.capacity >= L + 9 and small.capacity % 4 == 0
    assert tokens_small == tokens_big
    torch.testing.assert_close(logits_small, logits_big, rtol=0, atol=0)


def test_rows_roll_back_independently(causal):
    """Two rows in one cache, each rolled back by its own count (ragged acceptance), then fed the same next tokens,
    give the logits each would give alone."""
    dev = causal.device
    prompts = [causal.encode("the quick brown"), causal.encode("def add(a, b):")]
    alone = []
    for p in prompts:
        cache = causal.new_cache()
        causal.forward(torch.tensor([p], device=dev), torch.arange(len(p), device=dev)[None], cache)
        after = torch.tensor([[len(p), len(p) + 1]], device=dev)
        alone.append(causal.forward(torch.tensor([[7, 8]], device=dev), after, cache)[0])
    cache = causal.new_cache(batch=2)
    width = max(map(len, prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    causal.forward(ids, pos, cache, mask)
    # a draft of 3 junk tokens per row, then row 0 keeps 1 of them and row 1 none
    starts = torch.tensor(cache.next_positions(), device=dev)[:, None]
    causal.forward(torch.tensor([[9, 10, 11], [12, 13, 14]], device=dev), starts + torch.arange(3, device=dev), cache)
    cache.crop_rows([width + 1, width])
    assert cache.lengths == [width + 1, width]
    # row 0 then has one junk token (9) at its next position; feed row 0 [7, 8] after it, row 1 [7, 8] directly
    positions = torch.tensor(cache.next_positions(), device=dev)[:, None] + torch.arange(2, device=dev)
    out = causal.forward(torch.tensor([[7, 8], [7, 8]], device=dev), positions, cache)
    torch.testing.assert_close(out[1], alone[1], rtol=1e-5, atol=1e-5)
    ref = causal.new_cache()
    p = prompts[0]
    causal.forward(torch.tensor([p + [9]], device=dev), torch.arange(len(p) + 1, device=dev)[None], ref)
    after = torch.tensor([[len(p) + 1, len(p) + 2]], device=dev)
    torch.testing.assert_close(out[0], causal.forward(torch.tensor([[7, 8]], device=dev), after, ref)[0],
                               rtol=1e-5, atol=1e-5)


def test_batched_speculative_rows_share_one_forward_per_step(causal):
    """Every step verifies all rows of the batch in one target forward, whatever each row accepted."""
    import fastdecode

    prompts = ["the quick brown fox", "def add(a, b):", "Sort this"]
    calls = []
    inner = causal.forward  # the adapter's forward (the direct forward of models/native.py calls no module hooks)

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    causal.forward = counted
    try:
        events = list(fastdecode.stream(causal, prompts, "spec.pld", max_new_tokens=20))
    finally:
        del causal.forward
    steps = [e for e in events if isinstance(e, fastdecode.StepEvent)]
    assert len(calls) == len(steps) and all(e.forwards == 1 for e in steps)
    alone = [fastdecode.generate(causal, p, "spec.pld", max_new_tokens=20).token_ids for p in prompts]
    assert [r.token_ids for r in events[-1].results] == alone


def test_both_caches_answer_the_contract_drivers_ask(causal):
    """Drivers ask a cache what it can do (`cache/base.py`), never which class it is."""
    from transformers import DynamicCache

    from fastdecode.cache import CacheBase, DynamicKVCache, KVCache

    mine = causal.new_cache(batch=2, capacity=8)
    wrapped = DynamicKVCache(DynamicCache(config=causal.model.config))
    assert isinstance(mine, KVCache) and isinstance(mine, CacheBase) and isinstance(wrapped, CacheBase)
    assert (mine.can_rollback(), mine.ragged(), mine.plans_attention()) == (True, True, True)
    assert (wrapped.ragged(), wrapped.plans_attention()) == (False, False)
    assert mine.lengths == [0, 0] and wrapped.lengths == [0] and mine.length == wrapped.length == 0
    for call in (lambda: wrapped.resize(2), lambda: wrapped.adopt(0, mine, 0), lambda: wrapped.end()):
        with pytest.raises(NotImplementedError, match="first"):
            call()


def test_drivers_never_test_a_caches_class():
    import re
    from pathlib import Path

    import fastdecode

    root = Path(fastdecode.__file__).parent
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.parent.name != "cache"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"isinstance\([^)]*(KVCache|DynamicKVCache)", line)]
    assert not found, f"ask the cache (ragged(), plans_attention(), can_rollback()) instead: {found}"
