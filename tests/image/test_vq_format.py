"""The VQ tokenizer's folder format: what `save_vq` writes, `load_vq` and an image.json naming it read back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastdecode.errors import ModelLoadError
from fastdecode.models.image import read_image_spec
from fastdecode.models.vq import VQNet, load_vq, save_vq


def test_vq_round_trip_through_an_image_spec(tmp_path) -> None:
    torch.manual_seed(0)
    net = VQNet(codes=16, dim=4, width=8)
    save_vq(net, tmp_path / "vq", dtype=torch.float32)
    labels = [str(i) for i in range(10)]
    (tmp_path / "image.json").write_text(json.dumps({"tokenizer": "vq", "vq": "vq", "labels": labels,
                                                     "cfg_scale": 2.0, "codes": 16}))
    spec = read_image_spec(tmp_path)
    assert spec is not None and (spec.K, spec.d, spec.grid, spec.size, spec.cfg_scale) == (16, 4, (7, 7), (28, 28), 2.0)
    assert torch.allclose(spec.codebook.norm(dim=-1), torch.ones(16))  # L2-normalised
    images = np.random.default_rng(0).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    codes = spec.encode(images)
    assert codes.shape == (3, 49) and int(codes.max()) < 16
    pixels = spec.decode(codes)
    assert pixels.shape == (3, 28, 28) and pixels.dtype == np.uint8
    with torch.no_grad():  # the loaded codec is the saved network
        expected = net.reconstruct(net.unit_codebook()[codes])
    assert np.abs(pixels.astype(int) - (expected * 255).round().numpy().astype(int)).max() <= 1


def test_missing_vq_weights_say_how_to_fix(tmp_path) -> None:
    save_vq(VQNet(codes=8, dim=2, width=4), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="train img-vq"):
        load_vq(tmp_path)
