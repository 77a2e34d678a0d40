"""The results file under abuse: two writers at once, repeated rows, lines that are not rows, no final newline."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from fastdecode.bench.harness import read_rows, run_bench
from fastdecode.bench.report import build_report
from fastdecode.bench.suites import BenchError, Suite
from fastdecode.errors import ResultsFileWarning

fcntl = pytest.importorskip("fcntl")

SUITE = Suite("tiny", "two items", (("lists.sort", 2),))
PARAMS = {"ar.greedy": {"max_new_tokens": 4}, "hf.greedy": {"max_new_tokens": 4}}


def bench(target, out):
    return run_bench(SUITE, target, ["hf.greedy"], out, params=PARAMS, warmup=False)


@pytest.fixture(scope="module")
def lines(target, tmp_path_factory):
    """The four JSONL lines of a clean run (2 items x ar.greedy, hf.greedy)."""
    out = tmp_path_factory.mktemp("rows") / "r.jsonl"
    bench(target, out)
    found = out.read_text().splitlines()
    assert len(found) == 4
    return found


def read_warning(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = read_rows(path)
    messages = [str(w.message) for w in caught if issubclass(w.category, ResultsFileWarning)]
    return rows, messages


def test_a_second_writer_is_refused(target, tmp_path):
    out = tmp_path / "r.jsonl"
    with out.open("a") as other:  # another bench process holds the file
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(BenchError, match=rf"{out} is being written by another process") as refused:
            bench(target, out)
        if os.path.exists("/proc/locks"):  # where the system tells who holds the lock, the message names it
            assert f"(pid {os.getpid()})" in str(refused.value)
        assert out.read_text() == ""
    assert bench(target, out).written == 4  # free again once the other writer is gone


def test_repeated_rows_are_read_once_with_a_warning(lines, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join([*lines, lines[1], lines[3]]) + "\n")  # what two writers at once left
    rows, messages = read_warning(out)
    assert len(rows) == 4
    assert len(messages) == 1 and str(out) in messages[0] and "lines 5, 6" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = build_report([out])
    assert {s.items for s in report.summaries} == {2}


def test_each_run_keeps_its_own_baseline_rows(lines, tmp_path):
    """A re-measurement appended with its own baseline (another run id) is not a repeat: the report divides each
    run's rows by that run's baseline; a baseline row repeated within one run is."""
    rows = [json.loads(line) for line in lines]
    again = []
    for row in rows:
        moved = dict(row, run="another-run")
        if row.get("is_baseline"):
            again.append(moved)
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join(json.dumps(r) for r in [*rows, *again]) + "\n")
    read, messages = read_warning(out)
    assert len(read) == 4 + len(again) and len(again) == 2 and not messages
    out.write_text("\n".join(json.dumps(r) for r in [*rows, *again, again[0]]) + "\n")
    read, messages = read_warning(out)
    assert len(read) == 6 and len(messages) == 1 and "line 7" in messages[0]


@pytest.mark.parametrize("junk", ["42", '{"suite": "tiny", "task": "lists.sort"}', '["a", "list"]', "null"])
def test_lines_that_are_not_rows_are_skipped_with_a_warning(lines, tmp_path, junk):
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join([lines[0], junk, *lines[1:]]) + "\n")
    rows, messages = read_warning(out)
    assert len(rows) == 4
    assert len(messages) == 1 and f"{out} line 2" in messages[0] and "not a result row" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert {s.items for s in build_report([out]).summaries} == {2}


def test_a_last_row_without_a_newline_is_read_and_kept(lines, target, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join(lines))  # the last complete row lacks its newline (an editor, a copy)
    rows, messages = read_warning(out)
    assert len(rows) == 4 and not messages
    summary = bench(target, out)
    assert (summary.skipped, summary.written) == (4, 0)
    out.write_text("\n".join(lines[:3]))
    summary = bench(target, out)
    assert (summary.skipped, summary.written) == (3, 1)
    assert [json.loads(line)["item"] for line in out.read_text().splitlines()] == [0, 0, 1, 1]


def test_report_refuses_folders_where_files_belong(lines, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchError, match=rf"{tmp_path} is a folder: pass a file path for the Markdown"):
        build_report([out], out=tmp_path)
    with pytest.raises(BenchError, match=rf"{tmp_path} is a folder, not a results file"):
        build_report([tmp_path])
