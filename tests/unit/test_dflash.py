"""DFlash's parts on a tiny random target: the head's attention reads what its mask says, the drafter's cached context
K/V equal a recomputation over every verified token, the training blocks see only the context before their anchor,
and a drafter saved in the authors' layout loads back exactly (and is refused on another target)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastdecode
from fastdecode.errors import IncompatibleMethodError, ModelLoadError, ParameterError
from fastdecode.heads import load_head, save_head
from fastdecode.heads.dflash import DFlashConfig, DFlashHead, build_for, default_target_layers
from fastdecode.heads.dflash_layout import authors_layer_ids, is_dflash_layout, load_dflash, save_dflash
from fastdecode.speculative.drafter import Verification
from fastdecode.speculative.drafters.dflash import DFlashDrafter, DFlashSpecConfig, dflash_head
from fastdecode.train.objectives import TargetBatch, head_objective
from fastdecode.train.objectives.dflash import block_mask, sample_anchors, shape_options


@pytest.fixture(scope="module")
def head(causal):
    return build_for(causal, seed=0, target_layers=(0, 1))


def _features(causal, ids: list[int], layers=(0, 1)):
    dev = causal.device
    out = causal.forward(torch.tensor([ids], device=dev), torch.arange(len(ids), device=dev)[None], hidden=layers)
    return out.layers  # one [1, T, H] per layer


def test_layer_rule_follows_the_authors_and_fits_small_targets():
    assert authors_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # the authors' Qwen3-8B drafter
    assert default_target_layers(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layers(6, 2) == (1, 3) and default_target_layers(6, 3) == (1, 2, 3)
    assert default_target_layers(2, 2) == (0, 1)  # a 2-layer target: its own two layers


def test_config_refuses_bad_shapes():
    with pytest.raises(ParameterError, match="block_size"):
        DFlashConfig(block_size=1)
    with pytest.raises(ParameterError, match="num_kv_heads"):
        DFlashConfig(num_heads=5, num_kv_heads=2)


def test_block_sees_the_context_the_mask_allows(causal, head):
    """Changing a context feature the mask hides leaves the block's output unchanged; a visible one changes it."""
    torch.manual_seed(0)
    H, dev = head.config.hidden_size, causal.device  # the head is built on the target's device
    fused = torch.randn(1, 6, H).to(dev)
    block = torch.randn(1, 3, H).to(dev)
    pos = torch.arange(5, 8, device=dev)[None]
    at = torch.arange(6, device=dev)[None]
    visible = torch.ones(1, 3, 9, dtype=torch.bool, device=dev)
    visible[:, :, 4:6] = False  # context columns 4, 5 hidden
    base = head(block, pos, head.context(fused, at), visible)
    hidden_changed = fused.clone()
    hidden_changed[:, 4:] += 1.0
    same = head(block, pos, head.context(hidden_changed, at), visible)
    torch.testing.assert_close(same, base)
    seen_changed = fused.clone()
    seen_changed[:, 0] += 1.0
    assert not torch.allclose(head(block, pos, head.context(seen_changed, at), visible), base)


def test_cached_context_equals_recomputing_it(causal, head):
    """Two verification steps (a rejection, then an acceptance) cache exactly the verified tokens' K/V."""
    cfg = DFlashSpecConfig()
    drafter = DFlashDrafter(causal, head, cfg, None)
    prompt = causal.encode("the quick brown fox")
    ids = list(prompt)
    # step 1: the prompt, no draft; the target emits one token
    drafter.propose(torch.tensor(ids), 8)
    feats = _features(causal, ids)
    dev = causal.device
    nxt = int(causal.forward(torch.tensor([ids], device=dev), torch.arange(len(ids), device=dev)[None])[0, -1].argmax())
    drafter.observe(Verification(0, (nxt,), torch.zeros(1, 5), 0, None, tuple(f[0] for f in feats)))
    assert drafter.seen == len(ids)
    ids.append(nxt)
    # step 2: feed [last token, 3 drafts]; two drafts accepted
    draft = drafter.propose(torch.tensor(ids), 3)
    assert draft.tokens.numel() == 3 and drafter.forwards == 1
    fed = ids[-1:] + draft.tokens.tolist()
    feats = _features(causal, ids[:-1] + fed)
    step = tuple(f[0, len(ids) - 1 :] for f in feats)  # the rows this forward fed
    drafter.observe(Verification(2, tuple(fed[1:3]) + (7,), torch.zeros(4, 5), 3, None, step))
    kept = ids + fed[1:3]
    assert drafter.seen == len(kept)
    full = head.context(head.fuse(_features(causal, kept)), torch.arange(len(kept), device=dev)[None])
    assert drafter.kv is not None
    for (k, v), (k2, v2) in zip(drafter.kv, full, strict=True):
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-4)


