"""The demo path on tiny models, and the bench / report commands."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from carried import NOT_CARRIED, skip_if_not_carried
from typer.testing import CliRunner

from fastdecode.bench.demo import HEAD_METHODS, DemoModel, run_demo, run_demo_images, zoo_plan
from fastdecode.bench.harness import read_rows
from fastdecode.bench.suites import Suite
from fastdecode.cli import app, expand_list_options


def test_demo_runs_on_given_models(target_dir, draft_dir, diffusion_long_dir, tmp_path):
    models = [DemoModel(str(target_dir), ("ar.greedy", "hf.greedy", "hf.assisted"), draft=str(draft_dir))]
    result = run_demo(models, tmp_path, limit=1)
    rows = read_rows(result.results)
    assert {r["method"] for r in rows} == {"ar.greedy", "hf.greedy", "hf.assisted"} and len(rows) == 3 * 5
    assert result.report_path.read_text().startswith("# fastdecode benchmark report")
    assert len(result.report.plots) == 2 and all(p.parent == tmp_path and p.is_file() for p in result.report.plots)
    # a diffusion model runs its baseline through the same path; a fresh demo starts a new file
    sudoku = Suite("sudoku", "one puzzle", (("puzzles.sudoku", 1),))
    result = run_demo([DemoModel(str(diffusion_long_dir), ("dlm.baseline",))], tmp_path, suite=sudoku)
    rows = read_rows(result.results)
    assert [(r["method"], r["is_baseline"], r["params"]["block_length"]) for r in rows] == [("dlm.baseline", True, 16)]


def test_demo_plan_skips_missing_models(device):
    # the plan reads which heads are bundled from disk (a device call may carry ar-small's heads in another part)
    skip_if_not_carried(str(device), *(NOT_CARRIED[0] / "ar-small" / "heads" / kind / "model.safetensors"
                                       for kind in HEAD_METHODS.values()))
    plan, notes = zoo_plan([])
    assert plan == [] and len(notes) == 2 and all("fastdecode train" in n for n in notes)
    plan, notes = zoo_plan(["ar-small"])
    assert [m.model for m in plan] == ["zoo:ar-small"] and "hf.assisted" not in plan[0].methods
    assert any("ar-tiny" in n for n in notes)
    plan, notes = zoo_plan(["ar-small", "ar-tiny", "dlm-small"])
    assert [(m.model, m.draft) for m in plan] == [("zoo:ar-small", "zoo:ar-tiny"), ("zoo:dlm-small", None)]
    assert not notes
    expected = {"ar.greedy", "hf.greedy", "hf.prompt_lookup", "hf.assisted", "spec.pld", "spec.draft_model",
                "spec.eagle3"}  # the shipped EAGLE-3 head is bundled with ar-small
    assert expected <= set(plan[0].methods)
    assert plan[1].methods[0] == "dlm.baseline" and "dlm.threshold" in plan[1].methods


def test_bench_and_report_commands(target_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    args = ["bench", "--suite", "quick", "--model", str(target_dir), "--methods", "hf.greedy", "--limit", "1",
            "--param", "ar.greedy.max_new_tokens=4", "--param", "hf.greedy.max_new_tokens=4", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(read_rows(out)) == 2 * 5 and "hf.greedy" in result.output
    md, plots = tmp_path / "RESULTS.md", tmp_path / "plots"
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(md), "--plots", str(plots)])
    assert result.exit_code == 0, result.output
    assert f"fastdecode report {out} --out {md} --plots {plots}" in md.read_text()
    assert len(list(plots.glob("*.png"))) == 2
    # --out writes the report there instead of printing it too (issue 29): the output says only where it went
    assert "speed-up" in md.read_text() and "speed-up" not in result.output and f"wrote {md}" in result.output


def test_list_options_take_several_values():
    argv = ["fastdecode", "bench", "--methods", "a", "b", "--seeds", "1000000", "1000001", "--limit", "2", "--out", "x"]
    assert expand_list_options(argv) == ["fastdecode", "bench", "--methods", "a", "--methods", "b",
                                         "--seeds", "1000000", "--seeds", "1000001", "--limit", "2", "--out", "x"]
    assert expand_list_options(["fastdecode", "report", "a", "b"]) == ["fastdecode", "report", "a", "b"]


def test_cli_refuses_training_seeds_and_unknown_suites(target_dir, tmp_path):
    def run(*args):
        env = {**os.environ, "FASTDECODE_DEBUG": "0"}
        return subprocess.run([sys.executable, "-m", "fastdecode", *args], capture_output=True, text=True, env=env,
                              timeout=120)

    common = ["--model", str(target_dir), "--methods", "hf.greedy", "ar.greedy", "--out", str(tmp_path / "r.jsonl")]
    p = run("bench", "--suite", "quick", *common, "--seeds", "1000000", "12")
    assert p.returncode == 2 and "Seed 12 is not a test seed" in " ".join(p.stderr.split())
    assert "Traceback" not in p.stderr
    p = run("bench", "--suite", "quik", *common)
    assert p.returncode == 2 and "Did you mean 'quick'" in p.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_demo_command_prints_the_table(target_dir, tmp_path, monkeypatch):
    import fastdecode.bench.demo as demo

    plan = [DemoModel(str(target_dir), ("hf.greedy",))]
    monkeypatch.setattr(demo, "zoo_plan", lambda: (plan, ["zoo:dlm-small is not bundled (test)"]))
    grid = tmp_path / "image" / "grids" / "g.png"
    rows = [{"entry": "reference"}, {"entry": "img.dd1", "forwards_per_image": 1.0, "class_accuracy": 0.5,
                                     "speedup_b1": 18.8, "grid": "grids/g.png"}]
    images = SimpleNamespace(metrics=rows, out_dir=tmp_path / "image", report=tmp_path / "image" / "report.md")
    monkeypatch.setattr(demo, "run_demo_images", lambda out_dir, fresh: (images, []))
    result = CliRunner().invoke(app, ["demo", "--limit", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "hf.greedy" in result.output and "speed-up" in result.output and "not bundled" in result.output
    assert (tmp_path / "results.jsonl").is_file() and (tmp_path / "report.md").is_file()
    assert len(list(tmp_path.glob("*.png"))) == 2
    # the image part: one line per method with its forwards per image and its grid
    assert "img.dd1" in result.output and "18.80×" in result.output and str(grid.name) in result.output


def test_demo_skips_the_images_without_the_image_model(tmp_path):
    images, notes = run_demo_images(tmp_path, available=["ar-small"])
    assert images is None and "fastdecode train img-ar" in notes[0] and not (tmp_path / "image").exists()
