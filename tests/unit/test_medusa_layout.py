"""Medusa heads in the Medusa authors' layout: ours saved that way load back exactly onto a tiny random target and
decode losslessly through spec.medusa; a pickle, a wrong shape or a wrong config is refused with the cause."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastdecode
from fastdecode.errors import ModelLoadError
from fastdecode.heads.medusa import MedusaHead, target_lm_head
from fastdecode.heads.medusa_layout import load_medusa_layout, save_medusa_layout


@pytest.mark.parametrize("tied", [True, False])
def test_round_trip_keeps_every_tensor_and_the_logits(causal, tmp_path, tied, to_device):
    head = MedusaHead.untrained(causal) if tied else MedusaHead.for_target(causal, tie_lm_head=False, num_heads=3)
    head = to_device(head)  # where load_medusa_layout puts the loaded one: on the target's device
    with torch.no_grad():
        for p in head.blocks.parameters():
            p.normal_(0, 0.05)
        if not tied:
            head.lm_heads[1].weight.mul_(1.5)  # one head's output layer differs from the target's
    save_medusa_layout(head, tmp_path, causal, dtype=torch.float32)
    saved = load_file(str(tmp_path / "medusa_lm_head.safetensors"))
    H = causal.config.hidden_size
    assert saved["0.0.linear.weight"].shape == (H, H) and saved["0.1.weight"].shape == target_lm_head(causal).shape
    assert json.loads((tmp_path / "config.json").read_text())["medusa_num_heads"] == head.config.num_heads
    back = load_medusa_layout(tmp_path, causal)
    assert back.config == head.config
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), back.state_dict().values(), strict=True))
    lm = target_lm_head(causal)
    h = torch.randn(5, H).to(lm.device)
    assert torch.equal(head.logits(h, lm), back.logits(h, lm))
    prompts = ["the quick brown fox", "Sort this"]
    base = fastdecode.generate(causal, prompts, "ar.greedy", max_new_tokens=20)
    got = fastdecode.generate(causal, prompts, "spec.medusa", max_new_tokens=20, head=str(tmp_path))
    assert [r.token_ids for r in got] == [r.token_ids for r in base]


def test_a_pickle_a_wrong_shape_and_a_wrong_config_are_refused(causal, tmp_path):
    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / "medusa_lm_head.pt").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="a pickle, which fastdecode never loads"):
        load_medusa_layout(tmp_path / "pt", causal)
    save_medusa_layout(MedusaHead.untrained(causal), tmp_path / "ok", causal)
    tensors = load_file(str(tmp_path / "ok" / "medusa_lm_head.safetensors"))
    tensors["0.0.linear.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(tmp_path / "ok" / "medusa_lm_head.safetensors"))
    with pytest.raises(ModelLoadError, match="does not fit"):
        load_medusa_layout(tmp_path / "ok", causal)
    (tmp_path / "ok" / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    with pytest.raises(ModelLoadError, match="does not hold 2 heads"):
        load_medusa_layout(tmp_path / "ok", causal)
