"""The CLI end to end, as a user runs it (a subprocess), on a tiny model folder made by the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTDECODE_DEBUG": "0"}
    return subprocess.run([sys.executable, "-m", "fastdecode", *args], capture_output=True, text=True, env=env, timeout=120)


def test_generate_prints_text_and_stats(causal_dir):
    p = run("generate", "--model", str(causal_dir), "--method", "ar.greedy", "--prompt", "the quick", "--param", "max_new_tokens=6")
    assert p.returncode == 0, p.stderr
    assert "ar.greedy:" in p.stderr and "forwards" in p.stderr and "tok/s" in p.stderr


def test_generate_json_matches_library(causal_dir, causal):
    import fastdecode

    p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--max-new-tokens", "6", "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)
    assert row["token_ids"] == fastdecode.generate(causal, "the quick", max_new_tokens=6).token_ids
    assert row["stats"]["forwards"] == len(row["token_ids"])


def test_methods_lists_registry():
    p = run("methods")
    assert p.returncode == 0
    for name in ("ar.greedy", "ar.sample", "top_p"):
        assert name in p.stdout


def test_info_shows_kind_and_mask(diffusion_dir):
    p = run("info", str(diffusion_dir))
    assert p.returncode == 0, p.stderr
    assert "diffusion" in p.stdout and "mask_token_id" in p.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "-m", "/no/such/dir", "-p", "x"], "does not exist"),
        (["generate", "-m", "{causal}", "-p", "x", "--method", "ar.gredy"], "Did you mean 'ar.greedy'"),
        (["generate", "-m", "{causal}", "-p", "x", "--param", "tmperature=1"], "Unknown parameter"),
        (["generate", "-m", "{causal}", "-p", "   "], "empty"),
        (["generate", "-m", "{diffusion}", "-p", "x"], "needs a causal model"),
        (["generate", "-m", "{causal}", "-p", "x", "--method", "spec.draft_model"], "needs a draft model"),
    ],
)
def test_errors_are_one_line_without_traceback(args, message, causal_dir, diffusion_dir):
    args = [a.format(causal=causal_dir, diffusion=diffusion_dir) for a in args]
    p = run(*args)
    assert p.returncode == 2
    assert message in " ".join(p.stderr.split()) and "Traceback" not in p.stderr


def test_generate_with_a_draft_model(causal_dir):
    p = run("generate", "-m", str(causal_dir), "--draft", str(causal_dir), "--method", "spec.draft_model",
            "-p", "the quick", "--max-new-tokens", "8", "--json")
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout)["stats"]
    assert stats["draft_forwards"] > 0 and stats["accepted"] == stats["proposed"]  # a draft equal to the target
