"""Image-model fixtures for every image test: a tiny random class-conditional model over 4-level 8x8 pixels, and the
zoo's trained teacher (skipped where its weights are absent).

`tiny_image_model`: a seeded random Llama (a few k parameters) saved with an image.json and loaded back with
`fastdecode.load`, so the loader's path is the one the tests use. Layout: codes 0..3 (grey levels), classes 4..13
("0".."9"), null 14; 64 tokens per image. `tiny_image_guided` is the same folder with a default cfg_scale of 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode
from fastdecode.models.image import ImageSpec, PixelCodec, write_image_spec

DIGITS = tuple(str(i) for i in range(10))


def save_tiny_image_model(folder: Path, seed: int = 0, cfg_scale: float = 1.0, levels: int = 4) -> Path:
    spec = ImageSpec(PixelCodec(levels, (8, 8)), DIGITS, cfg_scale)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=spec.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1 + spec.tokens,
                         bos_token_id=None, eos_token_id=None, pad_token_id=spec.null_token,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharpen the random model so greedy outputs are not decided by float noise
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(folder)
    write_image_spec(spec, folder)
    return folder


@pytest.fixture(scope="session")
def tiny_image_dir(tmp_path_factory) -> Path:
    return save_tiny_image_model(tmp_path_factory.mktemp("tiny-image"))


@pytest.fixture(scope="session")
def tiny_image_model(tiny_image_dir):
    return fastdecode.load(tiny_image_dir)


@pytest.fixture(scope="session")
def tiny_image_guided(tmp_path_factory):
    return fastdecode.load(save_tiny_image_model(tmp_path_factory.mktemp("tiny-image-cfg"), cfg_scale=3.0))


@pytest.fixture(scope="session")
def img_ar():
    """The shipped zoo:img-ar teacher (skipped where its weights are absent)."""
    from importlib import resources

    folder = Path(str(resources.files("fastdecode") / "zoo" / "img-ar"))
    if not (folder / "model.safetensors").is_file():
        pytest.skip("zoo:img-ar is not trained here (fastdecode train img-ar)")
    return fastdecode.load("zoo:img-ar")
