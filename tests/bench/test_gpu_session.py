"""tools/gpu_session.sh: the checkout's side of a device session, on a small git repository of its own: `prepare`
untracks the results and the weights (and ignores them) so that a call carries neither, `restore` gives back the
checkout as it was, and `unpack` puts each call's archive where tools/gpu_verdict.py reads it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_session.sh"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def session(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    for name, text in {"a.py": "x = 1\n", "docs/results/r.jsonl": "{}\n", "docs/guide.md": "# guide\n",
                       "fastdecode/zoo/m/model.safetensors": "weights", "fastdecode/zoo/m/config.json": "{}\n"}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo.parent, "init", "-q", str(repo))
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    (repo / ".git/info/exclude").unlink(missing_ok=True)  # (git's template writes one; a clone may have none)
    return repo


def test_prepare_keeps_results_and_weights_out_of_a_call_and_restore_undoes_it(repo):
    done = session(repo, "prepare")
    assert done.returncode == 0, done.stderr
    assert "call ar: carry [" in done.stdout and "gpu_run.sh rest $OUT LIMIT" in done.stdout
    # what a call carries: tracked and untracked files that git does not ignore
    travels = set(git(repo, "ls-files", "--cached", "--others", "--exclude-standard").split())
    assert travels == {"a.py", "docs/guide.md", "fastdecode/zoo/m/config.json"}
    assert (repo / "docs/results/r.jsonl").exists() and (repo / "fastdecode/zoo/m/model.safetensors").exists()
    again = session(repo, "prepare")
    assert again.returncode == 2 and "already prepared" in again.stderr
    done = session(repo, "restore")
    assert done.returncode == 0, done.stderr
    assert git(repo, "status", "--porcelain") == "" and not (repo / ".git/info/exclude").exists()
    assert "docs/results/r.jsonl" in git(repo, "ls-files")
    assert session(repo, "restore").returncode == 2  # nothing to restore


def test_prepare_refuses_a_work_tree_with_changes_and_keeps_an_exclude_file(repo):
    (repo / "a.py").write_text("x = 2\n")
    refused = session(repo, "prepare")
    assert refused.returncode == 2 and "commit them first" in refused.stderr
    assert "docs/results/r.jsonl" in git(repo, "ls-files")  # nothing was untracked
    git(repo, "checkout", "-q", "a.py")
    (repo / ".git/info").mkdir(exist_ok=True)
    (repo / ".git/info/exclude").write_text("/scratch/\n")
    assert session(repo, "prepare").returncode == 0
    assert session(repo, "restore").returncode == 0
    assert (repo / ".git/info/exclude").read_text() == "/scratch/\n"


def test_unpack_puts_each_call_in_its_own_folder(repo, tmp_path):
    files = tmp_path / "files_at"
    (files / "one").mkdir(parents=True)
    rows = tmp_path / "engine.jsonl"
    rows.write_text("")
    with tarfile.open(files / "one" / "ar.tgz", "w:gz") as tar:
        tar.add(rows, arcname="./engine.jsonl")
    (files / "one" / "ar-log.txt").write_text("torch 2.11.0\n")
    done = session(repo, "unpack", "2026-12-01", str(files))
    assert done.returncode == 0, done.stderr
    run = repo / "docs/results/gpu/2026-12-01"
    assert sorted(p.name for p in (run / "ar").iterdir()) == ["ar-log.txt", "engine.jsonl"]
    assert "dlm: no dlm.tgz" in done.stdout and "| target | status |" in done.stdout  # the verdict's table
    assert session(repo, "unpack", "2026-12-01", str(tmp_path / "nothing")).returncode == 2
