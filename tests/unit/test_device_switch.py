"""FASTDECODE_TEST_DEVICE (tests/conftest.py): the one switch that runs the suite on another device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import device_sim
import torch

import fastdecode

ROOT = Path(__file__).resolve().parents[2]


def test_loaded_and_built_models_are_on_the_switched_device(causal, causal_dir, diffusion_dir, device, to_device):
    if device_sim.active():  # FASTDECODE_TEST_DEVICE=sim: the simulated device's tensors (tests/device_sim.py)
        assert device == device_sim.DEVICE
        assert all(isinstance(p, device_sim.SimTensor) for p in causal.model.parameters())
    else:
        assert device == torch.device(os.environ.get("FASTDECODE_TEST_DEVICE", "").strip() or "cpu")
    assert causal.device.type == device.type and causal.dtype == torch.float32
    # without the fused kernels unless asked (on CUDA `load` fuses wherever its graphs are on)
    diffusion = fastdecode.load(diffusion_dir)
    assert diffusion.device.type == device.type and not diffusion.fused and not causal.fused
    assert fastdecode.load(diffusion_dir, fused=True).fused
    assert fastdecode.load(causal_dir, dtype="bfloat16").device.type == device.type  # a named dtype is kept
    assert fastdecode.load(causal_dir, dtype="bfloat16").dtype == torch.bfloat16
    built = to_device(torch.nn.Linear(2, 2))
    assert built.weight.device.type == device.type
    # a transformers ...ForCausalLM has a `.model` (its backbone) too: the whole module moves, output head included
    hf = to_device(type(causal.model)(causal.model.config))
    adapter = to_device(fastdecode.CausalLM(type(causal.model)(causal.model.config)))
    for module in (hf, adapter.model):
        assert {p.device.type for p in module.parameters()} == {device.type}


def _pytest(device: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FASTDECODE_TEST_DEVICE": device}
    test = f"{Path(__file__).relative_to(ROOT)}::test_loaded_and_built_models_are_on_the_switched_device"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_device_this_machine_lacks_skips_the_suite_with_the_reason():
    run = _pytest("cuda:99")  # no machine has a hundredth GPU
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SKIPPED [1]" in run.stdout and "FASTDECODE_TEST_DEVICE=cuda:99" in run.stdout
    assert "--device cpu" in run.stdout or "cuda:0" in run.stdout  # the loader's reason, with what to pass


def test_the_cpu_switch_runs_the_suite():
    run = _pytest("cpu")
    assert run.returncode == 0 and "SKIPPED" not in run.stdout and "failed" not in run.stdout, run.stdout + run.stderr


def test_the_simulated_switch_runs_the_suite_on_the_simulated_device():
    run = _pytest("sim")
    assert run.returncode == 0 and "SKIPPED" not in run.stdout and "failed" not in run.stdout, run.stdout + run.stderr
