"""Shared fixtures: tiny randomly initialised fp32 models saved as Hugging Face folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode
from fastdecode.models.mdlm import MDLMConfig, MDLMForMaskedDiffusion
from fastdecode.train.tokenizer import train_tokenizer

# the tiny random models have no trained heads: methods that decode with one (spec.medusa, ...) get a seeded random
# head of the kind they ask for, with which a lossless method must still be lossless (heads.io.untrained_heads_allowed)
os.environ["FASTDECODE_UNTRAINED_HEADS"] = "1"
torch.set_num_threads(1)  # tiny models run fastest on one thread, and tests then leave a core free

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "Sort this waiting line alphabetically by last name: [\"Ann Lee\", \"Bob Moss\"]",
    "def add(a, b):\n    return a + b\n",
    "0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz",
] * 4


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=320)


def tiny_llama_config(vocab_size: int, **overrides) -> LlamaConfig:
    cfg = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False,
    )
    cfg.update(overrides)
    return LlamaConfig(**cfg)


def save_causal(folder: Path, tokenizer, seed: int = 0, **overrides) -> Path:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer), **overrides)).eval()
    # sharpen the random model so greedy outputs are not decided by float noise
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 2
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_diffusion(folder: Path, tokenizer, seed: int = 0, **overrides) -> Path:
    torch.manual_seed(seed)
    shape = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, mask_token_id=3,
        bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    cfg = MDLMConfig(**{**shape, **overrides})
    MDLMForMaskedDiffusion(cfg).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def save_causal_model():
    """`save_causal` for conftests of sub-folders, which cannot import this module by name."""
    return save_causal


@pytest.fixture(scope="session")
def save_diffusion_model():
    return save_diffusion


@pytest.fixture(scope="session")
def causal_dir(tmp_path_factory, tokenizer) -> Path:
    return save_causal(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def diffusion_dir(tmp_path_factory, tokenizer) -> Path:
    return save_diffusion(tmp_path_factory.mktemp("tiny-mdlm"), tokenizer)


@pytest.fixture(scope="session")
def causal(causal_dir):
    return fastdecode.load(causal_dir)


@pytest.fixture(scope="session")
def diffusion(diffusion_dir):
    return fastdecode.load(diffusion_dir)
