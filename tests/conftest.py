"""Shared fixtures: tiny randomly initialised fp32 models saved as Hugging Face folders.

`FASTDECODE_TEST_DEVICE` (default cpu) is the one switch that runs the suite on another device, e.g. cuda: every
model the tests load without naming a device goes there, in float32 (`load` defaults to bfloat16 on CUDA, which the
token-for-token tests do not assume) and without the fused kernels unless a test asks for them, and the `to_device`
fixture moves a model a test builds itself (a draft, a head) to the same device. Asked for a device this machine
lacks, the suite is skipped with the reason. `FASTDECODE_TEST_DEVICE=sim` runs it on a simulated accelerator, the CPU
under the name cpu:0 refusing what a GPU refuses (a host tensor beside a device one, a host generator for the
device's sampling: tests/device_sim.py), which is how tools/gpu_dry_run.sh rehearses the device's suite.

On another device, a test that fails because a file of the zoo (weights) or of docs/results is absent from the
checkout is skipped with that file named: a call to a lent GPU carries at most 64 MiB, so the zoo travels there a few
models at a time (tools/gpu_run.sh, one part per set of weights). On the CPU such a test fails as ever: there a missing
file is a broken checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

import device_sim  # tests/ is on the path
import pytest
import torch
from carried import skip_when_not_carried
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode
from fastdecode.errors import DeviceError
from fastdecode.models import loading, native
from fastdecode.models.mdlm import MDLMConfig, MDLMForMaskedDiffusion
from fastdecode.train.tokenizer import train_tokenizer

# pytest-xdist's workers set COLUMNS=80 (and LINES) for their terminal, and the CLI takes COLUMNS as the width of a
# pipe (fastdecode/cli.py `_console`, made when the CLI is first imported, after this): its paths and tables would
# wrap at 80 columns there and not in a plain run. The suite runs without them, under xdist (the device run's
# workers, tools/gpu_parts.py) as in CI; a test of COLUMNS sets it itself.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# the tiny random models have no trained heads: methods that decode with one (spec.medusa, ...) get a seeded random
# head of the kind they ask for, with which a lossless method must still be lossless (heads.io.untrained_heads_allowed)
os.environ["FASTDECODE_UNTRAINED_HEADS"] = "1"
torch.set_num_threads(1)  # tiny models run fastest on one thread, and tests then leave a core free

DEVICE_VARIABLE = "FASTDECODE_TEST_DEVICE"
SIMULATED = "sim"  # the value that runs the suite on tests/device_sim.py's simulated device


def simulated() -> bool:
    return os.environ.get(DEVICE_VARIABLE, "").strip() == SIMULATED


def test_device() -> str:
    """The device the suite runs on: `FASTDECODE_TEST_DEVICE`, default cpu (`sim`: the simulated device's name)."""
    if simulated():
        return str(device_sim.DEVICE)
    return os.environ.get(DEVICE_VARIABLE, "").strip() or "cpu"


if simulated():
    device_sim.install()  # at import, in each xdist worker too: before any test makes a tensor


def missing_device(name: str) -> str | None:
    """Why the suite cannot run on `name` here (None: it can)."""
    try:
        loading.pick_device(name)
    except DeviceError as e:
        return f"{DEVICE_VARIABLE}={name}: {e}"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    why = missing_device(test_device())
    if why is not None:
        skip = pytest.mark.skip(reason=why)
        for item in items:
            item.add_marker(skip)


def pytest_report_header(config) -> str:
    what = " (simulated: tests/device_sim.py)" if simulated() else ""
    return f"fastdecode test device: {test_device()}{what} ({DEVICE_VARIABLE})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from skip_when_not_carried(test_device()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from skip_when_not_carried(test_device()))


@pytest.fixture(scope="session", autouse=True)
def _models_on_the_test_device():
    """`load` without a device or dtype gives the test device in float32 (one place: what `load` picks by
    default); a test that names a device or dtype gets what it names."""
    if missing_device(test_device()) is not None:
        yield
        return
    picked = loading.pick_device_dtype
    device = test_device()

    def on_test_device(dev, dtype):
        return picked(device if dev is None else dev, torch.float32 if dtype is None and dev is None else dtype)

    loading.pick_device_dtype = on_test_device
    # and unfused unless asked (`fused=True`, `fuse()`): the fused kernels round as they do, and the tests that compare
    # a graphed model with an eager one assume one setting (tests/invariants/test_*_fused.py ask for them)
    default = native.fused_default
    native.fused_default = lambda device, graphs: False
    try:
        yield
    finally:
        loading.pick_device_dtype = picked
        native.fused_default = default


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The test device (`FASTDECODE_TEST_DEVICE`)."""
    return torch.device(test_device())


@pytest.fixture(scope="session")
def to_device(device):
    """Move a module (or a model adapter's module) a test builds itself to the test device; returns it.
    A torch module moves whole: a transformers `...ForCausalLM` has a `.model` too (its backbone, without the
    output head), so only a non-module (an adapter) is unwrapped."""
    def move(obj):
        module = obj if isinstance(obj, torch.nn.Module) else obj.model
        module.to(device)
        return obj
    return move


@pytest.fixture(scope="session")
def load_model():
    """`fastdecode.load` on the test device (float32 unless a dtype is named)."""
    def load(source, **kwargs):
        return fastdecode.load(source, **kwargs)
    return load

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


@pytest.fixture(scope="module")
def sim_model(causal_dir, device):
    """The tiny causal model on the simulated device (`device_sim`: a GPU's code paths on the CPU); a test runs it
    under `device_sim.simulated()`. Skipped where the suite runs on a real device."""
    if device.type != "cpu":
        pytest.skip("the simulation runs on the CPU")
    with device_sim.simulated():
        return fastdecode.load(causal_dir, device="cpu:0")


@pytest.fixture(scope="session")
def diffusion(diffusion_dir):
    return fastdecode.load(diffusion_dir)


@pytest.fixture
def cli_main(monkeypatch):
    """`cli_main(*args)`: `fastdecode ARGS` as the console script runs it, in this process (no second torch
    start-up); returns the exit code. Output goes to capsys/capfd as usual."""
    import sys
    import warnings

    from fastdecode import cli

    def run(*args: str, debug: bool = False) -> int:
        monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() installs its own
        monkeypatch.setattr(sys, "argv", ["fastdecode", *args])
        monkeypatch.setenv("FASTDECODE_DEBUG", "1" if debug else "0")
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        return int(exit_.value.code or 0)

    return run
