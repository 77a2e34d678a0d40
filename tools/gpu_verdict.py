"""Where a device run stands against issue #30's "done when", read from the files `tools/gpu_run.sh` brought back
(each part's `PART.tgz` unpacked into `docs/results/gpu/DATE/PART/`, since the parts' files share names; the folders
given are searched with their subfolders, so give several when the parts ran in different sessions). One line per
target, with the figures behind it, as a Markdown table to paste into docs/gpu.md or a note; the exit status is 0 when
every target is met.

    python tools/gpu_verdict.py docs/results/gpu/2026-11-27 [more folders]

Below the table, the lines of the calls' logs that say a stage, run or method failed, was skipped for time, was
left out for a weights file that was not there, or was not run within its call's limit.

The targets, as the issue states them:

1. zoo, bfloat16: every lossless method of fastdecode identical to its baseline on every item (`zoo-bfloat16.jsonl`,
   exact mode and CUDA graphs, the CUDA default); transformers' own loops (`hf.*`) run outside exact mode, so their
   agreement is reported, not required. A method of `results_gpu.LOSSLESS` with no rows is "not measured".
2. zoo, bfloat16: `ar.greedy` at least as fast as `hf.greedy`, on each suite (tokens/s of one bench run's rows).
3. the 1.1B shape (`engine.jsonl`): `ar.greedy` in the library's default setting on CUDA (`DEFAULT`: exact mode,
   graphs, fused kernels) at least 3x `hf.greedy`, and every `spec.suffix` run identical to its `ar.greedy`. Another
   setting that clears 3x is named (make it the default, then measure again).
4. the suite with `FASTDECODE_TEST_DEVICE=cuda` (`pytest.txt`, the last call's: the whole suite once, with every
   part's weights on a machine kept warm through the calls): its log reached pytest's summary with nothing failed,
   and no test was skipped for weights that were not there (a machine that went cold), in every such log given: a
   test that ran in one of them counts (`pytest.xml`, the JUnit file).

And two checks of what the issue asks for first (the bfloat16 slowdown):

5. a run of new prompts keeps its per-token time: on the code suite (160 tokens an item, each a new prompt),
   `ar.greedy`'s slowest item in bfloat16 takes at most `SPREAD` times the fastest one's time per token (the cuDNN
   planning made every new prompt's tokens about 10 times slower), in each bench run, all 160-token items, the
   prompt's forward included;
6. bfloat16 at least as fast as float32: each zoo model's baseline (`ar.greedy`, `dlm.baseline`) measured in both
   by one process of tools/results_gpu.py (one `command`; rows of separate processes are not compared).

Only rows written on a CUDA device count: the same files from a CPU smoke run say "not measured".
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastdecode.bench.harness import Entry, read_rows  # noqa: E402
from fastdecode.bench.summary import method_defaults  # noqa: E402

# the ar.greedy run of tools/results_gpu.py's engine stage that has the settings `load` picks on CUDA
# (`native.fused_default`: fused kernels with CUDA graphs; the grouped attention is off unless asked)
DEFAULT = "ar.greedy:fused=true"
TARGET_X = 3.0
SPREAD = 1.5
BASELINES = {"zoo:ar-small": "ar.greedy", "zoo:dlm-small": "dlm.baseline"}
sys.path.insert(0, str(ROOT / "tools"))
import gpu_parts  # noqa: E402  (the suite's log name, and the line its time limit adds)

LOG = gpu_parts.LOG


@dataclass
class Verdict:
    target: str
    met: bool | None  # None: not measured
    figures: str

    @property
    def word(self) -> str:
        return {True: "met", False: "**not met**", None: "not measured"}[self.met]


def device_rows(folders: Iterable[Path], name: str) -> list[dict[str, Any]]:
    """The rows of every file called NAME in the folders and their subfolders written on a CUDA device."""
    rows = []
    for path in found(folders, name):
        rows += [r for r in read_rows(path) if str(r.get("machine", {}).get("device", "")).startswith("cuda")]
    return rows


def found(folders: Iterable[Path], name: str) -> list[Path]:
    return sorted({p for folder in folders for p in folder.rglob(name)})


def machines(rows: list[dict[str, Any]]) -> str:
    return ", ".join(sorted({r["machine"].get("device_name", "?") for r in rows})) or "no device rows"


def normal(value: Any) -> str:
    return str(value).lower()


def spec_of(row: dict[str, Any], specs: list[str]) -> str | None:
    """Which entry of `specs` (`spec.suffix`, `spec.suffix:tree=true`) a bench row ran: the one whose values of the
    parameters its method's entries set (the method's defaults where an entry sets none) the row has."""
    defaults = method_defaults(row["method"])
    params = {**defaults, **row.get("params", {})}
    entries = [e for e in map(Entry.parse, specs) if e.method == row["method"]]
    keys = {k for e in entries for k in e.own}
    for e in entries:
        if all(normal(params.get(k)) == normal(e.own.get(k, defaults.get(k))) for k in keys):
            return e.text
    return None


def rate(rows: list[dict[str, Any]]) -> float:
    return sum(r["new_tokens"] for r in rows) / max(sum(r["wall_s"] for r in rows), 1e-12)


def identical(folders: list[Path], lossless: list[str]) -> Verdict:
    rows = [r for r in device_rows(folders, "zoo-bfloat16.jsonl") if r["model"] == "zoo:ar-small"]
    seen: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        spec = spec_of(r, lossless)
        if spec is not None:
            seen[spec].append(bool(r["equal_to_baseline"]))
    ours = [s for s in lossless if not s.startswith("hf.")]
    unequal = [f"{s} {sum(seen[s])}/{len(seen[s])}" for s in ours if seen[s] and not all(seen[s])]
    missing = [s for s in ours if not seen[s]]
    hf = [f"{s} {sum(seen[s])}/{len(seen[s])}" for s in lossless if s.startswith("hf.") and seen[s]]
    parts = [f"{sum(all(seen[s]) for s in ours if seen[s])} of {len(ours)} identical on every item"]
    parts += [f"not identical: {', '.join(unequal)}"] if unequal else []
    parts += [f"no rows: {', '.join(missing)}"] if missing else []
    parts += [f"outside exact mode (agreement): {', '.join(hf)}"] if hf else []
    met = None if not rows else (False if unequal else (None if missing else True))
    return Verdict("zoo bf16: every lossless method identical", met, f"{'; '.join(parts)} ({machines(rows)})")


def zoo_speed(folders: list[Path]) -> Verdict:
    rows = [r for r in device_rows(folders, "zoo-bfloat16.jsonl") if r["model"] == "zoo:ar-small"]
    by_run: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["method"] in ("ar.greedy", "hf.greedy"):
            by_run[r["suite"], r.get("run", "")][r["method"]].append(r)
    ratios = {}
    for (suite, _), methods in sorted(by_run.items()):
        if len(methods) == 2:  # a run that measured both, side by side
            ratios.setdefault(suite, []).append(rate(methods["ar.greedy"]) / rate(methods["hf.greedy"]))
    if not ratios:
        return Verdict("zoo bf16: ar.greedy ≥ hf.greedy", None, "no run with both")
    text = ", ".join(f"{s} {' / '.join(f'{x:.2f}×' for x in xs)}" for s, xs in ratios.items())
    return Verdict("zoo bf16: ar.greedy ≥ hf.greedy", all(x >= 1 for xs in ratios.values() for x in xs),
                   f"ar.greedy over hf.greedy: {text} ({machines(rows)})")


def engine(folders: list[Path]) -> list[Verdict]:
    rows = device_rows(folders, "engine.jsonl")
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["method"]].append(r)
    suffix = {m: rs for m, rs in sorted(by.items()) if m.split(":")[0] == "spec.suffix"}
    same = Verdict("1.1B: spec.suffix identical",
                   all(r["equal_to_baseline"] for rs in suffix.values() for r in rs) if suffix else None,
                   ", ".join(f"{m} {sum(r['equal_to_baseline'] for r in rs)}/{len(rs)}" for m, rs in suffix.items())
                   or "no spec.suffix rows")
    target = f"1.1B: ar.greedy ≥ {TARGET_X:g}× hf.greedy"
    if not by.get("hf.greedy") or not by.get(DEFAULT):
        return [Verdict(target, None, f"no {DEFAULT} and hf.greedy rows ({machines(rows)})"), same]
    hf = rate(by["hf.greedy"])
    greedy = {m: rate(rs) / hf for m, rs in by.items() if m.split(":")[0] == "ar.greedy"}
    others = [m for m, x in greedy.items() if m != DEFAULT and x >= TARGET_X]
    text = ", ".join(f"{m} {x:.2f}×" for m, x in sorted(greedy.items(), key=lambda kv: -kv[1]) if m != DEFAULT)
    note = f"; ≥ {TARGET_X:g}× but not the default: {', '.join(others)}" if others else ""
    return [Verdict(target, greedy[DEFAULT] >= TARGET_X,
                    f"{DEFAULT} (the default) {greedy[DEFAULT]:.2f}× (hf.greedy {hf:.1f} tokens/s); {text}{note} "
                    f"({machines(rows)})"), same]


def new_prompts(folders: list[Path]) -> Verdict:
    rows = [r for r in device_rows(folders, "zoo-bfloat16.jsonl")
            if r["model"] == "zoo:ar-small" and r["method"] == "ar.greedy"]
    runs: dict[str, list[float]] = defaultdict(list)  # ms a token of each code item, by bench run
    for r in rows:
        if r["suite"] == "code":
            runs[r.get("run", "")].append(1000 * r["wall_s"] / r["new_tokens"])
    target = "bf16: new prompts keep their per-token time"
    runs = {k: v for k, v in runs.items() if len(v) >= 2}
    if not runs:
        return Verdict(target, None, "no bench run with two code items of ar.greedy")
    worst = max(runs.values(), key=lambda v: max(v) / min(v))
    return Verdict(target, max(worst) <= SPREAD * min(worst),
                   f"ar.greedy ms a token on one run's code items {min(worst):.2f}–{max(worst):.2f} "
                   f"({max(worst) / min(worst):.2f}×, at most {SPREAD:g}×; the worst of {len(runs)} bench runs) "
                   f"({machines(rows)})")


def dtypes(folders: list[Path]) -> Verdict:
    """Each zoo baseline's tokens/s in bfloat16 against float32, where one process of tools/results_gpu.py (one
    `command`) timed both: rows of separate processes are not compared."""
    texts, ratios, measured = [], [], 0
    for model, method in BASELINES.items():
        speed: dict[str | None, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        for dtype in ("bfloat16", "float32"):
            for r in device_rows(folders, f"zoo-{dtype}.jsonl"):
                if r["model"] == model and r["method"] == method:
                    speed[r.get("command")][dtype].append(r)
        pairs = [(rate(by["bfloat16"]), rate(by["float32"])) for by in speed.values() if len(by) == 2]
        for bf16, fp32 in pairs:
            ratios.append(bf16 / fp32)
            texts.append(f"{method} on {model}: {bf16:.1f} against {fp32:.1f} tokens/s ({ratios[-1]:.2f}×)")
        measured += bool(pairs)
        if not pairs:
            texts.append(f"{method} on {model}: not in both dtypes in one run")
    met = False if any(x < 1 for x in ratios) else (True if measured == len(BASELINES) else None)
    return Verdict("bf16 at least as fast as float32", met, "; ".join(texts))


COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


# the line tools/gpu_parts.py adds to a log whose pytest its time limit stopped (pytest, interrupted, still prints the
# counts of the tests run until then, as if they were all), and what an interrupted pytest prints
STOPPED = (gpu_parts.STOPPED, "KeyboardInterrupt")


def pytest_counts(path: Path) -> dict[str, int] | None:
    """The counts of pytest's last summary line in a log (None when it stopped before one, or was stopped at a time
    limit after it printed the counts of what it had run)."""
    lines = path.read_text(errors="replace").splitlines()
    if any(line.startswith(STOPPED) for line in lines):
        return None
    for line in reversed(lines):
        counts = COUNT.findall(line)
        if counts and (" in " in line or line.startswith("=")):
            return {("error" if k.startswith("error") else k): int(n) for n, k in counts}
    return None


def outcomes(path: Path) -> dict[str, str]:
    """Each test's outcome in a pytest JUnit file: passed, failed, skipped, carried (skipped for zoo weights the
    device call did not carry, tests/carried.py) or results (skipped for docs/results, which no call carries)."""
    each: dict[str, str] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            each[test] = "failed"
        elif (skipped := case.find("skipped")) is not None:
            message = skipped.get("message") or ""
            each[test] = ("skipped" if "not in this checkout" not in message else
                          "results" if "docs/results" in message else "carried")
        else:
            each[test] = "passed"
    return each


def suite(folders: list[Path]) -> Verdict:
    logs = found(folders, f"{LOG}.txt")
    failures = found(folders, f"{LOG}-failures.txt")
    bad, cut, texts = False, False, []
    for path in logs:
        counts = pytest_counts(path)
        if counts is None:
            cut = True
            texts.append(f"{where(path, folders)}: stopped before its end (a time limit)")
            continue
        bad |= bool(counts.get("failed") or counts.get("error"))
        texts.append(f"{where(path, folders)}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    # a log cut by its time limit has no summary, but the failures before the cut were written as they came
    for path in failures:
        failed = sum(line.startswith("=== ") for line in path.read_text(errors="replace").splitlines())
        if failed:
            bad = True
            texts.append(f"{where(path, folders)}: {failed} failures")
    if not logs and not failures:
        texts.append(f"not run: no {LOG}.txt")
    # a test skipped in every run for weights that were not there never ran on the device; one that reads the
    # committed results (no call carries them) computes nothing on a device, and runs in CI
    ran: dict[str, set[str]] = defaultdict(set)
    for path in found(folders, f"{LOG}.xml"):
        for test, outcome in outcomes(path).items():
            ran[test].add(outcome)
    never = sorted(t for t, o in ran.items() if "carried" in o and o <= {"carried", "results"})
    if ran:
        texts.append(f"{len(never)} tests skipped for weights that were not there"
                     + (f" ({', '.join(never[:5])}{', ...' if len(never) > 5 else ''})" if never else ""))
        texts.append(f"{sum(o == {'results'} for o in ran.values())} read only the committed results (CI runs them)")
    met = False if bad else (None if cut or not logs or never else True)
    return Verdict("suite with FASTDECODE_TEST_DEVICE=cuda", met, "; ".join(texts))


def where(path: Path, folders: list[Path]) -> str:
    """A found file as the table names it: its path below the folder given (the run's part folder, say)."""
    for folder in folders:
        if path.is_relative_to(folder):
            return str(path.relative_to(folder))
    return str(path)


# what the calls' logs (`PART-log.txt`, tools/results_gpu.py's lines) say went wrong or was not done
TROUBLE = {"failed": " FAILED", "skipped past --budget-s": "skipped: past --budget-s",
           "left out for a file": " left out: ",
           # tools/gpu_run.sh's `dlm` call where a slow start left it too little of its LIMIT for a stage
           "not run within a call's limit": "gpu_run.sh: not run within the call's limit"}


def troubles(folders: list[Path], shown: int = 10) -> list[str]:
    """The lines of the calls' logs that say a stage, run or method failed, was skipped for time, left out for a
    weights file that was not there or not run for the call's limit: a count of each, then the first `shown` lines
    (empty: none)."""
    hits: dict[str, list[str]] = {kind: [] for kind in TROUBLE}
    for path in found_logs(folders):
        for line in path.read_text(errors="replace").splitlines():
            for kind, mark in TROUBLE.items():
                if mark in line:
                    hits[kind].append(f"{path.name}: {line.strip()[:200]}")
    lines = [line for kind in TROUBLE for line in hits[kind]]
    if not lines:
        return []
    counts = ", ".join(f"{len(hits[kind])} {kind}" for kind in TROUBLE)
    return [f"In the calls' logs: {counts}", *(f"- {line}" for line in lines[:shown]),
            *([f"- ... and {len(lines) - shown} more"] if len(lines) > shown else [])]


def found_logs(folders: list[Path]) -> list[Path]:
    """The calls' logs: `PART-log.txt` (`log-PART.txt` in the committed runs of 2026-11-26 and -27)."""
    return sorted({p for folder in folders for name in ("*-log.txt", "log-*.txt") for p in folder.rglob(name)})


def verdicts(folders: list[Path], lossless: list[str]) -> list[Verdict]:
    return [identical(folders, lossless), zoo_speed(folders), *engine(folders), suite(folders), new_prompts(folders),
            dtypes(folders)]


def table(found: list[Verdict]) -> str:
    lines = ["| target | status | figures |", "|---|---|---|"]
    lines += [f"| {v.target} | {v.word} | {v.figures.replace('|', '/')} |" for v in found]
    return "\n".join(lines)


def lossless_methods() -> list[str]:
    import results_gpu  # the run's own list (it imports torch and transformers: only when asked)

    return list(results_gpu.LOSSLESS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders of a device run's files")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder: unpack each PART.tgz of the run into one, e.g. "
                         f"docs/results/gpu/DATE/PART/")
    results = verdicts(args.folders, lossless_methods())
    print(table(results))
    notes = troubles(args.folders)
    if notes:
        print("\n" + "\n".join(notes))
    return 0 if all(v.met for v in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
