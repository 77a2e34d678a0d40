"""Distilled Decoding on the tiny image model: the teacher's map is exact, training resumes, the methods run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from device_sim import simulated
from statistical.sampling_stats import chi_square_p_value  # tests/ is on the path (rootdir conftest)

import fastdecode
from fastdecode.heads import load_head
from fastdecode.heads.dd import DDNet
from fastdecode.image.dd import dd_sample, noise, teacher_map
from fastdecode.train.dd1 import DD1Training, dd1_loss, train_dd1
from fastdecode.train.dd2 import DD2Training, mixture_denoiser, train_dd2
from fastdecode.train.dd_card import write_dd_card


@pytest.fixture(scope="module")
def guided(tiny_image_guided):
    return tiny_image_guided.with_scale(tiny_image_guided.image.cfg_scale)


def exact_first_two(model, label: int) -> torch.Tensor:
    """The guided teacher's joint of the first two codes [K, K], enumerated with one forward per first code."""
    K, dev = model.image.K, model.device
    start = torch.tensor([[label]], device=dev)
    first = torch.softmax(model.forward(start, torch.zeros(1, 1, dtype=torch.long, device=dev))[0, -1, :K], -1)
    ids = torch.tensor([[label, k] for k in range(K)], device=dev)
    second = torch.softmax(model.forward(ids, torch.arange(2, device=dev).expand(K, 2))[:, -1, :K], -1)  # [K, K]
    return (first[:, None] * second).cpu()


def test_mapped_sequences_follow_the_teacher(guided) -> None:
    """4000 Gaussian draws through the teacher's map: the first code's histogram and the joint of the first two
    codes pass chi-square against the exactly enumerated guided teacher (p > 1e-3)."""
    label = guided.image.class_token(3)
    eps = noise(4000, 2, guided.image.d, torch.Generator().manual_seed(0))
    codes = teacher_map(guided, torch.full((4000,), label), eps)  # [N, 2]
    joint = exact_first_two(guided, label)
    K = guided.image.K
    assert chi_square_p_value(codes[:, 0].tolist(), joint.sum(1)) > 1e-3
    assert chi_square_p_value((codes[:, 0] * K + codes[:, 1]).tolist(), joint.flatten()) > 1e-3


def test_the_map_is_deterministic(guided) -> None:
    eps = noise(6, guided.image.tokens, guided.image.d, torch.Generator().manual_seed(1))
    labels = guided.image.K + torch.arange(6)
    assert torch.equal(teacher_map(guided, labels, eps), teacher_map(guided, labels, eps))
    with pytest.raises(ValueError, match="noise must be"):
        teacher_map(guided, labels, noise(6, guided.image.tokens + 1, guided.image.d))


