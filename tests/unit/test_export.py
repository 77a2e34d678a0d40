"""The zoo export writes bfloat16 weights by default, leaves the trained model float32, and loads back as float32."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

import fastdecode
from fastdecode.train.export import save_folder


def _dtypes(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}


def test_export_defaults_to_bfloat16_and_keeps_the_trained_model(causal, tmp_path):
    log = [{"step": i, "loss": 1.0} for i in range(3)]
    save_folder(causal.model, causal.tokenizer, tmp_path / "bf16", log)
    save_folder(causal.model, causal.tokenizer, tmp_path / "fp32", log, dtype="float32")
    assert _dtypes(tmp_path / "bf16") == {torch.bfloat16} and _dtypes(tmp_path / "fp32") == {torch.float32}
    assert all(p.dtype == torch.float32 for p in causal.model.parameters())
    back = fastdecode.load(tmp_path / "bf16", device="cpu", dtype="float32")
    for (name, a), b in zip(causal.model.state_dict().items(), back.model.state_dict().values(), strict=True):
        assert b.dtype == torch.float32 and torch.equal(b, a.cpu().to(torch.bfloat16).float()), name


def test_export_refuses_an_unknown_dtype(causal, tmp_path):
    with pytest.raises(ValueError, match="bfloat16"):
        save_folder(causal.model, causal.tokenizer, tmp_path, [], dtype="float8")
