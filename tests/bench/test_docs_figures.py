"""The figures the docs quote are the committed results' (tools/measured.py recomputes every marked span)."""

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
