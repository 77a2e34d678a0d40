"""The simulated device (tests/device_sim.py, `FASTDECODE_TEST_DEVICE=sim`): it refuses what a GPU refuses, and
computes what the CPU computes."""

from __future__ import annotations

import threading

import device_sim
import numpy as np
import pytest
import torch
from device_sim import DEVICE, SimGenerator, SimTensor, simulated

import fastdecode

MIXED = "Expected all tensors to be on the same device"


@pytest.fixture
def sim():
    with simulated():
        yield


def test_tensors_made_for_the_device_live_there_and_come_back_with_their_values(sim):
    x = torch.arange(6.0, device="cpu:0").reshape(2, 3)
    assert isinstance(x, SimTensor) and x.device == DEVICE
    assert isinstance(x * 2 + 1, SimTensor)  # results of device tensors stay there
    host = x.cpu()
    assert type(host) is torch.Tensor and host.device == torch.device("cpu")
    assert torch.equal(host, torch.arange(6.0).reshape(2, 3)) and torch.equal(x.to("cpu"), host)
    assert x.tolist() == host.tolist() and x.sum().item() == 15.0
    moved = torch.ones(3).to(DEVICE)
    assert isinstance(moved, SimTensor) and isinstance(torch.ones(3).to("cpu:0", torch.float64), SimTensor)
    assert torch.zeros(2, device=torch.device("cpu")).device == torch.device("cpu")  # the host stays the host


@pytest.mark.parametrize("mix", [
    lambda d, h: d + h,
    lambda d, h: torch.cat([d, h]),
    lambda d, h: torch.equal(d, h),
    lambda d, h: torch.index_select(d, 0, h.long()),
    lambda d, h: d.add_(h),
])
def test_a_host_tensor_beside_a_device_tensor_is_refused(sim, mix):
    with pytest.raises(RuntimeError, match=MIXED):
        mix(torch.ones(3, device="cpu:0"), torch.ones(3))


def test_what_cuda_allows_beside_a_device_tensor(sim):
    d = torch.arange(5.0, device="cpu:0")
    assert (d * torch.tensor(2.0)).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]  # a host scalar (0-dim)
    assert d[torch.tensor([1, 3])].tolist() == [1.0, 3.0]  # host indices of an indexing
    d[torch.tensor([0])] = torch.tensor(9.0, device="cpu:0")
    d.copy_(torch.arange(5.0))  # a copy between host and device
    assert d.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(TypeError, match="numpy"):
        d.numpy()
    with pytest.raises(TypeError, match="numpy"):
        np.asarray(d)


def test_views_and_in_place_writes_alias_as_on_the_cpu(sim):
    x = torch.ones(2, 3, device="cpu:0")
    x[0].mul_(0)
    assert x.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    with torch.inference_mode():  # a view of a normal tensor in inference mode (the library's decoding runs there)
        tail = x[:, -1:]
        assert tail.shape == (2, 1) and not tail.is_inference()
        made = torch.zeros(2, device="cpu:0")
    made[None].add_(1)
    assert made.tolist() == [1.0, 1.0]


def test_a_module_moved_to_the_device_computes_the_cpus_values(sim):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    want = layer(x)
    layer.to("cpu:0")
    assert all(isinstance(p, SimTensor) for p in layer.parameters())
    with pytest.raises(RuntimeError, match=MIXED):
        layer(x)  # a host input to a device module: the class of the device runs' failures
    assert torch.equal(layer(x.to(DEVICE)).cpu(), want)
    layer.weight.sum().backward()  # autograd runs on it too (the training commands)
    assert isinstance(layer.weight.grad, SimTensor) and layer.weight.grad.cpu().eq(1).all()


def test_generators_belong_to_a_device(sim):
    probs = torch.full((8,), 0.125, device="cpu:0")
    g = torch.Generator(device="cpu:0")
    assert isinstance(g, SimGenerator) and g.device == DEVICE and isinstance(g, torch.Generator)
    draws = torch.multinomial(probs, 4, generator=g.manual_seed(3))
    assert draws.tolist() == torch.multinomial(probs.cpu(), 4, generator=torch.Generator().manual_seed(3)).tolist()
    with pytest.raises(RuntimeError, match="generator"):
        torch.multinomial(probs, 4, generator=torch.Generator().manual_seed(3))  # a host generator, device probs
    with pytest.raises(RuntimeError, match="generator"):
        torch.multinomial(probs.cpu(), 4, generator=g)


