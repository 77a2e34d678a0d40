"""The CLI's --constraint-* options end to end (a subprocess): the same tokens as the library, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from constraint_cases import REGEX, SCHEMA

import fastdecode
from fastdecode import constraints


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTDECODE_DEBUG": "0"}
    return subprocess.run([sys.executable, "-m", "fastdecode", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_cli_constraints_match_the_library(causal_dir, causal, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--method", "spec.pld", "--max-new-tokens", "30",
            "--json", "--constraint-json-schema", str(schema))
    assert p.returncode == 0, p.stderr
    want = fastdecode.generate(causal, "the quick", "ar.greedy", max_new_tokens=30,
                               constraint=constraints.from_file("json_schema", schema))
    assert json.loads(p.stdout)["token_ids"] == want.token_ids


def test_cli_bad_constraints_are_one_line_errors(causal_dir):
    p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--constraint-regex", "[a-")
    assert p.returncode != 0 and "regular expression is not valid" in p.stderr and "Traceback" not in p.stderr


def test_cli_never_drops_a_constraint(causal_dir):
    """A matcher that fails mid-request, an unsatisfiable regex and GAD on a greedy method: one line, exit 2, no
    text (issue #29: the failed matcher used to leave the output unconstrained, with exit 0)."""
    cases = [
        (["--constraint-regex", "(a{1000}){1000}"], "matcher failed"),
        (["--constraint-regex", r"[^\s\S]"], "unsatisfiable"),
        (["--constraint-regex", "[a-z]+", "--constraint-sampling", "gad"], "Grammar-Aligned Decoding"),
    ]
    for args, words in cases:
        p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--max-new-tokens", "8", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert words in p.stderr and "Traceback" not in p.stderr and not p.stdout.strip(), (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_cli_says_when_max_new_tokens_cut_the_constraint(causal_dir):
    p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--max-new-tokens", "3", "--json",
            "--constraint-regex", REGEX)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["constraint_complete"] is False
    warning = [line for line in p.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "before the constraint was complete" in warning[0] and "--max-new-tokens" in warning[0]
