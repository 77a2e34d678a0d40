"""StreamingLLM's position shift, LycheeDecode's per-head sets, spec.sparse_self with SnapKV, and the refusal of a
sparse `attention=` on a lossless method (issue #34, the sparse-stream part)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import fastdecode
from fastdecode.attention import gathered, make_selector
from fastdecode.bench.calibration import longctx_prompts
from fastdecode.errors import IncompatibleMethodError
from fastdecode.sparse.base import query_scores
from fastdecode.sparse.calibration import calibrate
from fastdecode.sparse.streaming import StreamingLLMConfig, slot_shifts


def tiny(tokenizer, **extra) -> LlamaForCausalLM:
    """4 layers, grouped-query attention (4 query heads, 2 key/value heads), sharp random logits."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False, **extra)
    net = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(8.0)
    return net


@pytest.fixture(scope="module")
def model(tokenizer, to_device):
    m = fastdecode.CausalLM(to_device(tiny(tokenizer)), tokenizer, name="tiny-stream")
    m._sparse_calibration = calibrate(m, longctx_prompts(items=2, context=96), context=96, tail=8)
    return m


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(4, 300, (n - 1,), generator=g).tolist()


def step_logits(model, ids: list[int], attention: str | None) -> torch.Tensor:
    """Logits of one decode step after a dense prefill of `ids`, reading what `attention` selects."""
    sparse = make_selector(attention, model) if attention else None
    cache = model.new_cache(capacity=len(ids) + 4)
    dev = model.device
    model.forward(torch.tensor([ids], device=dev), torch.arange(len(ids), device=dev)[None], cache, sparse=sparse)
    return model.forward(torch.tensor([[7]], device=dev), torch.tensor([[len(ids)]], device=dev), cache, sparse=sparse)


# -- StreamingLLM --------------------------------------------------------------------------------------------------


def test_streamingllm_defaults_are_the_authors():
    cfg = StreamingLLMConfig()
    assert cfg.dense_layers == 0 and cfg.positions == "shift"


@pytest.mark.parametrize("positions", ["shift", "original"])
def test_streaming_at_full_budget_is_dense_decoding(model, positions):
    ids = prompt(60)
    ref = fastdecode.generate(model, [ids], "ar.greedy", max_new_tokens=10)[0]
    out = fastdecode.generate(model, [ids], "sparse.streaming", max_new_tokens=10, budget=4096,
                              positions=positions)[0]
    assert out.token_ids == ref.token_ids
    torch.testing.assert_close(step_logits(model, ids, f"streaming:budget=4096,positions={positions}"),
                               step_logits(model, ids, None))


