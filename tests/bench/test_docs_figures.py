"""The figures the docs quote are the committed results' (tools/measured.py recomputes every marked span)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quoted_figures_match_the_committed_results():
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "measured.py"), "--check"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_the_docs_quote_marked_figures():
    # the check above passes vacuously if the markers disappear
    text = (ROOT / "README.md").read_text(encoding="utf-8") + (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert "<!--m readme-table-->" in text
    assert text.count("<!--m dlm:") >= 12


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