def test_training_blocks_read_only_the_context_before_their_anchor():
    attention = torch.tensor([[True] * 6 + [False] * 2])
    mask = block_mask(torch.tensor([[2, 4]]), attention, 3)  # [1, 6, 8 + 6]
    assert mask.shape == (1, 6, 14)
    assert mask[0, :3, :8].sum(-1).tolist() == [2, 2, 2]  # block 0 (anchor 2): positions 0, 1
    assert mask[0, 3:, :8].sum(-1).tolist() == [4, 4, 4]
    own = mask[0, :, 8:]
    assert own[:3, :3].all() and own[3:, 3:].all() and not own[:3, 3:].any() and not own[3:, :3].any()


def test_anchors_sit_on_answer_tokens_followed_by_one():
    answer = torch.tensor([[False, False, True, True, True, False], [False, True, True, False, False, False]])
    anchors, keep = sample_anchors(answer, 8, torch.Generator().manual_seed(0))
    assert keep.sum(1).tolist() == [2, 1]
    for row in range(2):
        for a in anchors[row][keep[row]].tolist():
            assert answer[row, a] and answer[row, a + 1]


def test_objective_loss_weights_and_metrics(causal):
    obj = head_objective("dflash")
    options = {"layers": "0,1", "block_size": "4", "anchors": "4", "gamma": "2"}
    assert shape_options(options) == {"target_layers": (0, 1), "block_size": 4}
    assert obj.target_layers(causal, options) == (0, 1)
    head = obj.build_head(causal, options)
    assert head.config.block_size == 4 and head.training_options == {"anchors": 4, "gamma": 2.0}
    prompt = causal.encode("the quick brown fox")
    answer = fastdecode.generate(causal, "the quick brown fox", "ar.greedy", max_new_tokens=12).token_ids
    ids = torch.tensor([prompt + answer], device=causal.device)
    T = ids.shape[1]
    at = torch.arange(T, device=ids.device)[None]
    out = causal.forward(ids, at, hidden=(0, 1))
    is_answer = at >= len(prompt)
    batch = TargetBatch(ids, torch.ones_like(is_answer), is_answer, out.hidden, out.layers, out.logits)
    loss, metrics = obj.head_loss(head, causal, batch, torch.Generator().manual_seed(0))
    loss.backward()
    assert loss.item() > 0 and head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0
    assert causal.model.lm_head.weight.grad is None  # the target's lm_head stays frozen
    assert set(metrics) == {"loss", "acc0", "acc1", "acc2", "tau"} and 1.0 <= metrics["tau"] <= 4.0
    with pytest.raises(ValueError, match="unknown dflash option"):
        obj.build_head(causal, {"blocksize": 4})


def test_head_saves_and_loads_in_both_layouts(causal, head, tmp_path):
    save_head(head, tmp_path / "ours", dtype="float32")
    again = load_head(tmp_path / "ours", device=next(head.parameters()).device)
    assert again.config == head.config
    for k, v in head.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v)

    folder = save_dflash(head, tmp_path / "authors", causal, dtype=torch.float32)
    record = json.loads((folder / "config.json").read_text())
    assert record["architectures"] == ["DFlashDraftModel"] and record["block_size"] == 8
    assert record["dflash_config"] == {"mask_token_id": head.config.mask_token_id, "target_layer_ids": [0, 1]}
    assert record["num_target_layers"] == 2 and record["vocab_size"] == causal.vocab_size
    names = set(load_file(str(folder / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight",
            "layers.1.mlp.down_proj.weight"} <= names
    assert is_dflash_layout(folder) and not is_dflash_layout(tmp_path / "ours")
    loaded = load_dflash(folder, causal)
    assert loaded.config == head.config
    for k, v in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)
    # spec.dflash takes either folder as head=
    assert dflash_head(causal, str(folder)).config == head.config
    out = fastdecode.generate(causal, "the quick", "spec.dflash", max_new_tokens=10, head=str(folder))
    assert out.token_ids == fastdecode.generate(causal, "the quick", "ar.greedy", max_new_tokens=10).token_ids


def test_authors_layout_on_another_target_is_refused(causal, head, tmp_path, save_causal_model, tokenizer):
    folder = save_dflash(head, tmp_path / "authors", causal)
    other = fastdecode.load(save_causal_model(tmp_path / "wide", tokenizer, hidden_size=96))
    with pytest.raises(IncompatibleMethodError, match="hidden_size 64"):
        load_dflash(folder, other)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({**tensors, "model.extra.weight": torch.zeros(2)}, str(weights))
    with pytest.raises(ModelLoadError, match="does not fit a DFlash drafter.*unexpected tensors extra.weight"):
        load_dflash(folder, causal)
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_dflash(folder, causal)
    weights.unlink()
    with pytest.raises(ModelLoadError, match="missing"):
        load_dflash(folder, causal)


def test_a_model_without_a_shipped_head_is_refused_unless_untrained_heads_are_allowed(causal, monkeypatch):
    monkeypatch.delenv("FASTDECODE_UNTRAINED_HEADS")
    with pytest.raises(ModelLoadError, match="No 'dflash' head ships"):
        dflash_head(causal)
    monkeypatch.setenv("FASTDECODE_UNTRAINED_HEADS", "1")  # the test suite's setting: a seeded random head
    a, b = dflash_head(causal), dflash_head(causal)
    assert isinstance(a, DFlashHead)
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v)
