"""The calls of a device run (`tools/gpu_run.sh`): what each carries, in their order, and which one runs the tests.

A call carries at most 64 MiB, the working tree included (about 6 MB without `docs/results` and the zoo's weights,
which the checkout stops tracking for the call: docs/gpu.md). The zoo's weights are about 141 MiB, so they travel in
three calls. A machine kept warm between calls keeps the files the earlier calls carried (ignored files already there
stay), so the calls build up the whole zoo there: the first two measure what their own weights allow (the last call
that a measurement needs is the one that brings its last file: `spec.dlm_draft` drafts zoo:ar-small's tokens with
zoo:dlm-small, so it runs in the second), and the last, `SUITE`, runs the whole test suite once, with every part's
weights. Where the machine went cold between calls, a test or method whose files are absent is skipped or left out
with the file named (tests/carried.py, tools/results_gpu.py), and `present` says what was there.

    python tools/gpu_parts.py carry ar      # the JSON list for the device call's `carry`, and its size on stderr
    python tools/gpu_parts.py present       # each part's weights files here and absent (first thing in every call)
    python tools/gpu_parts.py check         # every part fits, and together they carry every weights file
    python tools/gpu_parts.py suite DIR --device cuda --workers 15 --limit 240   # the suite as the device runs it
    python tools/gpu_parts.py limit dlm 480 # a call's LIMIT and timeout_s, from the previous reply's budget_left_s
    python tools/gpu_parts.py plan          # the calls' commands, each LIMIT as a rule (tools/gpu_session.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZOO = "fastdecode/zoo"
LIMIT = 64 * 2**20  # bytes a call carries, working tree included
NOT_TRAVELLING = ("docs/results/",)  # untracked for the call, with every *.safetensors (docs/gpu.md)
PARTS = {  # in the order of the calls
    # the causal zoo model, its draft, the heads trained against it and the image model: the zoo's lossless methods,
    # the 1.1B engine (random weights, built there), the kernels
    "ar": (f"{ZOO}/ar-small/model.safetensors", f"{ZOO}/ar-tiny/model.safetensors",
           f"{ZOO}/ar-small/heads/medusa", f"{ZOO}/ar-small/heads/hydra", f"{ZOO}/ar-small/heads/eagle3",
           f"{ZOO}/img-ar/model.safetensors", f"{ZOO}/img-ar/vq", f"{ZOO}/img-eval"),
    # the diffusion model, the DFlash head and the image generators: the last two lossless methods (spec.dlm_draft,
    # spec.dflash: with the first call's zoo:ar-small), the diffusion family in both dtypes
    "dlm": (f"{ZOO}/dlm-small", f"{ZOO}/ar-small/heads/dflash", f"{ZOO}/img-ar/heads"),
    # the rest: the dParallel copy of the diffusion model, the long-context model and its gates; then the suite
    "rest": (f"{ZOO}/dlm-small-dparallel/model.safetensors", f"{ZOO}/ar-long"),
}
SUITE = "rest"  # the call that runs the whole suite: the last, when every part's weights are there
LOG = "pytest"  # its log, `pytest.txt`, with `pytest.xml` (JUnit) and `pytest-failures.txt` (tools/gpu_verdict.py)
# the line `run_suite` adds to a log whose pytest its time limit stopped: an interrupted pytest still prints the counts
# of the tests run until then, as if they were all (tools/gpu_verdict.py reads the line as "stopped")
STOPPED = "the device suite stopped at its time limit of"
TEST_TIMEOUT = 120  # seconds a test may take there (pytest-timeout)
# The time plan of one device session (15 minutes of device time, the machine's start included, which is not known in
# advance: a minute, or two to three where a start fails and another kind is tried). The first call's stages have
# fixed limits; each later call's LIMIT comes from what the previous reply says is left (`lease.budget_left_s`), so
# that a slow start costs the measurements that matter least (the `dlm` call's diffusion stages), not the suite.
LIMITS = {"ar": 345, "dlm": 220}  # the most each measuring call's stages take (tools/gpu_run.sh)
CALL_COST = 60  # seconds a call costs beyond its LIMIT: its start, the carry, `present`, the archive, the transfer
SUITE_LEAST = 150  # the suite's LIMIT the `dlm` call leaves (15 workers ran 93 % of it in 150 s on the H200)
SLACK = {"ar": 75, "dlm": 60, "rest": 40}  # timeout_s less LIMIT: the script's own work around its stages


def weights_in(path: str) -> list[Path]:
    """The weights files a part's path stands for, here or not: the path itself, or in a folder each trained
    model's or head's `model.safetensors` (every one was trained by a command of the package, which writes its
    `train_log.jsonl` beside it, and that file is tracked: it tells an absent weights file from no weights file)."""
    at = ROOT / path
    return sorted(log.parent / "model.safetensors" for log in at.rglob("train_log.jsonl")) if at.is_dir() else [at]


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


def present() -> list[str]:
    """Each part's weights files in this checkout, one line a part: all here, or which are absent."""
    lines = []
    for part, paths in PARTS.items():
        files = [w for path in paths for w in weights_in(path)]
        absent = [str(w.relative_to(ROOT)) for w in files if not w.exists()]
        lines.append(f"{part}: {len(files) - len(absent)} of {len(files)} weights files here"
                     + (f"; absent: {', '.join(absent)}" if absent else ""))
    return lines


