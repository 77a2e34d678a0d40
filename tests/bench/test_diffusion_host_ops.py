"""tools/diffusion_host_ops.py (docs/diffusion.md "Host work per step"): one row per method, the forward's operations
apart from the step's, the step's device reads."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "diffusion_host_ops.py"


def test_a_row_counts_the_steps_operations_and_reads(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("diffusion_host_ops", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["diffusion_host_ops"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "rows.jsonl"
    module.main(["--method", "dlm.threshold", "--new-tokens", "16", "--jsonl", str(out), "--state", "now",
                 "--commit", "abc"])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["method"] == "dlm.threshold" and row["state"] == "now" and row["commit"] == "abc"
    assert row["steps"] >= 1 and row["forward_ops_per_step"] > row["ops_per_step"] > 0
    assert row["syncs_per_step"] == 1.0  # the step's one read (driver.read_step)
    assert "dlm.threshold" in capsys.readouterr().out
