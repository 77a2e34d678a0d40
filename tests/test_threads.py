"""The CLI's default torch thread count (one rule for generate, bench and serve) and the library leaving the
process-wide setting alone (issue #29: torch's default threads made the README's figures come out reversed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from carried import NOT_CARRIED, skip_if_not_carried

import fastdecode
from fastdecode.models.threads import SMALL_MODEL_PARAMETERS, cli_threads, default_threads, parameter_count


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTDECODE_DEBUG": "0"}
    return subprocess.run([sys.executable, "-m", "fastdecode", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def test_the_rule_is_one_thread_for_a_small_model_on_the_cpu_only():
    assert default_threads(10_000_000, "cpu") == 1
    assert default_threads(SMALL_MODEL_PARAMETERS, "cpu") is None  # torch's choice for a large model
    assert default_threads(10_000_000, "cuda") is None  # the CPU threads only feed the GPU there
    assert default_threads(None, "cpu") is None  # an unreadable folder: loading it will say why


def test_the_count_is_read_from_the_headers_without_loading(causal_dir, causal):
    assert parameter_count(causal_dir) == causal.num_parameters
    assert parameter_count("/no/such/folder") is None and parameter_count("zoo:no-such-model") is None
    assert cli_threads(causal_dir, 3, "cpu") == 3  # the user's --threads wins
    assert cli_threads(causal_dir, None, "cpu") == 1
    assert cli_threads(causal_dir, None, "not a device") is None  # loading refuses it with its own message


def test_every_zoo_model_is_small(device):
    names = ("ar-tiny", "ar-small", "dlm-small")
    skip_if_not_carried(str(device), *(NOT_CARRIED[0] / name / "model.safetensors" for name in names))
    for name in names:
        assert cli_threads(f"zoo:{name}", None, "cpu") == 1, name


def test_the_library_never_changes_the_process_wide_thread_count(causal_dir):
    before = torch.get_num_threads()
    model = fastdecode.load(causal_dir, device="cpu")
    fastdecode.generate(model, "the quick", max_new_tokens=2)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("given, shown", [([], "1 torch thread"), (["--threads", "2"], "2 torch threads")])
def test_generate_takes_threads_and_says_how_many_it_used(causal_dir, given, shown):
    p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--max-new-tokens", "2", "--device", "cpu", *given)
    assert p.returncode == 0, p.stderr
    assert shown in " ".join(p.stderr.split())  # however the console wraps it


def test_bench_records_the_default_in_its_command_and_rows(tmp_path):
    out = tmp_path / "r.jsonl"
    p = run("bench", "--suite", "parallel-lists", "--model", "zoo:ar-tiny", "--methods", "ar.greedy", "--out", str(out),
            "--limit", "1", "--no-warmup", "--device", "cpu", "--param", "ar.greedy.max_new_tokens=2")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["machine"]["torch_threads"] == 1 and "--threads 1" in r["command"] for r in rows)


def test_generate_bench_and_serve_share_one_threads_option():
    import typer

    from fastdecode.cli import app

    group = typer.main.get_command(app)
    helps = set()
    for name in ("generate", "bench", "serve"):
        (option,) = [o for o in group.commands[name].params if o.name == "threads"]  # type: ignore[attr-defined]
        helps.add(option.help)
    assert len(helps) == 1 and "50 M parameters" in helps.pop()
