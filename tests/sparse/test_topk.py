"""The top-k rules (quest, tidal, double, oracle, snapkv) as their authors wrote them: selection per query head
(equal to per key/value head where heads are not grouped; at full budget equal to dense with grouped heads), Quest's
current page and left-padding-free page bounds, SnapKV's prefix-only pooling, Double Sparsity's "qk" channel
ranking and label quantisation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode
from fastdecode.attention import gathered, make_selector
from fastdecode.bench.calibration import longctx_prompts
from fastdecode.sparse.base import Selector, kv_columns
from fastdecode.sparse.calibration import calibrate, channel_weight
from fastdecode.sparse.double import quantised

TOPK = ["quest", "tidal", "double", "oracle", "snapkv"]
SMALL = dict(budget=24, sinks=2, recent=6, dense_layers=1)


def small(rule: str, **extra) -> dict:
    return {**SMALL, **({"window": 8} if rule == "snapkv" else {}), **extra}


def tiny(tokenizer, kv_heads: int, name: str) -> fastdecode.CausalLM:
    """4 layers, 4 query heads over `kv_heads` key/value heads, sharp random logits, calibrated."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    net = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(8.0)
    m = fastdecode.CausalLM(net, tokenizer, name=name)
    m._sparse_calibration = calibrate(m, longctx_prompts(items=2, context=96), context=96, tail=8)
    return m


@pytest.fixture(scope="module")
def mha(tokenizer):
    return tiny(tokenizer, 4, "tiny-mha")


@pytest.fixture(scope="module")
def gqa(tokenizer):
    return tiny(tokenizer, 2, "tiny-gqa")


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(4, 300, (n - 1,), generator=g).tolist()


def spy(sel) -> list:
    """Record every selection `sel` makes."""
    seen: list = []
    real = sel.select

    def select(layer, q, k, v, mask):
        s = real(layer, q, k, v, mask)
        seen.append(s)
        return s

    sel.select = select
    return seen


def test_gathered_reads_per_query_head_columns():
    torch.manual_seed(0)
    B, Hq, Hkv, Q, K, D = 2, 4, 2, 3, 40, 8
    q, k, v = torch.randn(B, Hq, Q, D), torch.randn(B, Hkv, K, D), torch.randn(B, Hkv, K, D)
    mask = torch.rand(B, 1, Q, K) > 0.2
    mask[..., -1] = True
    cols = torch.stack([torch.stack([torch.cat([torch.tensor([K - 1]), torch.randperm(K - 1)[:9]])
                                     for _ in range(Hq)]) for _ in range(B)])  # [B, Hq, 10]
    cols[1, 2, 3:6] = -1
    dense = torch.tensor([True, False])
    out = gathered(q, k, v, mask, 0.3, cols, dense)
    sel = torch.zeros(B, Hq, K, dtype=torch.bool)
    for b in range(B):
        for h in range(Hq):
            sel[b, h, cols[b, h][cols[b, h] >= 0]] = True
    sel[:, :2] = True  # the query heads of dense key/value head 0
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                         attn_mask=mask & sel[:, :, None, :], scale=0.3)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="per key/value head or per query head"):
        gathered(q, k, v, mask, 0.3, cols[:, :3], None)
    # what a key/value head reads: the union of its query heads' columns
    union = sum(len(set(cols[b, 2 * h: 2 * h + 2].flatten().tolist()) - {-1}) for b in range(B) for h in range(Hkv))
    assert kv_columns(cols, Hkv, K) == union


