"""tools/canvas_graph_replays.py: the share of a diffusion method's forwards that the canvas graphs replay (on the
tool's model, zoo:dlm-small)."""

from __future__ import annotations

import json


def test_rows_count_every_forward_and_buckets_capture_no_more(tmp_path, tool):
    module = tool("canvas_graph_replays")
    out = tmp_path / "rows.jsonl"
    module.main(["--out", str(out), "--limit", "1", "--methods", "dlm.threshold", "--suite", "puzzles"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["buckets"] for r in rows] == [[16, 8], [1, 1]]
    for r in rows:
        assert r["forwards"] == r["eager"] + r["captures"] + r["replays"] and r["replays"] > 0
        assert r["rows"] == 4  # 2 tasks, 1 item each, the method's rows and dlm.baseline's
    bucketed, plain = rows
    assert bucketed["forwards"] == plain["forwards"]  # the same generations: the padding changes no step
    assert bucketed["captures"] <= plain["captures"] and bucketed["replayed"] >= plain["replayed"]
