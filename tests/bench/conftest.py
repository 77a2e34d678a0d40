"""Tiny causal models with room for the code task's long prompts (the shared fixture has 128 positions)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastdecode


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory, tokenizer, save_causal_model) -> Path:
    return save_causal_model(tmp_path_factory.mktemp("bench-target"), tokenizer, seed=0, max_position_embeddings=1024)


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory, tokenizer, save_causal_model) -> Path:
    """Same tokenizer, other weights: a drafter the target mostly rejects."""
    return save_causal_model(tmp_path_factory.mktemp("bench-draft"), tokenizer, seed=1, max_position_embeddings=1024)


@pytest.fixture(scope="session")
def target(target_dir):
    return fastdecode.load(target_dir)


@pytest.fixture(scope="session")
def draft(draft_dir):
    return fastdecode.load(draft_dir)


@pytest.fixture(scope="session")
def diffusion_long_dir(tmp_path_factory, tokenizer, save_diffusion_model) -> Path:
    return save_diffusion_model(tmp_path_factory.mktemp("bench-mdlm"), tokenizer, max_position_embeddings=1024)


@pytest.fixture
def tool():
    """`tool(NAME)`: the module of `tools/NAME.py`, imported by path (tools are scripts, not a package); registered in
    `sys.modules` under NAME, where dataclasses look their module up."""
    import importlib.util
    import sys

    def load(name: str):
        path = Path(__file__).resolve().parents[2] / "tools" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return load