@pytest.mark.parametrize("rule", TOPK)
def test_per_query_head_equals_per_kv_head_when_heads_are_not_grouped(mha, rule):
    ids = prompt(120)
    runs = []
    for per_query_head in (False, True):
        sel = make_selector(rule, mha, **small(rule, per_query_head=per_query_head))
        seen = spy(sel)
        cache = mha.new_cache(capacity=130)
        mha.forward(torch.tensor([ids]), torch.arange(len(ids))[None], cache, sparse=sel)
        logits = mha.forward(torch.tensor([[7]]), torch.tensor([[len(ids)]]), cache, sparse=sel)
        runs.append((seen[-4:], logits))
    (a, la), (b, lb) = runs
    assert any(s is not None for s in a)
    for s, t in zip(a, b, strict=True):
        assert (s is None) == (t is None)
        if s is not None:
            assert torch.equal(s.cols.sort(-1).values, t.cols.sort(-1).values)
    assert torch.equal(la, lb)
    out = [fastdecode.generate(mha, [ids], f"sparse.{rule}", max_new_tokens=6, **small(rule, per_query_head=p))[0]
           for p in (False, True)]
    assert out[0].token_ids == out[1].token_ids


@pytest.mark.parametrize("rule", TOPK)
def test_per_query_head_at_full_budget_is_dense_with_grouped_heads(gqa, rule):
    """The rule itself (past the base's dense shortcut) picks every visible column for every query head (64: whole
    pages of 16 for Quest)."""
    torch.manual_seed(3)
    K = 60
    sel = make_selector(rule, gqa, budget=64, sinks=0, recent=1, dense_layers=0, per_query_head=True,
                        **({"window": 8} if rule == "snapkv" else {}))
    assert isinstance(sel, Selector)
    cache = SimpleNamespace(written_since=lambda reader: 0)
    sel.begin(cache, SimpleNamespace(q_pos=torch.zeros(1, K), sparse=None))
    q, k, v = torch.randn(1, 4, K, 16), torch.randn(1, 2, K, 16), torch.randn(1, 2, K, 16)
    causal = torch.ones(K, K, dtype=torch.bool).tril()[None, None]
    for layer in range(4):  # a prefill first (SnapKV keeps what it picks there)
        sel.observe(layer, q, k, causal)
    sel.begin(cache, SimpleNamespace(q_pos=torch.zeros(1, 1), sparse=None))
    mask = torch.ones(1, 1, 1, K, dtype=torch.bool)
    visible = mask[:, 0].any(1)
    for layer in range(2):
        sel.observe(layer, q[:, :, -1:], k, mask)
        s = sel.choose(layer, q[:, :, -1:], k, mask, visible)
        if s is None:  # TidalDecode's selection layer attends densely
            continue
        assert s.cols.shape[1] == 4
        out = gathered(q[:, :, -1:], k, v, mask, 0.25, s.cols, s.dense)
        ref = F.scaled_dot_product_attention(q[:, :, -1:], k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                             scale=0.25)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rule", TOPK)
def test_per_query_head_budget_at_least_the_context_is_greedy(gqa, rule):
    ids = prompt(60)
    ref = fastdecode.generate(gqa, [ids], "ar.greedy", max_new_tokens=8)[0]
    out = fastdecode.generate(gqa, [ids], f"sparse.{rule}", max_new_tokens=8, budget=4096, per_query_head=True)[0]
    assert out.token_ids == ref.token_ids


