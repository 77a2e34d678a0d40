"""sparse.* rules and the selection hook: the gathered attention is dense attention with the other columns masked;
a budget >= the context is dense decoding bit for bit (token ids and logits); sinks and the recent window are
always read; Quest's bound is an upper bound; spec.sparse_self equals ar.greedy token for token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode
from fastdecode.attention import gathered, make_selector, rules
from fastdecode.bench.calibration import longctx_prompts
from fastdecode.cache import KVCache
from fastdecode.errors import ParameterError
from fastdecode.sparse.base import Selector
from fastdecode.sparse.calibration import calibrate
from fastdecode.sparse.quest import bound_scores, page_bounds

SMALL = dict(budget=24, sinks=2, recent=6, dense_layers=1)


def small(rule: str) -> dict:
    return {**SMALL, **({"window": 8} if rule == "snapkv" else {})}


@pytest.fixture(scope="module")
def model(tokenizer, to_device):
    """4 layers, grouped-query attention (4 query heads, 2 key/value heads), 512 positions, sharp random logits."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    net = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(8.0)
    m = fastdecode.CausalLM(to_device(net), tokenizer, name="tiny-sparse")
    m._sparse_calibration = calibrate(m, longctx_prompts(items=2, context=96), context=96, tail=8)
    return m


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(4, 300, (n - 1,), generator=g).tolist()


def test_gathered_attention_equals_dense_attention_with_the_other_columns_masked():
    torch.manual_seed(0)
    B, Hq, Hkv, Q, K, D = 2, 4, 2, 3, 40, 8
    q, k, v = torch.randn(B, Hq, Q, D), torch.randn(B, Hkv, K, D), torch.randn(B, Hkv, K, D)
    mask = torch.rand(B, 1, Q, K) > 0.2
    mask[..., -1] = True
    # distinct columns per head (a rule never repeats one), always the last (every query sees something)
    cols = torch.stack([torch.stack([torch.cat([torch.tensor([K - 1]), torch.randperm(K - 1)[:11]])
                                     for _ in range(Hkv)]) for _ in range(B)])
    cols[0, 1, 1:4] = -1  # unused slots
    dense = torch.tensor([False, True])
    out = gathered(q, k, v, mask, 0.3, cols, dense)
    # reference: per key/value head, dense attention where the unselected columns are masked
    sel = torch.zeros(B, Hkv, K, dtype=torch.bool)
    for b in range(B):
        for h in range(Hkv):
            sel[b, h, cols[b, h][cols[b, h] >= 0]] = True
    sel[:, dense] = True
    m = (mask & sel[:, :, None, :]).repeat_interleave(2, dim=1)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=m,
                                         scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rule", rules())
def test_budget_at_least_the_context_is_dense_decoding(model, rule):
    ids = prompt(60)
    ref = fastdecode.generate(model, [ids], "ar.greedy", max_new_tokens=10)[0]
    out = fastdecode.generate(model, [ids], f"sparse.{rule}", max_new_tokens=10, budget=4096)[0]
    assert out.token_ids == ref.token_ids
    # logits of a decode step, with and without the rule
    dev = model.device
    x = torch.tensor([ids], device=dev)
    pos = torch.arange(len(ids), device=dev)[None]
    logits = []
    for sparse in (None, make_selector(f"{rule}:budget=4096", model)):
        cache = model.new_cache(capacity=80)
        model.forward(x, pos, cache, sparse=sparse)
        nxt, at = torch.tensor([[7]], device=dev), torch.tensor([[len(ids)]], device=dev)
        logits.append(model.forward(nxt, at, cache, sparse=sparse))
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("rule", rules())
def test_a_small_budget_reads_less_and_stays_in_it(model, rule):
    sel = make_selector(rule, model, **small(rule))
    ids = prompt(120)
    out = fastdecode.generate(model, [ids], f"sparse.{rule}", max_new_tokens=6, **small(rule))[0]
    assert len(out.token_ids) == 6
    seen: list = []
    real = sel.select

    def spy(layer, q, k, v, mask):
        s = real(layer, q, k, v, mask)
        seen.append((layer, k.shape[2], s))
        return s

    sel.select = spy  # type: ignore[method-assign]
    dev = model.device
    x = torch.tensor([ids], device=dev)
    cache = model.new_cache(capacity=130)
    model.forward(x, torch.arange(len(ids), device=dev)[None], cache, sparse=sel)
    model.forward(torch.tensor([[7]], device=dev), torch.tensor([[len(ids)]], device=dev), cache, sparse=sel)
    decode = [s for layer, K, s in seen[-4:]]
    assert sel.reads.key_cols + sel.reads.value_cols < sel.reads.dense_cols or rule == "oracle"
    for layer, s in enumerate(decode):
        if layer < sel.cfg.dense_layers:
            assert s is None
        elif s is not None:
            n = int((s.cols[0, 0] >= 0).sum())
            assert n <= SMALL["budget"] + 1 or rule == "snapkv"


