"""tools/results_gpu.py (make results-gpu) in its smoke mode: tiny shapes on the CPU, every stage's rows written with
their dtype, exact mode and machine, and the report shows them like any other."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from carried import NOT_CARRIED, skip_if_not_carried

from fastdecode.bench.report import build_report


def test_smoke_run_writes_rows_the_report_reads(tmp_path, capsys, tool, device):
    # the zoo stage leaves out a model whose weights are absent, with a line: on a device machine that lacks one of
    # the two models (one that went cold between the calls of tools/gpu_run.sh), the test is skipped
    skip_if_not_carried(str(device), *(NOT_CARRIED[0] / m / "model.safetensors" for m in ("ar-small", "dlm-small")))
    tool("results_gpu").main(["--smoke", "--out", str(tmp_path), "--stages", "engine", "bfloat16"])
    engine = [json.loads(line) for line in (tmp_path / "engine.jsonl").read_text().splitlines()]
    assert {r["method"] for r in engine} == {"ar.greedy", "ar.greedy:graphs=false", "ar.greedy:exact=false",
                                             "hf.greedy", "hf.static_compile", "spec.suffix", "spec.pld",
                                             "ar.greedy:fused=true", "spec.suffix:fused=true",
                                             "ar.greedy:grouped=true", "ar.greedy:fused=true,grouped=true",
                                             "spec.suffix:fused=true,grouped=true", "ar.greedy:block=2048",
                                             "ar.greedy:fused=true,block=2048"}
    assert {r["method"] for r in engine if r["params"].get("fused")} == {
        "ar.greedy:fused=true", "spec.suffix:fused=true", "ar.greedy:fused=true,grouped=true",
        "spec.suffix:fused=true,grouped=true", "ar.greedy:fused=true,block=2048"}
    assert {r["method"] for r in engine if r["params"].get("block") == 2048} == {
        "ar.greedy:block=2048", "ar.greedy:fused=true,block=2048"}
    assert {r["method"] for r in engine if r["params"].get("grouped")} == {
        "ar.greedy:grouped=true", "ar.greedy:fused=true,grouped=true", "spec.suffix:fused=true,grouped=true"}
    assert all(r["dtype"] == "float32" and r["machine"]["device"] == "cpu" and r["new_tokens"] == 12 for r in engine)
    flags = {r["method"]: (r["exact"], r["params"].get("graphs")) for r in engine}
    assert flags["ar.greedy"] == (8, True) and flags["ar.greedy:graphs=false"] == (8, False)
    assert flags["ar.greedy:exact=false"] == (None, False)
    # float32: every ar.greedy variant (graphs, eager exact mode, plain) and the lossless methods give one output
    assert all(r["equal_to_baseline"] for r in engine if r["method"] != "hf.static_compile")
    probe = json.loads((tmp_path / "engine-probe.json").read_text())
    assert probe["graphs"]["replays"] > 0 and probe["graphs"]["captures"] > 0
    # where a graphed step goes: its steady-state wall time and one replay's, unfused and fused
    assert probe["step"]["step_ms"] > 0 and probe["step"]["replay_ms"] > 0
    assert {"fixed_ms", "fixed_cold_ms"} <= set(probe["step"])  # a generation beyond its steps, kept storage or new
    assert all(probe[k]["replay_ms"] > 0 for k in ("step_fused", "step_grouped", "step_fused_grouped"))
    assert (tmp_path / "engine-profile.txt").read_text().strip()
    zoo = [json.loads(line) for line in (tmp_path / "zoo-bfloat16.jsonl").read_text().splitlines()]
    ar = [r for r in zoo if r["model"] == "zoo:ar-small"]
    assert {r["method"] for r in ar} == {"ar.greedy", "spec.pld", "spec.suffix"}
    assert all(r["dtype"] == "bfloat16" and r["exact"] == 8 for r in ar)
    assert all(r["equal_to_baseline"] for r in ar)  # exact mode: lossless methods are ar.greedy's tokens
    assert {r["method"] for r in zoo if r["model"] == "zoo:dlm-small"} == {"dlm.baseline", "dlm.threshold"}
    report = build_report([tmp_path / "engine.jsonl", tmp_path / "zoo-bfloat16.jsonl"]).markdown
    assert "## engine · random:tiny" in report and "## code · zoo:ar-small · bfloat16 exact" in report
    assert engine[0]["machine"]["device_name"] in report
    assert "skipped" not in capsys.readouterr().out  # nothing skipped for time


def test_kernel_tables_smoke(tmp_path, tool):
    """tools/gpu_kernels.py on the CPU: one table of a step's operators per setting (the GPU run adds kernels)."""
    module = tool("gpu_kernels")
    module.main(["--smoke", "--out", str(tmp_path), "--steps", "3"])
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"kernels-{n}.txt" for n in ("graphs", "graphs-fused-grouped", "graphs-grouped", "graphs-fused",
                                                  "eager")}
    assert "aten::mm" in (tmp_path / "kernels-graphs-fused-grouped.txt").read_text()


