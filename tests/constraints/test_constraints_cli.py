"""The CLI's --constraint-* options end to end (a subprocess): the same tokens as the library, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from constraint_cases import SCHEMA

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