def pytest_options(workers: int) -> list[str]:
    """The suite's pytest options on the device (tools/gpu_run.sh) and in its rehearsal (tools/gpu_dry_run.sh), after
    the files' and failures' own: `workers` processes taking tests one by one as they free up (xdist's `worksteal`;
    by file, `loadfile`, the longest file, tests/test_cli.py at about 90 s on this CPU, bounds the run), each test's
    failure or skip reason in the log (`-q` comes from pyproject.toml's addopts: a second would hide the summary's
    counts, which tools/gpu_verdict.py reads)."""
    import xdist  # the device has it (and pytest-timeout); here: pip install --no-deps pytest-xdist execnet

    steal = tuple(int(p) for p in xdist.__version__.split(".")[:2]) >= (3, 2)
    return ["-rs", "-n", str(workers), "--dist", "worksteal" if steal else "loadfile",
            "--timeout", str(TEST_TIMEOUT)]


def run_suite(folder: Path, device: str, workers: int, limit: float | None = None,
              tests: tuple[str, ...] = ("tests",)) -> int:
    """The whole test suite as the device's last call runs it (tools/gpu_run.sh, `device` "cuda") and as its
    rehearsal does (tools/gpu_dry_run.sh, "sim": the simulated device of tests/device_sim.py), with
    `pytest_options(workers)`; returns pytest's exit status, 124 where `limit` stopped it. In `folder`: the log
    (`LOG`.txt), each test's outcome in a JUnit file (`LOG`.xml: the verdict finds the tests that never ran, skipped
    where their weights were not there) and each failure with its traceback as it happens (`LOG`-failures.txt,
    tools/pytest_failures.py: the limit can stop pytest before its summary). At `limit` seconds pytest gets SIGINT,
    so that it still writes its JUnit file and counts, KILL 30 s later if need be, and the log gets the `STOPPED`
    line."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FASTDECODE_TEST_DEVICE": device, "FASTDECODE_FAILURES": str(folder / f"{LOG}-failures.txt"),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    args = [sys.executable, "-m", "pytest", "-p", "tools.pytest_failures", "-p", "no:cacheprovider",
            "-c", str(ROOT / "pyproject.toml"), "--junitxml", str(folder / f"{LOG}.xml"), *pytest_options(workers),
            *tests]
    log = folder / f"{LOG}.txt"
    with log.open("w") as out:
        run = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                               preexec_fn=_interruptible)
        try:
            return run.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
    mark_stopped(log, limit)
    return 124


def _interruptible() -> None:
    """In the suite's process before it starts: SIGINT back to its default, so that Python turns it into
    KeyboardInterrupt. A command a non-interactive shell starts in the background ignores SIGINT, and its children
    inherit that; pytest then let the limit's interrupt pass, and was killed 30 s later without its JUnit file."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def mark_stopped(log: Path, limit: float) -> None:
    """Append the `STOPPED` line to `log`, on a line of its own where pytest was stopped within one (its progress
    dots): the verdict reads the line's start."""
    cut = log.read_bytes()[-1:] not in (b"", b"\n")
    with log.open("a") as out:
        out.write(("\n" if cut else "") + f"{STOPPED} {limit:g} s\n")