def test_network_starts_from_the_teacher(guided) -> None:
    net = DDNet.for_target(guided, split=10, second=20)  # on the CPU, where DD trains, wherever the teacher is
    teacher = {k: v.cpu() for k, v in guided.model.state_dict().items()}
    assert torch.equal(net.body.layers[0].mlp.up_proj.weight, teacher["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(net.lm_head.weight, teacher["lm_head.weight"])
    assert torch.equal(net.codebook, guided.image.codebook.cpu())
    logits, vectors = net(guided.image.K + torch.arange(3), noise(3, 64, 1), torch.zeros(3, dtype=torch.long))
    assert logits.shape == (3, 64, guided.image.K) and vectors.shape == (3, 64, 1)


def test_dd1_loss_sees_data_before_t_only(guided) -> None:
    """Positions < t are given as data: the loss does not depend on the network's outputs there."""
    net = DDNet.for_target(guided, split=10, second=20)
    gen = torch.Generator().manual_seed(2)
    labels, eps = guided.image.K + torch.arange(4), noise(4, 64, 1, gen)
    codes = torch.randint(4, (4, 64), generator=gen)
    loss, parts = dd1_loss(net, labels, eps, codes, torch.full((4,), 20), 1.0)
    assert loss.requires_grad and parts["ce"] == 0.0 and parts["mse"] > 0  # split 10 < t 20: no CE position left
    loss0, parts0 = dd1_loss(net, labels, eps, codes, torch.zeros(4, dtype=torch.long), 1.0)
    assert parts0["ce"] > 0


def test_dd1_training_resumes_to_the_same_network(guided, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    cfg = DD1Training(pairs=32, eval_rows=8, steps=4, batch=8, checkpoint_every=2, warmup=1)
    whole = train_dd1(guided, tmp_path / "whole", seed=3, cfg=cfg)
    part = train_dd1(guided, tmp_path / "part", seed=3, cfg=dataclasses.replace(cfg, steps=2))
    assert part["final_loss"]["step"] == 1
    # a checkpoint left at step 2 of a 4-step run, as an interrupted run leaves it: rerun the whole command
    from fastdecode.train import ddstate

    saved = {}
    real = ddstate.save_state

    def stop_after_first(folder, modules, opts, record):
        real(folder, modules, opts, record)
        saved["step"] = record["step"]
        raise KeyboardInterrupt

    monkeypatch.setattr("fastdecode.train.dd1.save_state", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        train_dd1(guided, tmp_path / "resumed", seed=3, cfg=cfg)
    monkeypatch.setattr("fastdecode.train.dd1.save_state", real)
    resumed = train_dd1(guided, tmp_path / "resumed", seed=3, cfg=cfg)
    assert saved["step"] == 2 and resumed["final_loss"] == whole["final_loss"]
    a, b = load_head(tmp_path / "whole"), load_head(tmp_path / "resumed")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert a.config.cfg_scale == guided.image.cfg_scale and a.config.split == round(0.3 * 64)
    write_dd_card(tmp_path / "whole", {**whole, "teacher": "tiny"}, "fastdecode train dd1 ...", 1)
    card = json.loads((tmp_path / "whole" / "card.json").read_text())
    assert set(card["held_out_agreement"]) == {"1-step", "2-step"}


def test_mixture_denoiser_is_the_posterior_mean() -> None:
    codebook = torch.tensor([[0.0], [1.0], [3.0]])
    logp = torch.log(torch.tensor([0.2, 0.5, 0.3]))[None, None]  # [1, 1, 3]
    x, sigma = torch.tensor([[[0.8]]]), torch.tensor([[[0.7]]])
    w = torch.tensor([0.2, 0.5, 0.3]) * torch.exp(-(0.8 - codebook[:, 0]) ** 2 / (2 * 0.49))
    expected = (w / w.sum()) @ codebook
    assert torch.allclose(mixture_denoiser(logp, codebook, x, sigma)[0, 0], expected, atol=1e-6)


@pytest.mark.parametrize("extra", [{"norm": "position", "psi_warmup": 0, "reg_weight": 0.0},
                                   {"norm": "sample", "psi_warmup": 1, "reg_weight": 0.5, "pairs": 8}])
def test_dd2_trains_and_resumes(guided, tmp_path, monkeypatch, extra) -> None:
    """Interrupted after a checkpoint and resumed, DD2 ends where an uninterrupted run ends: with the first shipped
    recipe, and with psi's warm-up (a checkpoint falls inside it), DMD's per-sample normalisation and the
    regression term on the teacher's pairs."""
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    cfg = DD2Training(steps=2, psi_steps=1, batch=4, checkpoint_every=1, eval_rows=8, warmup=1, **extra)
    whole = train_dd2(guided, tmp_path / "whole", seed=4, cfg=cfg)
    real = __import__("fastdecode.train.dd2", fromlist=["save_state"]).save_state

    def stop(folder, modules, opts, record):
        real(folder, modules, opts, record)
        raise KeyboardInterrupt

    monkeypatch.setattr("fastdecode.train.dd2.save_state", stop)
    with pytest.raises(KeyboardInterrupt):
        train_dd2(guided, tmp_path / "resumed", seed=4, cfg=cfg)
    monkeypatch.setattr("fastdecode.train.dd2.save_state", real)
    resumed = train_dd2(guided, tmp_path / "resumed", seed=4, cfg=cfg)
    assert resumed["final"] == whole["final"] and whole["teacher_nll_per_token"] > 0
    assert (whole["final"]["reg"] > 0) == (cfg.reg_weight > 0)
    log = [json.loads(line) for line in (tmp_path / "whole" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == cfg.psi_warmup + cfg.steps and all(row["loss"] == 0 for row in log[: cfg.psi_warmup])
    net = load_head(tmp_path / "whole")
    assert isinstance(net, DDNet) and net.config.second == 0 and net.config.init == "teacher"


def test_methods_write_an_image_in_one_or_two_forwards(guided, tiny_image_guided, tmp_path) -> None:
    net = DDNet.for_target(guided, split=20, second=20, cfg_scale=guided.image.cfg_scale)
    from fastdecode.heads import save_head

    save_head(net, tmp_path / "net")
    for method, params, forwards in [("img.dd1", {"steps": 1}, 1), ("img.dd1", {"steps": 2}, 2), ("img.dd2", {}, 1)]:
        results = fastdecode.generate(tiny_image_guided, ["3", "7"], method, head=str(tmp_path / "net"), seed=5,
                                      **params)
        again = fastdecode.generate(tiny_image_guided, ["3", "7"], method, head=str(tmp_path / "net"), seed=5,
                                    **params)
        for r, s in zip(results, again, strict=True):
            assert r.stats.forwards == forwards and len(r.token_ids) == 64 and r.image.shape == (8, 8)
            assert r.token_ids == s.token_ids and max(r.token_ids) < guided.image.K
    eps = noise(2, 64, 1, torch.Generator().manual_seed(5))
    labels = torch.tensor([guided.image.label_token("3"), guided.image.label_token("7")])
    assert [r.token_ids for r in results] == dd_sample(net, labels, eps, 1).tolist()


def test_a_generator_on_a_device_seeds_the_host_noise(tiny_image_dir, tmp_path, monkeypatch) -> None:
    """DD draws its noise on the host: a run's generator on a device (the simulated one: a GPU's generator cannot
    draw host noise) seeds it, so a seeded run repeats there as on the host, and a generator passed again draws
    anew. (The noise came from torch's global RNG before, whatever the generator.)"""
    from fastdecode.heads import save_head
    from fastdecode.image import dd_methods

    drawn: list[torch.Tensor] = []
    monkeypatch.setattr(dd_methods, "noise", lambda *args: drawn.append(noise(*args)) or drawn[-1])
    with simulated():
        model = fastdecode.load(tiny_image_dir, device="cpu:0")
        save_head(DDNet.for_target(model, split=20, second=20, cfg_scale=1.0), tmp_path / "net")
        again = torch.Generator(device=model.device).manual_seed(11)
        for generator in (torch.Generator(device=model.device).manual_seed(11), again, again):
            fastdecode.generate(model, ["3", "7"], "img.dd1", head=str(tmp_path / "net"), generator=generator)
    first, second, third = drawn
    assert first.device == torch.device("cpu") and first.shape == (2, 64, model.image.d)
    assert torch.equal(first, second) and not torch.equal(second, third)


def test_methods_refuse_what_they_cannot_do(tiny_image_guided, causal, tmp_path) -> None:
    guided = tiny_image_guided.with_scale(3.0)
    from fastdecode.heads import save_head

    save_head(DDNet.for_target(guided, split=20, cfg_scale=3.0), tmp_path / "net")
    with pytest.raises(fastdecode.IncompatibleMethodError, match="distilled at cfg_scale=3"):
        fastdecode.generate(tiny_image_guided, "3", "img.dd1", head=str(tmp_path / "net"), cfg_scale=1.5)
    with pytest.raises(fastdecode.IncompatibleMethodError, match="image models only"):
        fastdecode.generate(causal, "the", "img.dd2", max_new_tokens=4)
    with pytest.raises(fastdecode.ParameterError, match="steps"):
        fastdecode.generate(tiny_image_guided, "3", "img.dd1", head=str(tmp_path / "net"), steps=3)
