"""The report's plots on a hand-made results file (issue #29, "Plots a reader can use"): coinciding points stay
visible, speed-ups carry the spread of their runs, a long name does not push the axes off the figure, and a
long-context file is plotted against the budget rather than tokens per forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from fastdecode.bench.plots import offsets, row_budget, run_speedups, wrap  # noqa: E402
from fastdecode.bench.report import build_report  # noqa: E402

LONG = "spec.draft_model (draft_length=8, temperature=0.0, a parameter with a very long value indeed)"


def _row(method: str, run: str, item: int, wall: float, suite: str = "s", **extra) -> dict:
    return {"suite": suite, "task": "t", "item": item, "seed": 0, "method": method, "model": "m",
            "params": extra.pop("params", {}), "score": extra.pop("score", 1.0), "new_tokens": 100,
            "forwards": extra.pop("forwards", 100), "wall_s": wall, "is_baseline": method == "ar.greedy", "run": run,
            **extra}


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_coinciding_points_are_drawn_apart_and_lone_points_stay_put():
    shifts = offsets([(1.0, 50.0), (1.0, 50.0), (1.0, 50.0), (2.0, 90.0)])
    assert shifts[3] == (0.0, 0.0)
    assert len(set(shifts[:3])) == 3 and all(s != (0.0, 0.0) for s in shifts[:3])


def test_long_labels_are_wrapped_and_cut():
    text = wrap(LONG)
    assert all(len(line) <= 28 for line in text.splitlines()) and len(text.splitlines()) <= 3
    assert text.endswith("…") and wrap("spec.pld") == "spec.pld"


def test_speedups_per_run_give_the_spread(tmp_path):
    # two runs: baseline 100 then 50 tokens/s; spec.pld 150 then 100: per-run 1.5x and 2.0x
    rows = [_row("ar.greedy", "r1", 0, 1.0), _row("spec.pld", "r1", 0, 100 / 150),
            _row("ar.greedy", "r2", 0, 2.0), _row("spec.pld", "r2", 0, 1.0)]
    for r in rows:
        r["_source"] = "f"
    assert sorted(run_speedups(rows)["spec.pld"]) == pytest.approx([1.5, 2.0])
    assert run_speedups(rows)["ar.greedy"] == pytest.approx([1.0, 1.0])


def test_report_plots_a_file_with_coinciding_points_a_long_name_and_several_runs(tmp_path):
    rows = []
    for i, (run, base_wall) in enumerate((("r1", 1.0), ("r2", 1.3))):
        rows += [_row("ar.greedy", run, i, base_wall), _row("spec.pld", run, i, 0.8, forwards=50),
                 _row("spec.ngram", run, i, 0.7, forwards=50),  # the same accuracy and TPF as spec.pld
                 _row("spec.draft_model", run, i, 0.9, forwards=40,
                      params={"draft_length": 8, "note": "a parameter with a very long value indeed"}),
                 _row("spec.draft_model", run, i, 0.6, forwards=40, params={"draft_length": 4, "note": "x"})]
    report = build_report([_write(tmp_path, rows)], plots_dir=tmp_path / "plots")
    by = {s.label: s for s in report.summaries}
    assert by["spec.pld"].speedup is not None
    names = sorted(p.name for p in report.plots)
    assert names == ["frontier-s-m.png", "speedup-s-m.png"]
    assert all(p.stat().st_size > 1000 for p in report.plots)
    from PIL import Image

    for p in report.plots:  # the figure grows to hold the outside legend, never wider than a page
        width, height = Image.open(p).size
        assert 600 < width < 1600 and height < 1400


def test_a_longctx_file_is_plotted_against_the_budget(tmp_path):
    rows = [_row("ar.greedy", "r1", i, 1.0, suite="longctx", score=1.0, kv_read_bytes_per_token=6e7)
            for i in range(2)]
    for budget, score, read in ((64, 0.5, 1e7), (256, 1.0, 2.5e7)):
        for method in ("sparse.quest", "sparse.snapkv"):  # the two rules coincide at every budget
            rows += [_row(method, "r1", i, 0.8, suite="longctx", score=score, params={"budget": budget},
                          kv_read_bytes_per_token=read) for i in range(2)]
    report = build_report([_write(tmp_path, rows)], plots_dir=tmp_path / "plots")
    assert sorted(p.name for p in report.plots) == ["budget-longctx-m.png", "speedup-longctx-m.png"]
    assert not any(p.name.startswith("frontier") for p in report.plots)


def test_a_rows_budget_comes_from_its_parameters_its_attention_spec_or_the_rules_default():
    assert row_budget({"method": "sparse.quest", "params": {"budget": 64}}) == 64
    assert row_budget({"method": "ar.greedy", "params": {"attention": "quest:budget=128"}}) == 128
    assert row_budget({"method": "sparse.quest", "params": {}}) == 256
    assert row_budget({"method": "ar.greedy", "params": {}}) is None