def test_position_shift_equals_attention_over_the_compacted_cache(model):
    """Keys cached after RoPE at their own positions, re-rotated by the rule, give the attention of the same raw keys
    rotated at their slots in a (sinks + window) cache, the query at its own key's slot (StreamingLLM's
    pos_shift); a left-padded row has its sinks after the padding."""
    torch.manual_seed(3)
    rotary = model.model.model.rotary_emb
    B, Hq, Hkv, K, D, budget, sinks = 2, 4, 2, 40, 16, 12, 2
    sel = make_selector(f"streaming:budget={budget},sinks={sinks}", model)
    pad = torch.tensor([0, 5])
    k_pos = (torch.arange(K)[None] - pad[:, None]).clamp(min=0)  # [B, K]
    q_pos = k_pos[:, -1:]  # the query is the last column (its own key)
    mask = (torch.arange(K)[None] >= pad[:, None])[:, None, None, :]  # [B, 1, 1, K]
    raw_k, v, raw_q = torch.randn(B, Hkv, K, D), torch.randn(B, Hkv, K, D), torch.randn(B, Hq, 1, D)

    def at(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [B, H, T, D] rotated at positions [B, T]
        cos, sin = rotary(x, pos)
        return apply_rotary_pos_emb(x, x, cos, sin)[0]

    k, q = at(raw_k, k_pos), at(raw_q, q_pos)
    sel.begin(SimpleNamespace(written_since=lambda reader: 0), SimpleNamespace(q_pos=q_pos, k_pos=k_pos, sparse=None))
    s = sel.select(0, q, k, v, mask)
    assert s is not None and s.rotation is not None
    out = gathered(q, k, v, mask, D**-0.5, s.cols, rotation=s.rotation)  # [B, Hq, 1, D]
    for b in range(B):
        kept = torch.cat([torch.arange(pad[b], pad[b] + sinks), torch.arange(K - (budget - sinks), K)])
        slots = torch.arange(budget)[None]
        ks = at(raw_k[b : b + 1, :, kept], slots).repeat_interleave(2, 1)
        ref = F.scaled_dot_product_attention(at(raw_q[b : b + 1], slots[:, -1:]), ks,
                                             v[b : b + 1, :, kept].repeat_interleave(2, 1), scale=D**-0.5)
        torch.testing.assert_close(out[b : b + 1], ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("q_pos", [[11, 12], [6, 11]], ids=["one-shift", "a-shift-per-query"])
def test_slot_shifts_give_each_query_and_key_its_slot(model, q_pos):
    """Two queries over selected columns with gaps between them: keys take slots 0, 1, ... in position order, each
    query its own column's slot. The two queries share one shift (only the gapped keys are rotated, relative to it)
    or each has its own (every key and query is rotated)."""
    torch.manual_seed(5)
    rotary = model.model.model.rotary_emb
    pos = torch.arange(13)[None]  # [1, K]: the cache holds positions 0..12
    chosen = [0, 1, 5, 6, 10, 11, 12]
    cols = torch.tensor(chosen)[torch.randperm(len(chosen))][None, None].expand(1, 2, -1)  # any order, 2 heads
    qp = torch.tensor([q_pos])
    raw_k, v, raw_q = torch.randn(1, 2, 13, 16), torch.randn(1, 2, 13, 16), torch.randn(1, 4, 2, 16)

    def at(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary(x, p)
        return apply_rotary_pos_emb(x, x, cos, sin)[0]

    mask = (pos[:, None, :] <= qp[:, :, None])[:, None]  # [1, 1, Q, K] causal
    new_cols, rotation = slot_shifts(cols, pos, qp, rotary.inv_freq)
    assert sorted(new_cols[0, 0].tolist()) == chosen
    out = gathered(at(raw_q, qp), at(raw_k, pos), v, mask, 0.25, new_cols, rotation=rotation)
    slots = torch.arange(len(chosen))[None]
    ks = at(raw_k[:, :, chosen], slots).repeat_interleave(2, 1)
    q_slots = torch.tensor([[chosen.index(p) for p in q_pos]])
    ref = F.scaled_dot_product_attention(at(raw_q, q_slots), ks, v[:, :, chosen].repeat_interleave(2, 1),
                                         attn_mask=mask[..., chosen], scale=0.25)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert (rotation.queries is None) == (q_pos == [11, 12])


def test_position_shift_differs_from_original_positions_past_the_window(model):
    ids = prompt(120)
    shift = step_logits(model, ids, "streaming:budget=24,sinks=2,positions=shift")
    original = step_logits(model, ids, "streaming:budget=24,sinks=2,positions=original")
    assert not torch.allclose(shift, original, atol=1e-3)
    # inside the window (no gap between the sinks and the window) the two are the same attention
    short = prompt(20)
    torch.testing.assert_close(step_logits(model, short, "streaming:budget=24,sinks=2,positions=shift"),
                               step_logits(model, short, "streaming:budget=24,sinks=2,positions=original"))


def test_streaming_reads_and_holds_sinks_plus_window_in_every_layer(model):
    sel = make_selector("streaming:budget=24,sinks=2", model)
    ids = prompt(120)
    cache = model.new_cache(capacity=130)
    dev = model.device
    model.forward(torch.tensor([ids], device=dev), torch.arange(len(ids), device=dev)[None], cache, sparse=sel)
    before = sel.reads.key_cols
    model.forward(torch.tensor([[7]], device=dev), torch.tensor([[len(ids)]], device=dev), cache, sparse=sel)
    assert sel.reads.key_cols - before == 4 * 2 * 24  # 4 layers, 2 key/value heads, budget columns each
    assert sel.held_columns(context=121, heads=2, layers=4) == 4 * 2 * 24
    assert sel.held_columns(context=10, heads=2, layers=4) == 4 * 2 * 10
    dense1 = make_selector("streaming:budget=24,sinks=2,dense_layers=1", model)
    assert dense1.held_columns(context=121, heads=2, layers=4) == 2 * (121 + 3 * 24)


def test_position_shift_refuses_a_rope_it_cannot_rerotate(tokenizer):
    net = tiny(tokenizer, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    m = fastdecode.CausalLM(net, tokenizer, name="tiny-dynamic-rope")
    with pytest.raises(IncompatibleMethodError, match="positions='original'"):
        make_selector("streaming:budget=24", m)
    assert make_selector("streaming:budget=24,positions=original", m) is not None


# -- LycheeDecode --------------------------------------------------------------------------------------------------


def test_lychee_keeps_one_set_per_head_index_refreshed_by_its_retrieval_heads(model, tokenizer):
    """Layer 1 (the first sparse one) has no sets: every head picks its own. Layer 2's retrieval head is head 0,
    layer 3's head 1: a sparse head reads the set its index's retrieval head picked in an earlier layer."""
    m = fastdecode.CausalLM(model.model, tokenizer, name="tiny-lychee")
    m._sparse_calibration = {**model._sparse_calibration, "far_mass": [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]}
    sel = make_selector("lychee:budget=24,sinks=2,recent=6,dense_layers=1", m)
    torch.manual_seed(4)
    K = 100
    mask = torch.ones(1, 1, 1, K, dtype=torch.bool)
    visible = mask[:, 0].any(1)
    qs, ks = torch.randn(4, 1, 4, 1, 16), torch.randn(4, 1, 2, K, 16)
    v = torch.randn(1, 2, K, 16)
    plan = SimpleNamespace(q_pos=torch.zeros(1, 1, dtype=torch.long), k_pos=torch.arange(K)[None], sparse=None)
    sel.begin(SimpleNamespace(written_since=lambda reader: 0), plan)

    def own_pick(layer: int, head: int) -> set[int]:
        """The top columns of one head by its own (two grouped query heads') attention weights."""
        q, k = qs[layer][:, 2 * head : 2 * head + 2], ks[layer][:, head : head + 1]
        return set(sel.top(query_scores(q, k, mask), visible)[0, 0].tolist())

    got = [sel.select(layer, qs[layer], ks[layer], v, mask) for layer in range(4)]
    assert got[0] is None and got[1] is None  # a dense layer; then every head index picks its first set
    two, three = got[2], got[3]
    assert two is not None and three is not None
    assert two.dense is not None and two.dense.tolist() == [True, False]
    assert set(two.cols[0, 1].tolist()) == own_pick(1, 1)  # head 1 reads its index's set from layer 1
    assert set(two.cols[0, 0].tolist()) == own_pick(2, 0) != own_pick(1, 1)  # sets differ per head
    assert three.dense is not None and three.dense.tolist() == [False, True]
    assert set(three.cols[0, 0].tolist()) == own_pick(2, 0)  # head 0 reads layer 2's refresh, not layer 1's
    assert own_pick(2, 0) != own_pick(1, 0)


# -- spec.sparse_self with SnapKV ----------------------------------------------------------------------------------


def test_sparse_self_snapkv_drafts_from_the_prefill_and_stays_lossless(model, monkeypatch):
    """SnapKV chooses at the prefill, which spec.sparse_self runs in its dense verification forward: the drafts' rule
    watches it, so the draft forwards read SnapKV's columns (not the whole cache), and the output is ar.greedy's."""
    from fastdecode.sparse.snapkv import SnapKVSelector

    chosen: list[int] = []
    real = SnapKVSelector.choose

    def spy(self, layer, q, k, mask, visible):
        sel = real(self, layer, q, k, mask, visible)
        if sel is not None:
            chosen.append(int((sel.cols[0, 0] >= 0).sum()))
        return sel

    monkeypatch.setattr(SnapKVSelector, "choose", spy)
    ids = [prompt(100, seed) for seed in (1, 2)]
    ref = fastdecode.generate(model, ids, "ar.greedy", max_new_tokens=16)
    out = fastdecode.generate(model, ids, "spec.sparse_self", max_new_tokens=16, rule="snapkv:window=8", budget=24,
                              sinks=2, recent=6)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert chosen and max(chosen) < 100  # the drafts read SnapKV's kept columns, fewer than the context
