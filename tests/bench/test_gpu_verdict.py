"""tools/gpu_verdict.py: issue #30's "done when" read from a device run's files, on the committed H200 run and on
small made-up folders (rows from the CPU never count; a pytest log cut before its summary is not a pass)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from carried import skip_if_not_carried

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "results" / "gpu" / "2026-11-27"


@pytest.fixture
def verdict(tool):
    return tool("gpu_verdict")


def by_target(found) -> dict:
    return {v.target: v for v in found}


def test_the_committed_h200_run(verdict, device):
    skip_if_not_carried(str(device), RUN)
    found = by_target(verdict.verdicts([RUN], verdict.lossless_methods()))
    same = found["zoo bf16: every lossless method identical"]
    # docs/gpu.md's second run: the two tree methods left ar.greedy on one code item each; the heads were not run
    assert same.met is False and "spec.recycling 16/17" in same.figures and "spec.rsd 16/17" in same.figures
    assert "no rows: spec.sparse_self" in same.figures and "NVIDIA H200" in same.figures
    assert found["zoo bf16: ar.greedy ≥ hf.greedy"].met is True
    assert "code 4.13×" in found["zoo bf16: ar.greedy ≥ hf.greedy"].figures
    speed = found["1.1B: ar.greedy ≥ 3× hf.greedy"]
    assert speed.met is False and "ar.greedy:fused=true (the default) 2.89×" in speed.figures
    assert found["1.1B: spec.suffix identical"].met is True
    # that run's suite was cut before its summary (its log is not kept), but its failures file was
    tests = found["suite with FASTDECODE_TEST_DEVICE=cuda"]
    assert tests.met is False and "pytest-failures.txt: 135 failures" in tests.figures
    prompts = found["bf16: new prompts keep their per-token time"]
    assert prompts.met is True and "1.74–2.07 (1.19×" in prompts.figures
    dtypes = found["bf16 at least as fast as float32"]  # ar.greedy ran in bfloat16 alone there
    assert dtypes.met is False and "ar.greedy on zoo:ar-small: not in both dtypes" in dtypes.figures
    assert "dlm.baseline on zoo:dlm-small: 63.8 against 90.0 tokens/s (0.71×)" in dtypes.figures


def row(method: str, equal: bool = True, device: str = "cuda:0", **params) -> dict:
    return {"suite": "code", "task": "code.complete", "item": 0, "seed": 0, "method": method, "params": params,
            "model": "zoo:ar-small", "is_baseline": method == "ar.greedy", "equal_to_baseline": equal,
            "score": 1.0, "new_tokens": 10, "forwards": 10, "wall_s": 0.3 if method == "hf.greedy" else 0.1,
            "run": "r1",
            "machine": {"device": device, "device_name": "Test GPU"}}


def write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rows_map_to_their_entries_and_cpu_rows_do_not_count(verdict, tmp_path):
    specs = ["spec.suffix", "spec.suffix:tree=true", "hf.greedy"]
    assert verdict.spec_of(row("spec.suffix", tree=False), specs) == "spec.suffix"
    assert verdict.spec_of(row("spec.suffix", tree=True), specs) == "spec.suffix:tree=true"
    assert verdict.spec_of(row("spec.suffix"), specs) == "spec.suffix"  # the method's default: no tree
    assert verdict.spec_of(row("spec.pld"), specs) is None
    write(tmp_path / "a", "zoo-bfloat16.jsonl", [row("ar.greedy"), row("hf.greedy", equal=False),
                                                 row("spec.suffix", tree=False), row("spec.suffix", tree=True)])
    found = verdict.identical([tmp_path / "a"], specs)
    assert found.met is True and "2 of 2 identical" in found.figures and "hf.greedy 0/1" in found.figures
    speed = verdict.zoo_speed([tmp_path / "a"])
    assert speed.met is True and "code 3.00×" in speed.figures
    write(tmp_path / "b", "zoo-bfloat16.jsonl", [row("ar.greedy", device="cpu"), row("spec.suffix", device="cpu")])
    assert verdict.identical([tmp_path / "b"], specs).met is None
    # a method of the list with no rows is not measured, one unequal item is not met
    write(tmp_path / "c", "zoo-bfloat16.jsonl", [row("ar.greedy"), row("spec.suffix", equal=False)])
    assert verdict.identical([tmp_path / "c"], specs).met is False
    write(tmp_path / "d", "zoo-bfloat16.jsonl", [row("ar.greedy"), row("spec.suffix")])
    assert verdict.identical([tmp_path / "d"], specs).met is None


def test_engine_target_is_the_default_setting(verdict, tmp_path):
    rows = [{**row("ar.greedy"), "wall_s": 0.12}, row("hf.greedy", equal=False), row("spec.suffix:fused=true"),
            {**row(verdict.DEFAULT), "wall_s": 0.11}, {**row("ar.greedy:fused=true,grouped=true"), "wall_s": 0.09}]
    write(tmp_path, "engine.jsonl", rows)
    speed, suffix = verdict.engine([tmp_path])
    # 0.3 / 0.11: under 3x; the grouped attention clears it but is not the default
    assert speed.met is False and "2.73×" in speed.figures
    assert speed.figures.endswith("not the default: ar.greedy:fused=true,grouped=true (Test GPU)")
    assert suffix.met is True and "spec.suffix:fused=true 1/1" in suffix.figures


def test_the_suite_passes_only_when_its_log_reached_its_summary_with_nothing_failed(verdict, tmp_path):
    # each call's archive unpacked into its own folder under the run's; the last call's holds the suite's log
    for part in ("ar", "dlm", "rest"):
        (tmp_path / part).mkdir()
    assert verdict.suite([tmp_path]).met is None  # no call ran the suite
    log = tmp_path / "rest" / "pytest.txt"
    log.write_text("...\n")  # cut by its time limit before the summary
    found = verdict.suite([tmp_path])
    assert found.met is None and "rest/pytest.txt: stopped before its end (a time limit)" in found.figures
    # stopped by SIGINT at the limit, pytest still prints the counts of what it ran: the script's line says so
    log.write_text(f"....\n2000 passed, 3 skipped in 239.80s\n{verdict.STOPPED[0]} of 240 s\n")
    assert verdict.pytest_counts(log) is None and verdict.suite([tmp_path]).met is None
    log.write_text("....\n2000 passed in 239.80s\nTraceback (most recent call last):\nKeyboardInterrupt\n")
    assert verdict.pytest_counts(log) is None
    # a failure before the cut is written as it comes (tools/pytest_failures.py)
    failures = tmp_path / "rest" / "pytest-failures.txt"
    failures.write_text("=== tests/t.py::test_a (call)\nE   assert 1 == 2\n")
    found = verdict.suite([tmp_path])
    assert found.met is False and "rest/pytest-failures.txt: 1 failures" in found.figures
    failures.unlink()
    log.write_text("..F\n1 failed, 20 passed in 9.0s\n")
    assert verdict.suite([tmp_path]).met is False
    log.write_text("....\n===== 700 passed, 40 skipped, 3 warnings in 150.20s =====\n")
    found = verdict.suite([tmp_path / "ar", tmp_path / "dlm", tmp_path / "rest"])
    assert found.met is True and "pytest.txt: 700 passed, 40 skipped" in found.figures


def junit(path: Path, cases: dict[str, str]) -> None:
    """A pytest JUnit file with one test case per name: passed, failed, skipped or carried."""
    body = {"passed": "", "failed": '<failure message="boom"/>', "skipped": '<skipped message="no CUDA device"/>',
            "carried": '<skipped message="/x/zoo/dlm-small/model.safetensors is not in this checkout (...)"/>',
            "results": '<skipped message="/x/docs/results/gpu is not in this checkout (...)"/>'}
    path.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest">' + "".join(
        f'<testcase classname="tests.t" name="{name}">{body[outcome]}</testcase>' for name, outcome in cases.items())
        + "</testsuite></testsuites>")


def test_a_test_skipped_for_weights_that_were_not_there_leaves_the_suite_open(verdict, tmp_path):
    # a machine that went cold before the last call: that run skipped the tests of the earlier calls' weights
    for run in ("cold", "later"):
        (tmp_path / run).mkdir()
    (tmp_path / "cold" / "pytest.txt").write_text("...\n3 passed, 3 skipped in 1.0s\n")
    junit(tmp_path / "cold" / "pytest.xml", {"a": "passed", "b": "carried", "c": "carried", "d": "skipped",
                                             "f": "results"})
    found = verdict.suite([tmp_path])
    assert found.met is None and "2 tests skipped for weights that were not there (tests.t::b, tests.t::c)" \
        in found.figures
    assert "1 read only the committed results" in found.figures
    # a later session's run with those weights there: each test ran in one of them
    (tmp_path / "later" / "pytest.txt").write_text("...\n2 passed in 1.0s\n")
    junit(tmp_path / "later" / "pytest.xml", {"b": "passed", "c": "passed"})
    assert verdict.suite([tmp_path]).met is True  # a test of the committed results alone does not hold it open
    assert verdict.outcomes(tmp_path / "cold" / "pytest.xml") == {
        "tests.t::a": "passed", "tests.t::b": "carried", "tests.t::c": "carried", "tests.t::d": "skipped",
        "tests.t::f": "results"}
    junit(tmp_path / "later" / "pytest.xml", {"c": "failed"})
    assert verdict.outcomes(tmp_path / "later" / "pytest.xml") == {"tests.t::c": "failed"}


def test_new_prompts_and_the_two_dtypes(verdict, tmp_path):
    def item(i: int, wall: float, run: str = "r1", **kw) -> dict:
        return {**row("ar.greedy"), "item": i, "new_tokens": 160, "wall_s": wall, "run": run, **kw}

    # one run whose third new prompt is 10 times slower a token (the cuDNN planning), one that keeps its time
    write(tmp_path / "a", "zoo-bfloat16.jsonl", [item(0, 0.3), item(1, 0.32), item(2, 3.0)])
    write(tmp_path / "b", "zoo-bfloat16.jsonl", [item(0, 0.3, "r2"), item(1, 0.33, "r2"),
                                                 item(2, 0.4, "r2", suite="lists")])
    assert verdict.new_prompts([tmp_path / "a", tmp_path / "b"]).met is False  # the worst run counts
    kept = verdict.new_prompts([tmp_path / "b"])
    assert kept.met is True and "1.88–2.06 (1.10×" in kept.figures
    assert verdict.new_prompts([tmp_path / "c"]).met is None
    write(tmp_path / "b", "zoo-float32.jsonl", [item(0, 0.5, "r3")])
    one = verdict.dtypes([tmp_path / "b"])  # the diffusion baseline not measured: not yet met
    assert one.met is None and "ar.greedy on zoo:ar-small: 466.0 against 320.0 tokens/s (1.46×)" in one.figures
    assert "dlm.baseline on zoo:dlm-small: not in both dtypes" in one.figures
    dlm = {**row("dlm.baseline"), "model": "zoo:dlm-small", "suite": "parallel-lists"}
    write(tmp_path / "d", "zoo-bfloat16.jsonl", [dlm])
    write(tmp_path / "d", "zoo-float32.jsonl", [{**dlm, "wall_s": 0.2}])
    assert verdict.dtypes([tmp_path / "b", tmp_path / "d"]).met is True
    write(tmp_path / "b", "zoo-float32.jsonl", [item(0, 0.2, "r3")])
    assert verdict.dtypes([tmp_path / "b", tmp_path / "d"]).met is False
    # rows that separate processes wrote (another `command`) are not put side by side
    write(tmp_path / "d", "zoo-float32.jsonl", [{**dlm, "wall_s": 0.2, "command": "another process"}])
    apart = verdict.dtypes([tmp_path / "d"])
    assert apart.met is None and "dlm.baseline on zoo:dlm-small: not in both dtypes in one run" in apart.figures


def test_main_prints_the_table_and_refuses_a_missing_folder(verdict, tmp_path, capsys):
    assert verdict.main([str(tmp_path)]) == 1  # nothing measured
    assert "| suite with FASTDECODE_TEST_DEVICE=cuda | not measured |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        verdict.main([str(tmp_path / "absent")])
    assert "unpack each PART.tgz" in capsys.readouterr().err


def test_the_device_suite_keeps_the_summary_the_verdict_reads_and_says_where_its_limit_stopped(verdict, tool,
                                                                                               tmp_path):
    """The suite as the device's last call runs it (tools/gpu_parts.py `run_suite`, with the repository's own pytest
    options: addopts' -q) leaves pytest's counts in its log; a second -q hid them, and the verdict then read a
    finished run as one cut by its limit. Stopped at its limit, pytest still writes its JUnit file and the counts of
    what it ran, and the log gets the line the verdict reads as stopped."""
    pytest.importorskip("xdist")
    pytest.importorskip("pytest_timeout")
    parts = tool("gpu_parts")
    tests = tmp_path / "test_t.py"
    tests.write_text("import pytest\nimport time\n\ndef test_a():\n    pass\n\n"
                     "def test_b():\n    pytest.skip('not here')\n")
    assert parts.run_suite(tmp_path / "done", "cpu", 1, tests=(str(tests),)) == 0
    log = tmp_path / "done" / "pytest.txt"
    assert verdict.pytest_counts(log) == {"passed": 1, "skipped": 1}, log.read_text()[-2000:]
    tests.write_text(tests.read_text() + "\ndef test_c():\n    time.sleep(300)\n")
    # as a command a shell started in the background (nohup ... &): SIGINT ignored, which children inherit; the limit
    # leaves the workers' bring-up ample time on a busy machine, so that the cut comes while test_c sleeps
    limit = 15
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert parts.run_suite(tmp_path / "cut", "cpu", 1, limit=limit, tests=(str(tests),)) == 124
    finally:
        signal.signal(signal.SIGINT, ignored)
    log = tmp_path / "cut" / "pytest.txt"
    assert log.read_text().splitlines()[-1] == f"{verdict.STOPPED[0]} {limit} s"
    assert (tmp_path / "cut" / "pytest.xml").is_file() and verdict.pytest_counts(log) is None
    assert "cut/pytest.txt: stopped before its end" in verdict.suite([tmp_path]).figures
    log.write_text("..s.")  # stopped within its progress dots (pytest killed before it wrote its summary)
    parts.mark_stopped(log, limit)
    assert log.read_text().splitlines() == ["..s.", f"{verdict.STOPPED[0]} {limit} s"]


def test_the_calls_logs_name_what_failed_or_was_not_done(verdict, tmp_path):
    (tmp_path / "ar").mkdir()
    (tmp_path / "ar" / "ar-log.txt").write_text(
        "[  2.6 s] engine warm-up ar.greedy: 2.4 s\n"
        "[ 20.0 s] engine warm-up ar.greedy:fused=true,grouped=true FAILED: RuntimeError: no kernel\n"
        "[150.2 s] zoo:ar-small parallel-lists bfloat16 skipped: past --budget-s; run the command again to finish it\n"
        "[  1.0 s] zoo:ar-small spec.dflash bfloat16 left out: fastdecode/zoo/ar-small/heads/dflash/model.safetensors"
        " is not in this checkout\n")
    not_run = verdict.TROUBLE["not run within a call's limit"]  # what tools/gpu_run.sh writes for a stage its
    assert not_run in (ROOT / "tools" / "gpu_run.sh").read_text()  # LIMIT left out
    (tmp_path / "dlm").mkdir()
    (tmp_path / "dlm" / "dlm-log.txt").write_text(
        f"{not_run} of 80 s: the diffusion family's stages (12 s left for them)\n")
    found = verdict.troubles([tmp_path])
    assert found[0] == ("In the calls' logs: 1 failed, 1 skipped past --budget-s, 1 left out for a file, 1 not run "
                        "within a call's limit")
    assert found[1].startswith("- ar-log.txt: [ 20.0 s] engine warm-up ar.greedy:fused=true,grouped=true FAILED")
    assert found[4] == "- dlm-log.txt: gpu_run.sh: not run within the call's limit of 80 s: the diffusion family's " \
                       "stages (12 s left for them)"
    assert len(found) == 5 and verdict.troubles([tmp_path], shown=1)[-1] == "- ... and 3 more"
    (tmp_path / "ar" / "ar-log.txt").write_text("[  2.6 s] engine warm-up ar.greedy: 2.4 s\n[ 49.7 s] done\n")
    (tmp_path / "dlm" / "dlm-log.txt").unlink()
    assert verdict.troubles([tmp_path]) == []
