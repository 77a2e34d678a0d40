"""A report row's tokens/s, baseline tokens/s and speed-up agree: speed-up = the one ÷ the other, both pooled the
same way, whatever the file's other runs measured (issue #29: a row showed 49 vs 111 tokens/s and "1.10×")."""

from __future__ import annotations

import json

import pytest

from fastdecode.bench.report import build_report


def _row(method: str, run: str, item: int, wall: float) -> dict:
    return {"suite": "s", "task": "t", "item": item, "seed": 1000000, "method": method, "model": "m", "params": {},
            "score": 1.0, "new_tokens": 100, "forwards": 100, "wall_s": wall, "is_baseline": method == "ar.greedy",
            "run": run}


def _cells(markdown: str, label: str) -> list[str]:
    line = next(x for x in markdown.splitlines() if x.startswith(f"| {label}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_rows_speed_up_is_its_tokens_per_s_over_the_baseline_tokens_per_s_it_shows(tmp_path):
    # run r1 on a busy machine (baseline 25 tokens/s), run r2 on a quiet one (baseline 100 tokens/s) adds spec.pld
    # at 110 tokens/s: pooled over both runs the baseline is 40 tokens/s, against which 110 would read 2.75x
    rows = [_row("ar.greedy", "r1", 0, 4.0), _row("ar.greedy", "r1", 1, 4.0), _row("spec.ngram", "r1", 0, 2.0),
            _row("spec.ngram", "r1", 1, 2.0),
            _row("ar.greedy", "r2", 0, 1.0), _row("ar.greedy", "r2", 1, 1.0), _row("spec.pld", "r2", 0, 100 / 110),
            _row("spec.pld", "r2", 1, 100 / 110)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report([path])
    by = {s.method: s for s in report.summaries}
    assert by["ar.greedy"].tokens_per_s == pytest.approx(40.0)  # every run of the file
    assert by["spec.pld"].baseline_tokens_per_s == pytest.approx(100.0)  # its own run's
    assert by["spec.pld"].speedup == pytest.approx(1.1) and by["spec.ngram"].speedup == pytest.approx(2.0)
    header = _cells(report.markdown, "method")
    tps, base, speedup = (header.index(c) for c in ("tokens/s", "baseline tokens/s (same runs)", "speed-up"))
    for label in ("**ar.greedy** (baseline)", "spec.pld", "spec.ngram"):
        cells = _cells(report.markdown, label)
        shown = float(cells[tps]) / float(cells[base])
        assert float(cells[speedup].rstrip("×")) == pytest.approx(shown, abs=0.01), label
    assert _cells(report.markdown, "spec.pld")[tps:speedup + 1] == ["110.0", "100.0", "1.10×"]
    assert "baseline tokens/s (same runs)" in report.markdown.split("## ")[0]  # the caption says how


def test_a_parameter_at_its_default_names_the_same_configuration_as_one_left_out():
    # rows record every parameter today and recorded only those a run set before: both are one configuration, so a
    # file holding both kinds of rows shows one `spec.pld` line, not two labelled by parameters nobody changed
    from fastdecode.bench.summary import config_id, method_defaults

    defaults = method_defaults("spec.pld")
    assert defaults["num_tokens"] == 10 and defaults["attention"] == "dense"
    old, new = _row("spec.pld", "r1", 0, 1.0), _row("spec.pld", "r2", 0, 1.0)
    new["params"] = {"num_tokens": 10, "attention": "dense", "repetition_penalty": 1.0}
    assert config_id(old) == config_id(new)
    changed = {**new, "params": {**new["params"], "num_tokens": 5}}
    assert config_id(changed) != config_id(old)
    # a method this version does not know keeps the parameters it recorded
    assert config_id({**old, "method": "spec.gone", "params": {"a": 1}})[1] == '{"a": 1}'