def test_a_model_decodes_there_with_the_cpus_tokens(causal_dir):
    prompts = ["the quick brown fox", "def add(a, b):"]
    want = [fastdecode.generate(fastdecode.load(causal_dir, device="cpu"), prompts, m, max_new_tokens=12)
            for m in ("ar.greedy", "spec.pld")]
    with simulated():
        model = fastdecode.load(causal_dir, device="cpu:0")
        assert model.device == DEVICE and all(isinstance(p, SimTensor) for p in model.model.parameters())
        got = [fastdecode.generate(model, prompts, m, max_new_tokens=12) for m in ("ar.greedy", "spec.pld")]
    assert [[r.token_ids for r in rows] for rows in got] == [[r.token_ids for r in rows] for rows in want]


def test_it_counts_what_would_wait_for_a_gpu(sim):
    """`counting_reads`: each read of a device value, each copy to the host and each operation sized by the values;
    a non-blocking copy apart; nothing of host tensors."""
    x, host = torch.arange(6, device="cpu:0"), torch.arange(6)
    with device_sim.counting_reads() as reads:
        x.sum().item(), int(x[0]), float(x.float().mean()), bool(x[1] > 0)
        x.tolist(), x.cpu(), x.to("cpu"), torch.empty(6, dtype=torch.long).copy_(x)
        x.nonzero(), x[x > 2], x.repeat_interleave(x)
        y = x.clone()
        y[x > 2] = 0  # an assignment through a mask finds its places first (nonzero on CUDA)
        x.to("cpu", non_blocking=True)
        host.tolist(), host.sum().item(), host.nonzero()  # the host's own: no wait
        x + 1, x[host[:2]], x.argmax(), y.masked_fill(x > 2, 1), y[host[:2]]  # queued on the device: no wait
    assert dict(reads) == {"item": 4, "tolist": 1, "copy": 3, "sized": 4, "async copy": 1}


def test_the_simulation_ends_with_its_block():
    if device_sim.active():
        pytest.skip("the suite runs under the simulation (FASTDECODE_TEST_DEVICE=sim)")
    generator, compile_ = torch.Generator, torch.compile
    with simulated():
        assert torch.Generator is not generator and torch.compile is not compile_
    assert torch.Generator is generator and torch.compile is compile_
    assert type(torch.zeros(1, device="cpu:0")) is torch.Tensor


def test_threads_started_under_it_simulate_too(sim):
    """torch's function modes are per thread: the server's engine thread must see the device as the tests do."""
    seen = []
    worker = threading.Thread(target=lambda: seen.append(type(torch.ones(2).to("cpu:0"))))
    worker.start()
    worker.join()
    assert seen == [SimTensor]


def test_a_training_checkpoint_resumes_its_optimiser_beside_the_weights_on_the_device(sim, tmp_path):
    """A run resumed on a device keeps AdamW's moments there (they come back from the file on the host): found by the
    simulation; before, the first step after resuming failed on a GPU."""
    from fastdecode.train.checkpoint import load_checkpoint, save_checkpoint

    def run(steps: int, resume: bool) -> torch.nn.Linear:
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 4).to(DEVICE)
        opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
        if resume:
            assert load_checkpoint(tmp_path, {"m": layer}, {"opt": opt}, {}) is not None
            assert all(isinstance(v, SimTensor) for p in layer.parameters() for k, v in opt.state[p].items()
                       if k != "step")
        for step in range(steps):
            x = torch.full((2, 4), float(step + 1), device=DEVICE)
            opt.zero_grad()
            layer(x).square().sum().backward()
            opt.step()
        save_checkpoint(tmp_path, {"m": layer}, {"opt": opt}, {})
        return layer

    run(2, resume=False)
    resumed = run(1, resume=True)
    assert all(isinstance(p, SimTensor) for p in resumed.parameters())
