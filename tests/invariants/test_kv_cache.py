"""KV cache: trim (roll back) then regenerate gives identical tokens and logits."""

from __future__ import annotations

import torch


def greedy_steps(model, cache, token, pos, n):
    tokens, logits = [], []
    for _ in range(n):
        out = model.forward(token.view(1, 1), torch.tensor([[pos]]), cache)[:, -1]
        token = out.argmax(-1)
        tokens.append(int(token))
        logits.append(out)
        pos += 1
    return tokens, torch.cat(logits)


def test_trim_then_regenerate_is_identical(causal):
    ids = torch.tensor([causal.encode("the quick brown fox")])
    L = ids.shape[1]
    cache = causal.new_cache()
    first = causal.forward(ids, torch.arange(L)[None], cache)[:, -1].argmax(-1)
    assert cache.length == L and cache.can_trim
    tokens_a, logits_a = greedy_steps(causal, cache, first, L, 8)
    assert cache.length == L + 8
    cache.trim(5)
    assert cache.length == L + 3
    tokens_b, logits_b = greedy_steps(causal, cache, torch.tensor(tokens_a[2]), L + 3, 5)
    assert tokens_b == tokens_a[3:]
    torch.testing.assert_close(logits_b, logits_a[3:], rtol=0, atol=0)


def test_trim_everything_and_crop(causal):
    ids = torch.tensor([causal.encode("abc")])
    cache = causal.new_cache()
    causal.forward(ids, torch.arange(ids.shape[1])[None], cache)
    cache.crop(1)
    assert cache.length == 1
    cache.trim(1)
    assert cache.length == 0


def test_trim_out_of_range_is_refused(causal):
    cache = causal.new_cache()
    causal.forward(torch.tensor([[5, 6]]), torch.tensor([[0, 1]]), cache)
    try:
        cache.trim(3)
    except ValueError as e:
        assert "cannot trim 3" in str(e)
    else:
        raise AssertionError("trim beyond the cache length must fail")