@pytest.mark.parametrize("rule", rules())
def test_sinks_and_recent_tokens_are_always_read(model, rule):
    torch.manual_seed(1)
    sel = make_selector(rule, model, **small(rule))
    assert isinstance(sel, Selector)
    K = 100
    plan = SimpleNamespace(q_pos=torch.tensor([[K - 1]]), k_pos=torch.arange(K)[None], sparse=None)
    cache = SimpleNamespace(written_since=lambda reader: 0)
    sel.begin(cache, plan)
    q, k, v = torch.randn(1, 4, 200, 16), torch.randn(1, 2, K, 16), torch.randn(1, 2, K, 16)
    prefill = torch.ones(1, 1, 200, K, dtype=torch.bool)
    for layer in range(4):  # a "prefill" first, for the rules that read it (SnapKV)
        sel.select(layer, q[:, :, :K], k, v, prefill[:, :, :K])
    sel.begin(cache, plan)
    mask = torch.ones(1, 1, 1, K, dtype=torch.bool)
    mask[..., :5] = False  # left padding: the sinks are the first *visible* columns
    for layer in range(4):
        s = sel.select(layer, q[:, :, :1], k, v, mask)
        if s is None:
            continue
        sparse_heads = range(2) if s.dense is None else [h for h in range(2) if not s.dense[h]]
        for h in sparse_heads:
            got = set(s.cols[0, h].tolist())
            assert {5, 6} <= got, "sinks"
            assert set(range(K - 6, K)) <= got, "recent window"
            assert not got & {0, 1, 2, 3, 4}, "padding is never read"


def test_quest_bound_is_at_least_the_true_page_maximum():
    torch.manual_seed(2)
    q, k = torch.randn(1, 3, 1, 16), torch.randn(1, 3, 70, 16)
    lo, hi = page_bounds(k, 16)
    bound = bound_scores(q, lo, hi)  # [1, 3, 5]
    exact = (q @ k.transpose(-1, -2))[:, :, 0]  # [1, 3, 70]
    for p in range(5):
        assert torch.all(bound[..., p] >= exact[..., p * 16 : (p + 1) * 16].amax(-1) - 1e-5)
    # incremental bounds (from a later page on) match the fresh ones
    lo2, hi2 = page_bounds(k, 16, start=35)
    assert torch.equal(lo2, lo[:, :, 2:]) and torch.equal(hi2, hi[:, :, 2:])


@pytest.mark.parametrize("rule", ["quest", "streaming", "tidal", "double"])
def test_sparse_self_speculation_equals_greedy(model, rule):
    ids = [prompt(100, seed) for seed in (1, 2)]
    ref = fastdecode.generate(model, ids, "ar.greedy", max_new_tokens=24)
    out = fastdecode.generate(model, ids, "spec.sparse_self", max_new_tokens=24, rule=rule, **{
        k: v for k, v in SMALL.items() if k != "dense_layers"})
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert sum(r.stats.proposed for r in out) > 0