def limit(part: str, budget_left: int | None = None) -> tuple[int, int]:
    """(LIMIT for `tools/gpu_run.sh PART OUT LIMIT`, the call's `timeout_s`), `budget_left` being the previous reply's
    `lease.budget_left_s` (the first call has fixed limits and needs none). `dlm` gets at most its stages' 220 s, less
    where a slow start would leave the suite under `SUITE_LEAST` (0: the call only carries its weights, which the suite
    needs); the suite gets what is left less one call's cost."""
    if part == "ar":
        return LIMITS["ar"], LIMITS["ar"] + SLACK["ar"]
    if budget_left is None:
        raise ValueError(f"the {part} call's LIMIT comes from the previous reply's lease.budget_left_s: pass it")
    if part == "dlm":
        at_most = max(0, min(LIMITS["dlm"], budget_left - 2 * CALL_COST - SUITE_LEAST))
    elif part == SUITE:
        at_most = max(0, budget_left - CALL_COST)
    else:
        raise ValueError(f"part {part!r}: one of {', '.join(PARTS)}")
    return at_most, at_most + SLACK[part]


def plan() -> list[str]:
    """The calls' commands in order, each later call's LIMIT as a rule on the previous reply's budget B (`limit`),
    written out: the next call must start within the 30 s a machine stays warm, with no time to run anything."""
    least = 2 * CALL_COST + SUITE_LEAST
    return ["the calls, one after the other (B: the previous reply's lease.budget_left_s):",
            f"  bash tools/gpu_run.sh ar $OUT           timeout_s {limit('ar')[1]}",
            f"  bash tools/gpu_run.sh dlm $OUT LIMIT    LIMIT = min({LIMITS['dlm']}, B - {least}), at least 0; "
            f"timeout_s LIMIT + {SLACK['dlm']}",
            f"  bash tools/gpu_run.sh {SUITE} $OUT LIMIT   LIMIT = B - {CALL_COST}; timeout_s LIMIT + {SLACK[SUITE]}",
            "  then give_back"]


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
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("carry", help="a part's carry list").add_argument("part", choices=list(PARTS))
    sub.add_parser("present", help="each part's weights files here and absent")
    sub.add_parser("check", help="every part fits a call, and together they carry every weights file")
    sub.add_parser("plan", help="the calls' commands, each later LIMIT as a rule")
    lim = sub.add_parser("limit", help="a call's LIMIT and timeout_s")
    lim.add_argument("part", choices=list(PARTS))
    lim.add_argument("budget_left", nargs="?", type=int, help="the previous reply's lease.budget_left_s")
    run = sub.add_parser("suite", help="the whole test suite as the device runs it")
    run.add_argument("folder", type=Path, help=f"where {LOG}.txt, {LOG}.xml and {LOG}-failures.txt go")
    run.add_argument("--device", required=True,
                     help="FASTDECODE_TEST_DEVICE: cuda, or sim for a rehearsal (cpu:0: without the simulation)")
    run.add_argument("--workers", type=int, default=15)
    run.add_argument("--limit", type=float, help="seconds before pytest is interrupted")
    args = ap.parse_args(argv)
    if args.what == "check":
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if args.what == "present":
        print("\n".join(present()))
    elif args.what == "plan":
        print("\n".join(plan()))
    elif args.what == "limit":
        try:
            at_most, timeout = limit(args.part, args.budget_left)
        except ValueError as e:
            ap.error(str(e))
        print(f"LIMIT {at_most} timeout_s {timeout}")
    elif args.what == "suite":
        rc = run_suite(args.folder, args.device, args.workers, args.limit)
        print("\n".join((args.folder / f"{LOG}.txt").read_text(errors="replace").splitlines()[-2:]))
        return rc
    else:
        print(json.dumps(list(PARTS[args.part])))
        print(f"{(tree_bytes() + carried_bytes(args.part)) / 2**20:.1f} MiB with the tree", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
