"""The parts of `tools/gpu_run.sh`: what each call to a lent GPU carries, and the test files that need it.

A call carries at most 64 MiB, the working tree included (about 6 MB without `docs/results` and the zoo's weights,
which the checkout stops tracking for the call: docs/gpu.md). The zoo's weights are about 150 MB, so they travel in
three parts; on a machine kept warm between calls the earlier parts' files stay (ignored files already there are
kept), so a later part can also use them, and every test or method whose files are absent is skipped or left out with
the file named (tests/carried.py, tools/results_gpu.py).

    python tools/gpu_parts.py carry ar      # the JSON list for the device call's `carry`, and its size on stderr
    python tools/gpu_parts.py tests dlm     # what the part's pytest runs (its arguments)
    python tools/gpu_parts.py log dlm       # the name of the part's pytest log (NAME.txt, NAME.xml)
    python tools/gpu_parts.py check         # every part fits, and together they carry every weights file
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO = "fastdecode/zoo"
LIMIT = 64 * 2**20  # bytes a call carries, working tree included
NOT_TRAVELLING = ("docs/results/",)  # untracked for the call, with every *.safetensors (docs/gpu.md)
PARTS = {
    # the causal zoo model, its draft, the heads trained against it and the image model: the engine, the lossless
    # methods, the kernels and the whole suite
    "ar": (f"{ZOO}/ar-small/model.safetensors", f"{ZOO}/ar-tiny/model.safetensors",
           f"{ZOO}/ar-small/heads/medusa", f"{ZOO}/ar-small/heads/hydra", f"{ZOO}/ar-small/heads/eagle3",
           f"{ZOO}/img-ar/model.safetensors", f"{ZOO}/img-ar/vq", f"{ZOO}/img-eval"),
    # the diffusion model, the DFlash head and the image generators: the diffusion family in both dtypes, the last
    # two lossless methods (spec.dlm_draft, spec.dflash: with the `ar` part's zoo:ar-small), their tests
    "dlm": (f"{ZOO}/dlm-small", f"{ZOO}/ar-small/heads/dflash", f"{ZOO}/img-ar/heads"),
    # the rest: the dParallel copy of the diffusion model, the long-context model and its gates; their tests
    "rest": (f"{ZOO}/dlm-small-dparallel/model.safetensors", f"{ZOO}/ar-long"),
}
# how tests name each part's weights (the ar part runs the whole suite)
WORDS = {"ar": ("ar-small", "ar-tiny", "medusa", "hydra", "eagle3", "img-ar", "img-eval"),
         "dlm": ("dlm-small", "learn2pd", "dflash", "dd1", "dd2"),
         "rest": ("dparallel", "ar-long", "duo")}
# the test files a part runs beyond those that name its weights: the diffusion forward's CUDA graphs and fused kernels
ALSO = {"dlm": ("tests/invariants/test_canvas_graphs.py", "tests/invariants/test_dlm_fused.py")}
# each part's pytest log, `NAME.txt` (with `NAME.xml`, its JUnit file, and `NAME-failures.txt`): tools/gpu_run.sh,
# tools/gpu_dry_run.sh and tools/gpu_verdict.py read these names here
LOGS = {"ar": "pytest", "dlm": "pytest-dlm", "rest": "pytest-rest"}


def weights_in(path: str) -> list[Path]:
    at = ROOT / path
    return sorted(at.rglob("*.safetensors")) if at.is_dir() else [at]


def tree_bytes() -> int:
    """The working tree that travels: tracked files but the results and the weights."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    total = 0
    for raw in names:
        name = raw.decode()
        if not name or name.endswith(".safetensors") or name.startswith(NOT_TRAVELLING):
            continue
        path = ROOT / name
        if path.is_file():
            total += path.stat().st_size
    return total


def carried_bytes(part: str) -> int:
    """The part's weights files (the other files of its folders are tracked: the tree counts them)."""
    return sum(w.stat().st_size for path in PARTS[part] for w in weights_in(path))


def test_files(part: str) -> list[str]:
    """What the part's pytest runs: the whole suite in the first part (`ar`); in the others the test files that
    mention one of the part's `WORDS` (a superset of those that need its weights: a test that needs them and ran in an
    earlier part without them was skipped there), and its `ALSO`."""
    if part == next(iter(PARTS)):
        return ["tests"]
    named = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
             if any(w in p.read_text(encoding="utf-8") for w in WORDS[part])}
    return sorted(named | set(ALSO.get(part, ())))


def check() -> list[str]:
    """What is wrong with the parts (empty: each fits, and together they carry every weights file)."""
    problems = []
    tree = tree_bytes()
    for part in PARTS:
        size = tree + carried_bytes(part)
        if size > LIMIT:
            problems.append(f"part {part}: {size / 2**20:.1f} MiB with the tree, over {LIMIT / 2**20:.0f}")
    carried = {w for paths in PARTS.values() for p in paths for w in weights_in(p)}
    for w in sorted((ROOT / ZOO).rglob("*.safetensors")):
        if w not in carried:
            problems.append(f"{w.relative_to(ROOT)} is in no part")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("carry", "tests", "log", "check"))
    ap.add_argument("part", nargs="?", choices=tuple(PARTS))
    args = ap.parse_args(argv)
    if args.what == "check":
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if args.part is None:
        ap.error(f"{args.what} needs a part: {', '.join(PARTS)}")
    if args.what == "carry":
        print(json.dumps(list(PARTS[args.part])))
        print(f"{(tree_bytes() + carried_bytes(args.part)) / 2**20:.1f} MiB with the tree", file=sys.stderr)
    elif args.what == "log":
        print(LOGS[args.part])
    else:
        print(" ".join(test_files(args.part)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