def test_sparse_self_with_the_gpus_unread_drafts_equals_greedy(model, monkeypatch):
    """Greedy on a GPU the sparse drafts stay on the device until the verification reads them with its verdict (one
    read a step): the same output, run here with that path on the CPU."""
    from fastdecode.models.host_ops import HostOps
    from fastdecode.speculative.drafters.sparse_self import SparseSelfDrafter

    ids = [prompt(100, seed) for seed in (1, 2)]
    ref = fastdecode.generate(model, ids, "ar.greedy", max_new_tokens=24)
    kw = {k: v for k, v in SMALL.items() if k != "dense_layers"}
    monkeypatch.setattr(SparseSelfDrafter, "read_each_token", True)  # the CPU's path, on any device
    with HostOps() as each:
        fastdecode.generate(model, ids[0], "spec.sparse_self", max_new_tokens=24, rule="quest", **kw)
    monkeypatch.setattr(SparseSelfDrafter, "read_each_token", False)
    out = fastdecode.generate(model, ids, "spec.sparse_self", max_new_tokens=24, rule="quest", **kw)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    with HostOps() as unread:
        one = fastdecode.generate(model, ids[0], "spec.sparse_self", max_new_tokens=24, rule="quest", **kw)
    assert one.token_ids == ref[0].token_ids
    assert unread.reads < each.reads  # no read per drafted token


def test_attention_option_of_ar_and_spec_methods(model):
    ids = prompt(90)
    a = fastdecode.generate(model, [ids], "ar.sample", max_new_tokens=8, temperature=0.0,
                            attention="quest:budget=24,sinks=2,recent=6")
    b = fastdecode.generate(model, [ids], "sparse.quest", max_new_tokens=8, budget=24, sinks=2, recent=6)
    assert a[0].token_ids == b[0].token_ids
    dense = fastdecode.generate(model, [ids], "spec.pld", max_new_tokens=8, attention="dense")
    assert dense[0].token_ids == fastdecode.generate(model, [ids], "ar.greedy", max_new_tokens=8)[0].token_ids
    with pytest.raises(ParameterError, match="Unknown attention rule"):
        fastdecode.generate(model, [ids], "ar.greedy", attention="qest")
    with pytest.raises(ParameterError, match="name=value"):
        fastdecode.generate(model, [ids], "ar.greedy", attention="quest:128")
    with pytest.raises(ParameterError, match="sinks and the recent window"):
        fastdecode.generate(model, [ids], "sparse.quest", budget=8, recent=16)


def test_cache_reports_rewritten_columns():
    cache = KVCache(["full_attention"], capacity=16)
    real = torch.ones(1, 4, dtype=torch.bool)
    vis = torch.ones(1, 4, 4, dtype=torch.bool).tril()
    cache.begin(torch.arange(4)[None], vis, real)
    cache.end()
    assert cache.written_since(1) == 0
    cache.begin(torch.arange(4, 8)[None], vis, real)
    cache.end()
    assert cache.written_since(1) == 4
    cache.crop(6)  # a rollback, then a rewrite from column 6
    cache.begin(torch.arange(6, 8)[None], vis[:, :2, :2], real[:, :2])
    cache.end()
    assert cache.written_since(1) == 6


def test_calibration_record_is_json_ready(model):
    rec = model._sparse_calibration
    assert len(rec["far_mass"]) == 4 and len(rec["far_mass"][0]) == 2
    assert sorted(rec["channels"][0][0]) == list(range(16))


def test_a_lossless_method_refuses_a_sparse_attention_rule(model):
    """A lossless claim holds for every parameter a method accepts: a sparse rule is refused, with the method that
    does what was asked (sparse.<rule>; spec.sparse_self for sparse drafts verified densely)."""
    ids = prompt(40)
    with pytest.raises(ParameterError, match=r"sparse\.quest"):
        fastdecode.generate(model, [ids], "ar.greedy", max_new_tokens=4, attention="quest:budget=64")
    with pytest.raises(ParameterError, match=r"spec\.sparse_self with rule='streaming:budget=16'"):
        fastdecode.generate(model, [ids], "spec.pld", max_new_tokens=4, attention="streaming:budget=16")
    with pytest.raises(ParameterError, match="give it as rule='quest'"):
        fastdecode.generate(model, [ids], "spec.sparse_self", max_new_tokens=4, attention="quest")
    fastdecode.generate(model, [ids], "ar.sample", max_new_tokens=4, seed=0, attention="quest:budget=24,recent=6")
