"""tools/spec_host_time.py (docs/gpu.md "Host work per step"): the host time of a target forward outside the graphs'
bodies, steady and over a stream of requests, with the full collections of the garbage collector."""

from __future__ import annotations

import json

from fastdecode.models.graphs import Graphs


def test_rows_of_both_figures_and_the_graphs_left_as_they_were(tmp_path, capsys, tool):
    module = tool("spec_host_time")
    replay = Graphs._replay
    out = tmp_path / "rows.jsonl"
    module.main(["--label", "now", "--methods", "ar.greedy", "spec.pld", "--items", "1", "--short", "2", "--long",
                 "10", "--repeats", "1", "--stream", "1", "--commit", "abc", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["figure"], r["method"]) for r in rows] == [
        ("steady", "ar.greedy"), ("steady", "spec.pld"), ("stream", "ar.greedy"), ("stream", "spec.pld")]
    assert all(r["commit"] == "abc" and r["gc"] == "on" and r["label"] == "now" for r in rows)
    steady, stream = rows[0], rows[2]
    assert steady["target_forwards"] == 8 and len(steady["rounds"]) == 1  # 10 new tokens less 2, one a forward
    # the host's share of a forward is small beside the replayed forward on this CPU (~10 ms), and never all of it
    assert 0 < stream["host_ms_per_forward"] < 10 and stream["full_collections"] >= 0
    assert Graphs._replay is replay  # the clock put the graphs' methods back
    assert "spec.pld" in capsys.readouterr().out
