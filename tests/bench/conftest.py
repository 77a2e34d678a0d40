"""Tiny causal models with room for the code task's long prompts (the shared fixture has 128 positions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode


def save_long_causal(folder: Path, tokenizer, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharpen, so greedy outputs are not decided by float noise
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 2
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory, tokenizer) -> Path:
    return save_long_causal(tmp_path_factory.mktemp("bench-target"), tokenizer, seed=0)


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory, tokenizer) -> Path:
    """Same tokenizer, other weights: a drafter the target mostly rejects."""
    return save_long_causal(tmp_path_factory.mktemp("bench-draft"), tokenizer, seed=1)


@pytest.fixture(scope="session")
def target(target_dir):
    return fastdecode.load(target_dir)


@pytest.fixture(scope="session")
def draft(draft_dir):
    return fastdecode.load(draft_dir)


@pytest.fixture(scope="session")
def diffusion_long_dir(tmp_path_factory, tokenizer) -> Path:
    from fastdecode.models.mdlm import MDLMConfig, MDLMForMaskedDiffusion

    torch.manual_seed(0)
    cfg = MDLMConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=1024, mask_token_id=3, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )
    folder = tmp_path_factory.mktemp("bench-mdlm")
    MDLMForMaskedDiffusion(cfg).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
