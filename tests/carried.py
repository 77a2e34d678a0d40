"""What a device call leaves behind: a call to a lent GPU carries at most 64 MiB, so the zoo's weights travel there a
few models at a time (tools/gpu_run.sh, one part per set of weights) and docs/results not at all. On another device
than the CPU, a test that fails for a file of these that the checkout lacks is skipped with the file named; on the CPU
it fails as ever, since there a missing file is a broken checkout (tests/conftest.py)."""

from __future__ import annotations

import re
from collections.abc import Generator
from pathlib import Path

import pytest

import fastdecode

ROOT = Path(__file__).resolve().parents[1]
# the checkout's files a device call may leave behind: the zoo (weights), the committed results
NOT_CARRIED = (Path(fastdecode.__file__).resolve().parent / "zoo", ROOT / "docs" / "results")
_PATH = re.compile(r"/[^\s'\"]+")


def absent_from_checkout(error: BaseException) -> Path | None:
    """The file under `NOT_CARRIED` that `error`, or an error it came from, names and that this checkout lacks
    (`ModelLoadError`'s "Weights file ... is missing", `FileNotFoundError`'s filename, ...), or the weights of a model
    folder it names that holds none; None if there is none."""
    seen: set[int] = set()
    at: BaseException | None = error
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        for name in (getattr(at, "filename", None), *_PATH.findall(str(at))):
            if not name:
                continue
            path = Path(str(name).rstrip(".,:;)"))
            if not any(path.is_relative_to(root) for root in NOT_CARRIED):
                continue
            if not path.exists():
                return path
            # a model folder whose weights stayed behind (transformers names the folder: "no file named
            # model.safetensors ... found in directory ...")
            if path.is_dir() and (path / "config.json").exists() and not any(path.glob("*.safetensors")):
                return path / "model.safetensors"
        at = at.__cause__ or at.__context__
    return None


def reason(path: Path) -> str:
    return f"{path} is not in this checkout (a device call carries part of the zoo and no results)"


def skip_if_not_carried(device: str, *paths: Path) -> None:
    """On another device than the CPU, skip the calling test where one of `paths` is absent (for a test whose
    failure would not name the file)."""
    if device != "cpu":
        for path in paths:
            if not path.exists():
                pytest.skip(reason(path))


def skip_when_not_carried(device: str) -> Generator[None, object, object]:
    """The body of a hook wrapper (tests/conftest.py): the test phase's outcome, or a skip in place of an error that
    names a file the checkout lacks, on another device than the CPU."""
    try:
        return (yield)
    except Exception as e:
        path = None if device == "cpu" else absent_from_checkout(e)
        if path is None:
            raise
        pytest.skip(reason(path))
