"""The figures the docs quote are the committed results' (tools/measured.py recomputes every marked span)."""

import json
import subprocess
import sys
from pathlib import Path

from carried import NOT_CARRIED, skip_if_not_carried

ROOT = Path(__file__).resolve().parents[2]


def test_quoted_figures_match_the_committed_results(device):
    skip_if_not_carried(str(device), NOT_CARRIED[1])
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "measured.py"), "--check"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_the_docs_quote_marked_figures():
    # the check above passes vacuously if the markers disappear
    assert "<!--m readme.table-->" in (ROOT / "README.md").read_text(encoding="utf-8")
    for page, at_least in [("diffusion.md", 12), ("spec.md", 12), ("RESULTS.md", 10)]:
        assert (ROOT / "docs" / page).read_text(encoding="utf-8").count("<!--m ") >= at_least, page


def test_the_method_index_names_every_method_and_its_file():
    import inspect

    import fastdecode

    index = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    for m in fastdecode.methods():
        source = Path(inspect.getsourcefile(m.driver)).resolve().relative_to(ROOT)
        assert f"| `{m.name}` | `{source.as_posix()}` |" in index, m.name


def _measured():
    import importlib.util

    spec = importlib.util.spec_from_file_location("measured", ROOT / "tools" / "measured.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_figure_names_are_defined_once_in_one_place(tmp_path):
    import pytest

    m = _measured()
    names = m.read_names()
    assert names["readme.table"] == "readme-table" and all("|" not in n and ":" not in n for n in names)
    bad = tmp_path / "figures.txt"
    bad.write_text("# a comment\na.b = card:ar-small|mean\na.b = card:ar-tiny|mean\n")
    with pytest.raises(SystemExit, match="twice"):
        m.read_names(bad)
    bad.write_text("a b = card:ar-small|mean\n")
    with pytest.raises(SystemExit, match="NAME"):
        m.read_names(bad)
    with pytest.raises(SystemExit, match="define it in"):
        m.resolve_name("no.such.figure", names)


def test_forward_cost_writes_one_row_per_width(causal_dir, tmp_path):
    out = tmp_path / "cost.jsonl"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "forward_cost.py"), "--model", str(causal_dir),
                          "--widths", "1", "3", "--reps", "2", "--context", "5", "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["width"] for r in rows] == [1, 3]
    assert rows[0]["over_width_1"] == 1.0 and rows[1]["median_ms"] > 0 and 0 < rows[1]["matmul_share"] <= 1


def test_forward_cost_refuses_a_diffusion_model(diffusion_dir, tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "forward_cost.py"), "--model", str(diffusion_dir),
                          "--out", str(tmp_path / "x.jsonl")], capture_output=True, text=True)
    assert run.returncode != 0 and "causal" in run.stderr


def _copy_bound():
    import importlib.util

    spec = importlib.util.spec_from_file_location("copy_bound", ROOT / "tools" / "copy_bound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copy_bound_finds_the_longest_copy_after_any_occurrence():
    cb = _copy_bound()
    assert cb.copyable([5, 1, 2, 3, 9, 1, 2, 7, 1], [2, 3, 4]) == 2  # the first 1 is followed by 2 3, the second by 2 7
    assert cb.copyable([5, 1, 2, 3], [4]) == 0  # 3 occurs nowhere earlier
    assert cb.copyable([7, 8, 7], [8, 7, 8]) == 2  # a copy may run into the context's own end


def test_copy_bound_plans_drafts_by_their_cost():
    cb = _copy_bound()
    prompt, answer = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]
    flat = cb.Cost([{"width": 1, "over_width_1": 1.0}, {"width": 64, "over_width_1": 1.0}])
    # wide forwards are free: after the prompt's forward emits 1, one step drafts 2..6 and emits 2..6 (its bonus
    # token is past the answer's end)
    assert cb.best_plan(prompt, answer, flat) == (1.0, 1)
    linear = cb.Cost([{"width": 1, "over_width_1": 1.0}, {"width": 64, "over_width_1": 64.0}])
    assert cb.best_plan(prompt, answer, linear)[0] == 5.0  # w tokens cost w forwards: drafting saves nothing
    assert cb.best_plan([9], [9, 8, 7], flat) == (2.0, 2)  # 9 was followed by 9, never by 8: one token a step
    assert cb.Cost([{"width": 1, "over_width_1": 1.0}, {"width": 3, "over_width_1": 2.0}])(2) == 1.5


def test_copy_bound_reads_baseline_rows(causal, causal_dir, tmp_path):
    from fastdecode.bench.tasks import TASKS, format_prompt

    item = TASKS["lists.copy"].items(1_000_000, 1)[0]
    prompt = causal.encode(format_prompt(item.prompt))
    row = {"suite": "parallel-lists", "model": str(causal_dir), "task": "lists.copy", "seed": 1_000_000, "item": 0,
           "method": "ar.greedy", "score": 1.0, "new_tokens": 12, "forwards": 12, "wall_s": 0.1,
           "is_baseline": True, "prompt_tokens": len(prompt), "token_ids": prompt[-12:]}
    results, cost, out = tmp_path / "r.jsonl", tmp_path / "c.jsonl", tmp_path / "b.jsonl"
    results.write_text(json.dumps(row) + "\n" + json.dumps({**row, "is_baseline": False, "method": "spec.pld"}) + "\n")
    cost.write_text("".join(json.dumps({"width": w, "over_width_1": r}) + "\n" for w, r in [(1, 1.0), (16, 1.5)]))
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "copy_bound.py"), "--results", str(results),
                          "--cost", str(cost), "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (bound,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert bound["items"] == 1 and bound["speedup_bound"] > 1.5 and bound["tau_of_plan"] > 2
