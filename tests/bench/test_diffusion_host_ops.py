"""tools/diffusion_host_ops.py (docs/diffusion.md "Host work per step"): one row per method, the forward's operations
apart from the step's, the step's device reads."""

from __future__ import annotations

import json

import device_sim
import pytest


@pytest.mark.skipif(device_sim.active(), reason="torch's profiler records each operation on the simulated device "
                    "twice (the wrapper's and its CPU kernel's), reads included")
def test_a_row_counts_the_steps_operations_and_reads(tmp_path, capsys, tool):
    module = tool("diffusion_host_ops")
    out = tmp_path / "rows.jsonl"
    module.main(["--model", "zoo:dlm-small", "--method", "dlm.threshold", "--new-tokens", "16", "--jsonl", str(out),
                 "--state", "now", "--commit", "abc"])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["method"] == "dlm.threshold" and row["state"] == "now" and row["commit"] == "abc"
    assert row["steps"] >= 1 and row["forward_ops_per_step"] > row["ops_per_step"] > 0
    assert row["syncs_per_step"] == 1.0  # the step's one read (driver.read_step)
    assert "dlm.threshold" in capsys.readouterr().out
