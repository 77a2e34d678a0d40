"""The image benchmark end to end on the tiny fixture model, with a random evaluator and synthetic data (seconds)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fastdecode.bench.harness import read_rows
from fastdecode.bench.imagegen import ImageBenchConfig, ImageBenchError, run_image_bench, teacher_nll
from fastdecode.bench.summary import summarize
from fastdecode.cli import app
from fastdecode.image.evaluator import DigitCNN, Evaluator, save_evaluator

CFG = ImageBenchConfig(per_class=4, batch=4, latency_images=1, throughput_batch=4, grid_per_class=2, kid_subset=20)


def _digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 10
    images = (rng.integers(0, 4, size=(n, 8, 8)) * 85).astype(np.uint8)  # the 4 grey levels of the codec
    return images, labels


def _evaluator() -> Evaluator:
    torch.manual_seed(0)
    return Evaluator(DigitCNN())


@pytest.fixture(scope="module")
def first_run(tiny_image_model, tmp_path_factory):
    return run_image_bench(tiny_image_model, [], tmp_path_factory.mktemp("image-bench"), cfg=CFG,
                           evaluator=_evaluator(), train=_digits(60, 1), test=_digits(40, 2), command="test")


def test_a_run_writes_rows_metrics_grids_and_a_report(first_run):
    summary, tmp_path = first_run, first_run.out_dir
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["entry"] for m in metrics] == ["reference", "ar.sample", "independent"]
    base, indep = metrics[1], metrics[2]
    assert base["is_baseline"] and base["n"] == 40 and base["forwards_per_image"] == 64
    assert base["wall_s_b1"] > 0 and base["wall_s_batch"] > 0 and base["speedup_b1"] == 1.0
    assert indep["forwards_per_image"] == 0
    for m in (base, indep):
        assert np.isfinite(m["fd"]) and np.isfinite(m["kid"]) and 0 <= m["class_accuracy"] <= 1
        assert 0 <= m["precision"] <= 1 and 0 <= m["recall"] <= 1 and m["nll_per_token"] > 0
    # the model's own samples are likelier under it than codes drawn from the data's marginals
    assert base["nll_per_token"] < indep["nll_per_token"]
    rows = read_rows(tmp_path / "samples.jsonl")  # the bench's row format: `fastdecode report` reads it
    assert len(rows) == 80 and {r["new_tokens"] for r in rows} == {64}
    assert {s.method for s in summarize(rows)} == {"ar.sample", "independent"}
    for grid in summary.grids:
        assert grid.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert "| **ar.sample** (baseline) | 64.0 |" in report and "](grids/" in report


def test_seeded_runs_repeat(first_run, tiny_image_model, tmp_path):
    a = first_run
    b = run_image_bench(tiny_image_model, [], tmp_path / "b", cfg=CFG, evaluator=_evaluator(),
                        train=_digits(60, 1), test=_digits(40, 2), independent=False)
    assert a.metrics[1]["fd"] == b.metrics[1]["fd"]
    tokens = [[r["token_ids"] for r in read_rows(run.out_dir / "samples.jsonl") if r["method"] == "ar.sample"]
              for run in (a, b)]
    assert tokens[0] == tokens[1]


def test_teacher_nll_is_the_guided_models_own_likelihood(tiny_image_guided):
    """At the fixture's cfg_scale 3: the NLL of one sequence equals minus the sum of the guided log-probs computed
    position by position from the model's two rows."""
    spec = tiny_image_guided.image
    codes = torch.randint(0, spec.K, (1, spec.tokens), generator=torch.Generator().manual_seed(0))
    dev = tiny_image_guided.device
    ids_c = torch.cat([torch.tensor([[spec.class_token(3)]]), codes], 1).to(dev)
    ids_u = torch.cat([torch.tensor([[spec.null_token]]), codes], 1).to(dev)
    with torch.no_grad():
        c = tiny_image_guided.model(input_ids=ids_c).logits[0, :-1, : spec.K].cpu()
        u = tiny_image_guided.model(input_ids=ids_u).logits[0, :-1, : spec.K].cpu()
    logp = torch.log_softmax(u + 3.0 * (c - u), -1)[torch.arange(spec.tokens), codes[0]]
    assert teacher_nll(tiny_image_guided, codes.tolist(), [3], 3.0) == pytest.approx(-logp.mean().item(), rel=1e-5)


def test_text_models_and_bad_counts_are_refused(causal_dir, tmp_path):
    with pytest.raises(ImageBenchError, match="not an image model"):
        run_image_bench(str(causal_dir), [], tmp_path, cfg=CFG, evaluator=_evaluator())
    with pytest.raises(ImageBenchError, match="per_class"):
        ImageBenchConfig(per_class=2).check()


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs the image extra (scikit-learn)")
def test_the_cli_runs_a_tiny_benchmark(tiny_image_dir, tmp_path):
    """`fastdecode bench-image` on the fixture (its 8x8 digits data set) with a random evaluator saved beside it."""
    torch.manual_seed(0)
    save_evaluator(DigitCNN(), tmp_path / "judge")
    threads = torch.get_num_threads()
    try:
        done = CliRunner().invoke(app, [
            "bench-image", "--model", str(tiny_image_dir), "--methods", "ar.sample:temperature=0.5",
            "--per-class", "4", "--batch", "4", "--latency-images", "1", "--throughput-batch", "4",
            "--no-independent", "--evaluator", str(tmp_path / "judge"), "--out", str(tmp_path / "out"),
            "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert done.exit_code == 0, done.output
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["entry"] for m in metrics] == ["reference", "ar.sample", "ar.sample:temperature=0.5"]
    assert metrics[2]["params"] == {"temperature": "0.5"}
    assert "fastdecode bench-image" in metrics[1]["command"]
    assert "ar.sample:temperature=0.5:" in done.output


def test_a_method_that_refuses_batches_draws_one_image_at_a_time(tiny_image_model, tmp_path, monkeypatch):
    """A method whose generate refuses a list of several prompts: its images come one by one, each seeded, and its
    batch-64 time is left empty with the refusal recorded."""
    import fastdecode.bench.imagegen as imagegen
    from fastdecode.errors import ParameterError

    real = imagegen.generate

    def one_at_a_time(model, prompts, method, **params):
        if method == "ar.sample" and params.get("temperature") == "0.9" and len(prompts) > 1:
            raise ParameterError("this method decodes one prompt at a time")
        return real(model, prompts, method, **params)

    monkeypatch.setattr(imagegen, "generate", one_at_a_time)
    run = run_image_bench(tiny_image_model, ["ar.sample:temperature=0.9"], tmp_path, cfg=CFG, evaluator=_evaluator(),
                          train=_digits(60, 1), test=_digits(40, 2), independent=False)
    rows = [r for r in read_rows(tmp_path / "samples.jsonl") if r["entry"] == "ar.sample:temperature=0.9"]
    assert len(rows) == 40 and {r["batch"] for r in rows} == {1}
    assert len({(r["task"], r["seed"]) for r in rows}) == 40
    single = run.metrics[2]
    assert single["wall_s_batch"] is None and "one prompt at a time" in single["batch_error"]
    assert single["speedup_batch"] is None and single["wall_s_b1"] > 0