def test_quest_pages_ignore_left_padding(gqa):
    """A left-padded row of a batch gets the page bounds (and the selection) it gets alone."""
    long, short = prompt(100, 1), prompt(77, 2)
    pad = len(long) - len(short)
    sels = []
    for rows in ([long, [2] * pad + short], [short]):
        sel = make_selector("quest", gqa, budget=32, page=16)
        ids = torch.tensor(rows)
        am = torch.ones_like(ids)  # 0 = left padding
        if len(rows) == 2:
            am[1, :pad] = 0
        pos = (am.cumsum(-1) - 1).clamp(min=0)
        cache = gqa.new_cache(batch=len(rows), capacity=len(long) + 4)
        gqa.forward(ids, pos, cache, attention_mask=am, sparse=sel)
        nxt = torch.tensor([[7]] * len(rows))
        gqa.forward(nxt, pos[:, -1:] + 1, cache, attention_mask=torch.cat([am, torch.ones_like(nxt)], 1),
                    sparse=sel)
        sels.append((sel, -1 if len(rows) == 2 else 0))
    (batched, b), (alone, a) = sels
    n = alone.pages[3][0].shape[2]  # the short row's pages
    assert n == -(-(len(short) + 1) // 16)
    for layer in range(1, 4):
        for t in range(2):
            torch.testing.assert_close(batched.pages[layer][t][b, :, :n], alone.pages[layer][t][a], atol=1e-5,
                                       rtol=1e-4)
        assert torch.equal(batched.ids[layer][b, pad:], alone.ids[layer][a])
        assert bool((batched.ids[layer][b, :pad] == -1).all())


def test_quest_keeps_the_current_page_and_forces_nothing_else():
    sel = make_selector("quest", None, budget=32, page=16)
    assert (sel.cfg.sinks, sel.cfg.recent, sel.cfg.per_query_head) == (0, 1, True)
    torch.manual_seed(4)
    K = 100  # pages 0..6, the current one (96..99) holds 4 tokens
    q = torch.ones(1, 2, 1, 8)
    k = torch.rand(1, 2, K, 8) + 1.0  # every full page bounds q . k far above the current page
    k[:, :, 96:] = -1.0
    cache = SimpleNamespace(written_since=lambda reader: 0)
    sel.begin(cache, SimpleNamespace(q_pos=torch.zeros(1, 1), sparse=None))
    mask = torch.ones(1, 1, 1, K, dtype=torch.bool)
    sel.observe(2, q, k, mask)
    s = sel.choose(2, q, k, mask, mask[:, 0, 0])
    for h in range(2):
        got = set(s.cols[0, h].tolist())
        assert set(range(96, K)) <= got
        assert len(got - {-1}) == 4 + 16  # budget // page = 2 whole pages: the current one, the best other


def test_snapkv_pools_the_prefix_alone_and_forces_no_sinks():
    """The kept prefix columns are the top of the window's summed weights over the prefix, average-pooled with
    zero padding (the authors' `F.avg_pool1d` defaults), per query head."""
    sel = make_selector("snapkv", None, budget=20, window=8, kernel=5)
    assert sel.cfg.sinks == 0 and sel.cfg.per_query_head
    torch.manual_seed(5)
    K, w, D = 60, 8, 16
    q, k = torch.randn(1, 4, K, D), torch.randn(1, 2, K, D)
    causal = torch.ones(K, K, dtype=torch.bool).tril()[None, None]
    sel.begin(SimpleNamespace(written_since=lambda reader: 0), SimpleNamespace(q_pos=torch.zeros(1, K), sparse=None))
    sel.observe(0, q, k, causal)
    # the reference, written out
    s = (q[:, :, -w:] @ k.repeat_interleave(2, 1).transpose(-1, -2)) / D**0.5  # [1, 4, w, K]
    p = s.masked_fill(~causal[:, :, -w:], float("-inf")).softmax(-1).sum(2)[..., : K - w]  # [1, 4, prefix]
    padded = F.pad(p, (2, 2))
    pooled = torch.stack([padded[..., i: i + 5].sum(-1) / 5 for i in range(K - w)], -1)
    top = pooled.topk(20 - w, -1).indices
    want = torch.zeros(1, 4, K, dtype=torch.bool)
    want.scatter_(-1, top, True)
    want[..., K - w:] = True
    assert torch.equal(sel.kept[0], want)


def test_double_ranks_channels_by_mean_abs_q_times_k_per_token():
    # channel 0: big |q| and big |k| but never on the same token; channel 1: moderate on every token
    T = 8
    q = torch.zeros(1, 2, T, 4)
    k = torch.zeros(1, 1, T, 4)
    q[:, :, ::2, 0], k[:, :, 1::2, 0] = 10.0, 10.0
    q[:, :, :, 1], k[:, :, :, 1] = 2.0, 2.0
    w = channel_weight(q, k)  # [1, 4]
    assert w.argmax().item() == 1 and w[0, 0].item() == 0.0
    assert (q.abs().mean((0, 2)).mean(0) * k.abs().mean((0, 2))[0]).argmax().item() == 0  # the old ranking


def test_double_label_quantisation(gqa):
    torch.manual_seed(6)
    x = torch.randn(3, 5, 16)
    for bits in (2, 4, 8):
        y = quantised(x, bits)
        step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / (2**bits - 1)
        assert bool(((y - x).abs() <= step / 2 + 1e-6).all())
        assert max(len(set(r.tolist())) for r in y.reshape(-1, 16)) <= 2**bits
    assert torch.equal(quantised(x, 0), x)
    ids = prompt(120)
    sel = make_selector("double", gqa, **small("double", label_bits=4))
    out = fastdecode.generate(gqa, [ids], "sparse.double", max_new_tokens=6, **small("double", label_bits=4))[0]
    assert len(out.token_ids) == 6
    cache = gqa.new_cache(capacity=130)
    gqa.forward(torch.tensor([ids]), torch.arange(len(ids))[None], cache, sparse=sel)
    exact = make_selector("double", gqa, **small("double"))
    cache2 = gqa.new_cache(capacity=130)
    gqa.forward(torch.tensor([ids]), torch.arange(len(ids))[None], cache2, sparse=exact)
    labels, ref = sel.labels[2], exact.labels[2]
    assert not torch.equal(labels, ref) and torch.allclose(labels, ref, atol=0.5)
    with pytest.raises(Exception, match="label_bits"):
        make_selector("double:label_bits=12", gqa)


def test_quest_incremental_bounds_equal_fresh_ones(gqa):
    """Bounds updated page by page over decode steps (a padded batch, a rollback) equal bounds made from scratch."""
    long, short = prompt(50, 3), prompt(41, 4)
    ids = torch.tensor([long, [2] * 9 + short])
    am = torch.ones_like(ids)
    am[1, :9] = 0
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    sel = make_selector("quest", gqa, budget=32, page=8)
    cache = gqa.new_cache(batch=2, capacity=90)
    gqa.forward(ids, pos, cache, attention_mask=am, sparse=sel)
    for step in range(20):
        gqa.forward(torch.tensor([[7], [9]]), pos[:, -1:] + 1 + step, cache, sparse=sel)
        if step == 12:  # a speculative rollback: rows drop 5 and 2 columns, then decode on
            cache.crop_rows([n - d for n, d in zip(cache.lengths, (5, 2), strict=True)])
    width = max(cache.lengths)
    for layer in range(4):
        k = cache.layers[layer].keys[:, :, :width]
        fresh = make_selector("quest", gqa, budget=32, page=8)
        fresh.begin(cache, SimpleNamespace(q_pos=torch.zeros(2, 1), sparse=None))
        fresh.observe(layer, None, k, None)
        n = fresh.pages[layer][0].shape[2]
        for t in range(2):
            torch.testing.assert_close(sel.pages[layer][t][:, :, :n], fresh.pages[layer][t], atol=0, rtol=0)


@pytest.mark.parametrize("rule", ["streaming", "duo", "lychee"])
def test_per_query_head_is_refused_where_a_rule_ranks_no_columns_per_head(rule):
    from fastdecode.attention import RULES, rules
    from fastdecode.errors import ParameterError

    rules()  # every rule registered
    with pytest.raises(ParameterError, match="per_query_head.*quest, tidal, double, oracle, snapkv"):
        RULES[rule].config(per_query_head=True)
    for topk in ("quest", "tidal", "double", "oracle", "snapkv"):
        assert RULES[topk].config(per_query_head=True).per_query_head