def test_the_baseline_alone_in_float32(tmp_path, tool, device):
    """tools/gpu_run.sh's `dlm` call times `ar.greedy` alone in float32 (stage `float32-baseline`) in the process
    that ran the bfloat16 methods: its rows and no other method's, with the same `command` as the bfloat16 rows,
    which the verdict puts side by side."""
    skip_if_not_carried(str(device), NOT_CARRIED[0] / "ar-small" / "model.safetensors")
    tool("results_gpu").main(["--smoke", "--out", str(tmp_path), "--stages", "bfloat16", "float32-baseline",
                              "--models", "zoo:ar-small", "--methods", "spec.pld"])
    rows = [json.loads(line) for line in (tmp_path / "zoo-float32.jsonl").read_text().splitlines()]
    assert rows and {(r["method"], r["dtype"]) for r in rows} == {("ar.greedy", "float32")}
    bf16 = [json.loads(line) for line in (tmp_path / "zoo-bfloat16.jsonl").read_text().splitlines()]
    assert {r["method"] for r in bf16} == {"ar.greedy", "spec.pld"}
    assert {r["command"] for r in rows} == {r["command"] for r in bf16}


def test_warm_and_eager_float32_stages_of_the_diffusion_part(tmp_path, capsys, tool):
    """tools/gpu_run.sh's `dlm` part: a warm-up that writes nothing, then float32 with the canvas graphs off, and
    bfloat16 without the fused kernels."""
    tool("results_gpu").main(["--smoke", "--out", str(tmp_path), "--stages", "warm", "float32-nographs",
                              "bfloat16-unfused", "--models", "zoo:dlm-small"])
    assert "warmed up: zoo:dlm-small" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoo-bfloat16-unfused.jsonl", "zoo-float32-nographs.jsonl"]
    rows = [json.loads(line) for line in (tmp_path / "zoo-float32-nographs.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"dlm.baseline", "dlm.threshold"}
    assert all(r["dtype"] == "float32" and r["graphs"] is False and r["fused"] is False for r in rows)
    unfused = [json.loads(line) for line in (tmp_path / "zoo-bfloat16-unfused.jsonl").read_text().splitlines()]
    assert unfused and all(r["dtype"] == "bfloat16" and r["fused"] is False for r in unfused)


def test_a_method_whose_weights_are_not_here_is_left_out_with_the_file_named(tmp_path, capsys, monkeypatch, tool):
    """A device call carries a few of the zoo's weights at a time: the zoo stage runs what it can and says what not."""
    gpu = tool("results_gpu")
    assert gpu.absent("zoo:ar-small", "spec.medusa:hydra=true") is None  # all shipped here
    # every lossless method of zoo:ar-small is in the GPU run's list
    import fastdecode
    lossless = {m.name for m in fastdecode.methods() if m.lossless and m.kind == "causal" and m.name != "ar.greedy"}
    images = {"spec.sjd"}  # the image models' method: lossless as a sampler, measured by the image suites
    assert lossless - images <= {m.partition(":")[0] for m in gpu.LOSSLESS}
    monkeypatch.setitem(gpu.HEADS, "spec.medusa", "ar-small/heads/no-such-head")
    assert gpu.absent("zoo:ar-small", "spec.medusa") == gpu.ZOO_DIR / "ar-small/heads/no-such-head/model.safetensors"
    assert gpu.absent("zoo:ar-small", "spec.dlm_draft") is None
    gpu.main(["--smoke", "--out", str(tmp_path), "--stages", "bfloat16", "--models", "zoo:ar-small", "--methods",
               "spec.pld", "spec.medusa", "spec.dlm_draft"])
    said = capsys.readouterr().out
    assert "spec.medusa bfloat16 left out: fastdecode/zoo/ar-small/heads/no-such-head/model.safetensors" in said
    rows = [json.loads(line) for line in (tmp_path / "zoo-bfloat16.jsonl").read_text().splitlines()]
    # spec.dlm_draft drafts with zoo:dlm-small: its own bench run, beside its own baseline rows
    assert {(r["method"], r["draft"]) for r in rows} == {("ar.greedy", None), ("spec.pld", None),
                                                         ("ar.greedy", "zoo:dlm-small"),
                                                         ("spec.dlm_draft", "zoo:dlm-small")}
    assert all(r["equal_to_baseline"] for r in rows)


def test_the_device_parts_fit_a_call_and_carry_every_weights_file(tool, tmp_path, monkeypatch):
    """tools/gpu_parts.py: each call of tools/gpu_run.sh fits in 64 MiB with the working tree, the calls together
    carry every weights file of the zoo, the last runs the suite, and `present` names a weights file that is absent."""
    parts = tool("gpu_parts")
    assert parts.check() == []
    assert set(parts.PARTS) == {"ar", "dlm", "rest"} and all(len(p) <= 8 for p in parts.PARTS.values())  # carry: 8
    assert parts.SUITE == list(parts.PARTS)[-1]  # every part's weights are there by then
    assert parts.present() == [f"{p}: {n} of {n} weights files here" for p, n in (("ar", 8), ("dlm", 5), ("rest", 3))]
    script = (Path(parts.__file__).parent / "gpu_run.sh").read_text()
    assert all(f"\n{p})" in script for p in parts.PARTS)  # every part is a case of the script
    assert f"\n{parts.SUITE})\n  suite " in script
    # a folder's weights are known from the tracked train_log.jsonl beside them: absent ones are named
    (tmp_path / "zoo" / "m" / "heads" / "h").mkdir(parents=True)
    (tmp_path / "zoo" / "m" / "heads" / "h" / "train_log.jsonl").write_text("{}\n")
    (tmp_path / "zoo" / "m" / "model.safetensors").write_bytes(b"x")
    monkeypatch.setattr(parts, "ROOT", tmp_path)
    monkeypatch.setattr(parts, "PARTS", {"p": ("zoo/m/model.safetensors", "zoo/m/heads")})
    assert parts.present() == ["p: 1 of 2 weights files here; absent: zoo/m/heads/h/model.safetensors"]


def test_each_later_call_gets_its_limit_from_what_the_previous_reply_left(tool, tmp_path):
    """tools/gpu_parts.py `limit`: the `dlm` call keeps its 220 s where the start was quick and gives up its stages,
    never the suite's least, where it was slow; the suite gets what is left less a call's cost; `plan` writes the same
    as rules. tools/gpu_run.sh's `dlm` call with no time left carries its weights and says which stages it left out."""
    parts = tool("gpu_parts")
    assert parts.limit("ar") == (345, 420)
    least = 2 * parts.CALL_COST + parts.SUITE_LEAST
    assert parts.limit("dlm", 900 - 60 - 300) == (220, 280)  # a one-minute start, the `ar` stages at 300 s
    assert parts.limit("dlm", least + 100) == (100, 160)  # a slow start: the suite keeps its least
    assert parts.limit("dlm", least - 10) == (0, parts.SLACK["dlm"])  # only the weights, for the suite
    assert parts.limit("rest", 280) == (280 - parts.CALL_COST, 280 - parts.CALL_COST + parts.SLACK["rest"])
    with pytest.raises(ValueError, match="budget_left_s"):
        parts.limit("dlm")
    rules = "\n".join(parts.plan())
    assert f"LIMIT = min(220, B - {least})" in rules and f"LIMIT = B - {parts.CALL_COST}" in rules
    script = Path(parts.__file__).parent / "gpu_run.sh"
    text = script.read_text()  # the limits are the script's: the `ar` stages' timeouts, the `dlm` call's default
    ar = text[text.index("\nar)\n"):text.index("\ndlm)\n")]
    assert sum(int(t) for t in re.findall(r"timeout (\d+) ", ar)) == parts.LIMITS["ar"]
    assert f"dlm) limit={parts.LIMITS['dlm']} ;;" in text
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(script), "dlm", str(out), "0"], cwd=script.parent.parent, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work")})
    assert done.returncode == 0, done.stderr
    log = (out / "dlm-log.txt").read_text()
    assert re.search(r"^dlm: \d of 5 weights files here", log, re.M)  # `present` first
    assert log.count("gpu_run.sh: not run within the call's limit of 0 s:") == 2 and "spec.dlm_draft" in log
    assert not (out / "dlm.tgz").exists()  # no stage ran, so nothing to archive


def test_the_device_read_probe_runs_each_method_it_counts(tool):
    """The engine probe's copies from the device per target forward (`device_reads`, counted on a GPU): on the CPU
    the same generations run, a draft model's greedy chain among them, and no copy is counted."""
    gpu = tool("results_gpu")
    model = gpu.random_llama(gpu.SMOKE, torch.device("cpu"), torch.float32)
    found = gpu.device_reads(model, gpu.repeated_prompt(gpu.SMOKE, model.vocab_size), 8, anywhere=True)
    assert set(found["device_reads"]) == {m for m, _ in gpu.READ_PROBES}
    assert all(r["forwards"] >= 1 and r["dtoh_per_forward"] == 0 for r in found["device_reads"].values())
    assert gpu.device_reads(model, [5, 6, 7], 4) == {}  # off the GPU the engine probe has none


def test_a_method_that_breaks_on_the_device_costs_only_its_own_rows(tmp_path, monkeypatch, tool):
    """On a lent device (not the smoke run, which raises) a bench run that fails is run again method by method, and
    only the broken one is left out, with its error in the log."""
    import dataclasses

    gpu = tool("results_gpu")
    calls: list[list[str]] = []

    def bench(suite, model, methods, out, **kwargs):
        calls.append(list(methods))
        if "spec.medusa" in methods:
            raise RuntimeError("no kernel for this")

    monkeypatch.setattr(gpu, "run_bench", bench)
    monkeypatch.setattr(gpu, "absent", lambda model, method: None)  # the weights are not what this test is about
    plan = dataclasses.replace(gpu.SMOKE, one_task=False, lossless=("spec.pld", "spec.medusa"),
                               ar_suites=(("code", 1),))
    said: list[str] = []
    gpu.zoo(plan, torch.device("cpu"), "bfloat16", None, tmp_path / "rows.jsonl", "cmd", said.append,
             lambda: True, ["zoo:ar-small"])
    assert calls == [["spec.pld", "spec.medusa"], ["spec.pld"], ["spec.medusa"]]
    assert any("each method on its own" in line for line in said)
    assert any("spec.medusa FAILED: RuntimeError: no kernel for this" in line for line in said)
    smoke = dataclasses.replace(plan, one_task=True)
    with pytest.raises(RuntimeError, match="no kernel"):  # the CPU's smoke run fails loudly
        gpu.zoo(smoke, torch.device("cpu"), "bfloat16", None, tmp_path / "rows.jsonl", "cmd", said.append,
                 lambda: True, ["zoo:ar-small"])


def test_a_method_is_left_off_the_suites_the_plan_names(tmp_path, monkeypatch, tool):
    """The GPU plan runs transformers' assisted loop on parallel-lists only (its code items took 29 s on the H200):
    the code suite's bench run leaves it out, and a bench run left with no method is not started."""
    import dataclasses

    gpu = tool("results_gpu")
    assert gpu.FULL.not_on == {"hf.assisted": ("code",)}
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(gpu, "run_bench", lambda suite, model, methods, out, **kw: calls.append((suite, methods)))
    monkeypatch.setattr(gpu, "absent", lambda model, method: None)
    plan = dataclasses.replace(gpu.SMOKE, one_task=False, lossless=("spec.pld", "hf.assisted"),
                               ar_suites=(("code", 1), ("parallel-lists", 1)), not_on={"hf.assisted": ("code",)})
    gpu.zoo(plan, torch.device("cpu"), "bfloat16", None, tmp_path / "rows.jsonl", "cmd", lambda line: None,
            lambda: True, ["zoo:ar-small"])
    assert calls == [("code", ["spec.pld"]), ("parallel-lists", ["spec.pld", "hf.assisted"])]
    calls.clear()
    gpu.zoo(dataclasses.replace(plan, lossless=("hf.assisted",)), torch.device("cpu"), "bfloat16", None,
            tmp_path / "rows.jsonl", "cmd", lambda line: None, lambda: True, ["zoo:ar-small"])
    assert calls == [("parallel-lists", ["hf.assisted"])]


def test_a_stage_that_breaks_on_the_device_leaves_the_next_ones(tmp_path, monkeypatch, capsys, tool):
    gpu = tool("results_gpu")

    def broken(*args, **kwargs):
        raise RuntimeError("no CUDA context")

    monkeypatch.setattr(gpu, "warm", broken)
    monkeypatch.setattr(gpu, "pick_device", lambda name: torch.device("cpu"))  # a "GPU" run on the CPU
    monkeypatch.setattr(gpu, "zoo", lambda *a, **k: print("zoo stage ran"))
    gpu.main(["--out", str(tmp_path), "--stages", "warm", "float32", "--models", "zoo:dlm-small"])
    said = capsys.readouterr().out
    assert "stage warm FAILED: RuntimeError: no CUDA context" in said and "zoo stage ran" in said
    with pytest.raises(RuntimeError, match="no CUDA context"):  # the smoke run fails loudly
        gpu.main(["--smoke", "--out", str(tmp_path), "--stages", "warm", "--models", "zoo:dlm-small"])


def test_engine_rows_are_written_as_they_come(tmp_path, monkeypatch, tool):
    """A device call's time limit can stop the engine stage between two generations: the rows made before stay."""
    import dataclasses

    gpu = tool("results_gpu")
    made: list[int] = []
    real = gpu.engine_row

    def row(*args, **kwargs):
        if len(made) == 2:
            raise SystemExit("the call's time limit")
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu, "engine_row", row)
    out = tmp_path / "engine.jsonl"
    with pytest.raises(SystemExit):
        gpu.engine(dataclasses.replace(gpu.SMOKE, reps=2), torch.device("cpu"), out,
                   {"command": "test", "run": "r", **gpu.versions()}, lambda line: None, ["hf.greedy"])
    assert [json.loads(line)["method"] for line in out.read_text().splitlines()] == ["ar.greedy", "hf.greedy"]
