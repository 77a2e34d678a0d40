"""The bench harness: every (method x test item x seed) of a suite, one generation at a time, one JSONL row each.

Rows are appended and flushed one by one, so an interrupted run leaves a valid file, and a re-run with
the same output skips the rows it already holds. The baseline (`ar.greedy` for causal models,
`dlm.baseline` for diffusion models) always runs in the same invocation, so `equal_to_baseline` and
speed ratios compare runs made on one machine. Generation is batch size 1, as Spec-Bench measures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import build_config
from ..engine import resolve
from ..errors import ResultsFileWarning
from ..models.base import ModelAdapter
from ..registry import get_method
from ..speculative.memory import DrafterMemory
from .evaluate import default_budget
from .jobs import Job, item_key, load_model, machine, make_row, precision, preflight, run_job, versions
from .suites import BenchError, Suite, get_suite

SCHEMA = 1
BASELINES = {"causal": "ar.greedy", "diffusion": "dlm.baseline"}


@dataclass(frozen=True)
class Progress:
    """Reported after every row (ran or skipped) and before each configuration's warm-up (all come first)."""

    done: int  # rows finished, skipped ones included
    total: int
    skipped: int  # rows found in the output file and not run again
    job: Job | None
    phase: str  # "warmup", "row" or "skip"


@dataclass
class BenchSummary:
    path: Path
    total: int
    written: int = 0
    skipped: int = 0
    methods: list[str] = field(default_factory=list)
    baseline: str = ""


def row_key(row: Mapping[str, Any]) -> str:
    """What makes a row unique: resuming skips a job whose key is already in the file."""
    fields = ("suite", "task", "item", "seed", "method", "params", "model", "draft")
    return json.dumps([row.get(k) for k in fields], sort_keys=True)


# -- the JSONL file --------------------------------------------------------------------------------

def check_out(path: str | Path) -> Path:
    """Refuse a results path that cannot be a file (a folder, or under a file), before any model loads."""
    p = Path(path)
    if p.is_dir():
        raise BenchError(f"The results file {p} is a folder: pass a file path, e.g. --out {p / 'results.jsonl'}.")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BenchError(f"The results file {p} would be inside {parent}, which is a file: "
                                 "pass a path in a folder.")
            break
    return p


# what every row holds; a JSON line without them (a number, a stray object) is not a row and is skipped
ROW_FIELDS = ("suite", "task", "item", "seed", "method", "model", "score", "new_tokens", "forwards", "wall_s")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results file, each key once.

    A truncated last line (a hard kill mid-write) is ignored; a complete last row without its newline is
    read. JSON lines that are not rows, and rows whose key an earlier row has (two writers at once), are
    skipped with a `ResultsFileWarning` naming the file and lines.
    """
    rows, _, _ = _scan(Path(path))
    return rows


def _is_row(row: Any) -> bool:
    return isinstance(row, dict) and all(k in row for k in ROW_FIELDS)


def _read_key(row: Mapping[str, Any]) -> str:
    """What the reader counts once: a job's row, except that baseline rows belong to their run (every invocation
    measures its own, which the report divides that run's rows by), so a re-measurement appended with a fresh
    baseline keeps both runs' baseline rows."""
    key = row_key(row)
    return key + json.dumps(row.get("run")) if row.get("is_baseline") else key


def _lines(numbers: Sequence[int]) -> str:
    shown = ", ".join(map(str, numbers[:10]))
    more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
    return f"line {shown}" if len(numbers) == 1 else f"lines {shown}{more}"


def _scan(path: Path) -> tuple[list[dict[str, Any]], int, bool]:
    """Rows, the byte length of the valid prefix, and whether that prefix lacks its final newline; refuses
    lines that are not JSON anywhere but at the end, skips (with a warning) JSON lines that are not rows and
    repeated keys."""
    if not path.exists():
        return [], 0, False
    if path.is_dir():
        raise BenchError(f"{path} is a folder, not a results file: pass the .jsonl files in it.")
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    valid, unterminated = 0, False
    not_rows: list[int] = []
    repeated: list[int] = []
    keys: set[str] = set()
    lines = data.split(b"\n")
    for n, line in enumerate(lines, start=1):
        last = n == len(lines)
        if not line.strip():
            valid += len(line) + (0 if last else 1)
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if last or all(not rest.strip() for rest in lines[n:]):
                break  # a row cut off by a hard kill: ignored, and cut off before the next row is appended
            raise BenchError(f"{path} line {n} is not a JSON row; the file is damaged. "
                             "Move it away or fix that line.") from None
        valid += len(line) + (0 if last else 1)
        unterminated = last
        if not _is_row(row):
            not_rows.append(n)
            continue
        key = _read_key(row)
        if key in keys:
            repeated.append(n)
            continue
        keys.add(key)
        rows.append(row)
    if not_rows:
        warnings.warn(f"{path} {_lines(not_rows)}: not a result row (a row is a JSON object with "
                      f"{', '.join(ROW_FIELDS)}); skipped. Remove the line(s) to silence this.",
                      ResultsFileWarning, stacklevel=3)
    if repeated:
        warnings.warn(f"{path} {_lines(repeated)}: the same job as an earlier row (two bench processes wrote "
                      "this file at once?); each job is counted once, from its first row. Remove the repeats "
                      "to silence this.", ResultsFileWarning, stacklevel=3)
    return rows, valid, unterminated


def _lock(handle: Any, path: Path) -> None:
    """An exclusive, non-blocking lock on the open results file, so that two bench processes never both
    run every job of one file; the second is refused, naming the first where the system tells."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): run unlocked, as before
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(path)
        who = f" (pid {holder})" if holder else ""
        raise BenchError(f"{path} is being written by another process{who}, probably another `fastdecode bench` "
                         "with the same --out: wait for it to finish (then run again to add what it lacks), or "
                         "pass another --out.") from None


def _lock_holder(path: Path) -> int | None:
    """The pid holding a flock on `path`, from /proc/locks (Linux); None where that cannot be told."""
    try:
        st = os.stat(path)
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] != "->":
                major, minor, inode = parts[5].split(":")
                if int(inode) == st.st_ino and os.makedev(int(major, 16), int(minor, 16)) == st.st_dev:
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def _open_for_append(path: Path) -> tuple[list[dict[str, Any]], Any]:
    """Existing rows, and the file locked and opened for appending after its last complete row."""
    check_out(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a", encoding="utf-8")
    try:
        _lock(handle, path)
        rows, valid, unterminated = _scan(path)
        if path.stat().st_size != valid:
            handle.truncate(valid)  # drop the partial line so the next row starts clean
        if unterminated:
            handle.write("\n")  # a complete last row without its newline: the next row starts on a line of its own
            handle.flush()
    except BaseException:
        handle.close()
        raise
    return rows, handle


# -- environment -----------------------------------------------------------------------------------

# -- planning --------------------------------------------------------------------------------------

def split_params(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """CLI `method.name=value` strings -> {method: {name: value}} (method names contain dots)."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        method, dot, name = key.strip().rpartition(".")
        if not sep or not dot or not method or not name:
            raise BenchError(f"Cannot read --param {item!r}: write it as method.name=value, "
                             "e.g. --param ar.sample.seed=1.")
        out.setdefault(method, {})[name] = value.strip()
    return out


@dataclasses.dataclass(frozen=True)
class Entry:
    """One --methods entry, parsed once: `dlm.baseline:cache=dual,block_length=16` -> method and its own values.

    An entry with parameters is a configuration of its own, so one run can compare several configurations of
    a method, the baseline's method included (`dlm.baseline:cache=dual` runs beside the plain baseline).
    """

    text: str
    method: str
    own: Mapping[str, str]

    @classmethod
    def parse(cls, text: str) -> Entry:
        name, sep, rest = text.partition(":")
        own: dict[str, str] = {}
        for part in rest.split(",") if sep else []:
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise BenchError(f"Cannot read --methods entry {text!r}: write it as method:name=value,name=value, "
                                 f"e.g. dlm.baseline:cache=dual.")
            own[key.strip()] = value.strip()
        return cls(text, name.strip(), own)


def plan_jobs(suite: Suite, entries: Sequence[Entry], baseline: str, params: Mapping[str, Mapping[str, Any]],
              seeds: Sequence[int] | None, limit: int | None, target: ModelAdapter) -> list[Job]:
    """Every job, the baseline's first; parameters are validated here, before anything runs.

    max_new_tokens defaults to `default_budget` for the target (a diffusion model's canvas, else the task's budget).
    """
    plan = suite.plan(list(seeds) if seeds else None, limit)
    items = {(task.name, seed): task.items(seed, n) for task, seed, n in plan}
    jobs = []
    for entry in entries:  # `--param METHOD.name` applies to every entry of METHOD; an entry's own values win
        spec = get_method(entry.method)
        given_here = {**params.get(entry.method, {}), **entry.own}
        for task, seed, _ in plan:
            given = {"max_new_tokens": default_budget(task, target), **given_here}
            cfg = dataclasses.asdict(build_config(spec.config, given, entry.method))
            spec.check_attention(cfg.get("attention"))  # refused while planning, before any row
            for index, item in enumerate(items[(task.name, seed)]):
                jobs.append(Job(task, item, index, seed, entry.method, cfg, entry.text == baseline, entry.text,
                                default_budget="max_new_tokens" not in given_here))
    return jobs


# -- running ---------------------------------------------------------------------------------------

def run_bench(
    suite: str | Suite,
    model: str | ModelAdapter,
    methods: Sequence[str],
    out: str | Path,
    *,
    draft: str | ModelAdapter | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    seeds: Sequence[int] | None = None,
    limit: int | None = None,
    warmup: bool = True,
    command: str | None = None,
    load_kwargs: Mapping[str, Any] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    ray_workers: int | None = None,
) -> BenchSummary:
    """Run `methods` (plus the baseline) on every test item of `suite`, appending one row per generation to `out`.

    `params` maps a method name to its parameters; `max_new_tokens` defaults to each task's budget.
    Rows already in `out` (same suite, task, item, seed, method, parameters, model and draft) are skipped.
    `ray=True` runs the jobs on a Ray cluster (`ray_address`, or Ray's default: RAY_ADDRESS or a local one), item by
    item on `ray_workers` workers (default: one per GPU, else per CPU), see `cluster.py`; this process writes `out`.
    """
    suite = get_suite(suite) if isinstance(suite, str) else suite
    check_out(out)
    asked = [Entry.parse(text) for text in dict.fromkeys(methods)]
    params = _check_request(suite, asked, params, seeds, limit)
    target, model_id = load_model(model, load_kwargs or {})
    assistant, draft_id = load_model(draft, load_kwargs or {})
    assert target is not None and model_id is not None
    baseline = BASELINES[target.kind]
    entries = [Entry.parse(baseline), *(e for e in asked if e.text != baseline)]
    order = [e.text for e in entries]
    for entry in entries:
        resolve(target, entry.method)  # a method that does not fit the model is refused here
    jobs = plan_jobs(suite, entries, baseline, params, seeds, limit, target)
    summary = BenchSummary(Path(out), len(jobs), methods=order, baseline=baseline)
    # `run` names this invocation: the report compares a configuration's speed with the baseline rows of its own runs
    meta = {"suite": suite.name, "model": model_id, "draft": draft_id, "baseline": baseline, "schema": SCHEMA,
            **versions(), "machine": machine(target.device), "command": command, "run": uuid.uuid4().hex[:12],
            **precision(target)}
    existing, handle = _open_for_append(summary.path)
    with handle:
        if ray:
            _execute_ray(jobs, existing, handle, model, draft, load_kwargs or {}, meta, summary, warmup,
                         on_progress or (lambda p: None), ray_address, ray_workers, target.device.type == "cuda")
        else:
            _execute(jobs, existing, handle, target, assistant, meta, summary, warmup,
                     on_progress or (lambda p: None))
    return summary


def _check_request(suite: Suite, entries: Sequence[Entry], params: Mapping[str, Mapping[str, Any]] | None,
                   seeds: Sequence[int] | None, limit: int | None) -> dict[str, dict[str, Any]]:
    """Refuse bad names, stray parameters and training seeds before any model is loaded."""
    checked = {m: dict(p) for m, p in (params or {}).items()}
    names = [e.method for e in entries]
    for name in [*names, *checked]:
        get_method(name)
    unused = sorted(set(checked) - set(names) - set(BASELINES.values()))
    if unused:
        given = " ".join(e.text for e in entries)
        raise BenchError(f"--param given for {', '.join(unused)}, which is not in --methods {given}.")
    suite.plan(list(seeds) if seeds else None, limit)
    return checked


def _execute(jobs: list[Job], existing: list[dict[str, Any]], handle: Any, target: ModelAdapter,
             assistant: ModelAdapter | None, meta: dict[str, Any], summary: BenchSummary, warmup: bool,
             report: Callable[[Progress], None]) -> None:
    """Skip the jobs already in the file, warm every configuration up, then run the rest item by item."""
    done_keys = {row_key(r) for r in existing}
    reference = {item_key(r): r["token_ids"] for r in existing
                 if r.get("is_baseline") and r.get("model") == meta["model"] and r.get("suite") == meta["suite"]}
    pending: dict[str, list[Job]] = {}
    for job in jobs:
        if _job_row_key(job, meta) in done_keys:
            summary.skipped += 1
            report(Progress(summary.skipped, summary.total, summary.skipped, job, "skip"))
        else:
            pending.setdefault(job.entry, []).append(job)
    preflight(target, assistant, [todo[0] for todo in pending.values()])
    if warmup:
        for todo in pending.values():
            report(Progress(summary.written + summary.skipped, summary.total, summary.skipped, todo[0], "warmup"))
            run_job(target, assistant, todo[0])
    # drafters that remember earlier requests (spec.suffix's global tree, spec.recycling's matrix: their method)
    # keep one memory per configuration, empty at its first measured row, so that neither the pre-flight and
    # warm-up runs (each with a memory of its own) nor another configuration's rows hand a row its own answer
    memories = {entry: DrafterMemory() for entry in pending}
    for job in _interleaved(pending):
        row = make_row(job, target, assistant, meta, reference, memories[job.entry])
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        if job.is_baseline:
            reference[item_key(row)] = row["token_ids"]
        summary.written += 1
        report(Progress(summary.written + summary.skipped, summary.total, summary.skipped, job, "row"))


def _execute_ray(jobs: list[Job], existing: list[dict[str, Any]], handle: Any, model: str | ModelAdapter,
                 draft: str | ModelAdapter | None, load_kwargs: Mapping[str, Any], meta: dict[str, Any],
                 summary: BenchSummary, warmup: bool, report: Callable[[Progress], None], address: str | None,
                 workers: int | None, cuda: bool) -> None:
    """`_execute` on Ray workers (`cluster.py`): the same skipped rows, the rows written here as items come back."""
    from .cluster import execute_on_ray

    done_keys = {row_key(r) for r in existing}
    reference = {item_key(r): r["token_ids"] for r in existing
                 if r.get("is_baseline") and r.get("model") == meta["model"] and r.get("suite") == meta["suite"]}
    pending = []
    for job in jobs:
        if _job_row_key(job, meta) in done_keys:
            summary.skipped += 1
            report(Progress(summary.skipped, summary.total, summary.skipped, job, "skip"))
        else:
            pending.append(job)
    if not pending:
        return

    def write(row: dict[str, Any]) -> None:
        handle.write(json.dumps(row) + "\n")
        handle.flush()
        summary.written += 1
        report(Progress(summary.written + summary.skipped, summary.total, summary.skipped, None, "row"))

    threads = torch.get_num_threads()
    execute_on_ray(pending, reference, write, model=model, draft=draft, load_kwargs=load_kwargs, meta=meta,
                   warmup=warmup, address=address, workers=workers, threads=threads, device_is_cuda=cuda)


def _interleaved(pending: Mapping[str, list[Job]]) -> list[Job]:
    """Item by item: every configuration's row of an item (the baseline's first), then the next item's. A slow
    spell of a shared machine then falls on every configuration alike, not on the one whose turn it is."""
    rank: dict[tuple[str, int, int], int] = {}
    for todo in pending.values():  # the baseline's jobs come first, in the plan's item order
        for job in todo:
            rank.setdefault((job.task.name, job.index, job.seed), len(rank))
    entry_rank = {entry: i for i, entry in enumerate(pending)}
    jobs = [job for todo in pending.values() for job in todo]
    return sorted(jobs, key=lambda j: (rank[(j.task.name, j.index, j.seed)], entry_rank[j.entry]))


def _job_row_key(job: Job, meta: Mapping[str, Any]) -> str:
    return row_key({"suite": meta["suite"], "task": job.task.name, "item": job.index, "seed": job.seed,
                    "method": job.method, "params": job.params, "model": meta["model"], "draft": meta["draft"]})


def iter_rows(paths: Sequence[str | Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(source file, row) over several results files, in order."""
    for p in paths:
        for row in read_rows(p):
            yield Path(p), row


def measure_overhead(model: str | ModelAdapter, suite: str = "quick", method: str = "ar.greedy", repeats: int = 3,
                     limit: int | None = None) -> dict[str, float]:
    """Harness time vs. calling `generate()` directly on the same items, alternating, median of `repeats`.

    Both sides generate every item of `suite` with the baseline and `method` once (after one shared
    warm-up); the harness side also plans, pre-flights, scores, writes and flushes the rows (no warm-up,
    one file per repeat).
    """
    import statistics
    import tempfile

    target, _ = load_model(model, {})
    assert target is not None
    baseline = BASELINES[target.kind]
    methods = list(dict.fromkeys([baseline, method]))  # the harness always runs the baseline too
    jobs = plan_jobs(get_suite(suite), [Entry.parse(m) for m in methods], baseline, {}, None, limit, target)
    for name in methods:
        run_job(target, None, next(j for j in jobs if j.method == name))
    direct, bench = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            start = time.perf_counter()
            memory = DrafterMemory()  # one per repeat, as the harness keeps one per configuration and run
            for job in jobs:
                run_job(target, None, job, memory)
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            run_bench(suite, target, [method], Path(tmp) / f"{r}.jsonl", limit=limit, warmup=False)
            bench.append(time.perf_counter() - start)
        # the harness's own work per row, timed without the generation: score, serialise, append, flush
        rows = read_rows(Path(tmp) / "0.jsonl")
        start = time.perf_counter()
        with (Path(tmp) / "again.jsonl").open("a", encoding="utf-8") as handle:
            for job, row in zip(jobs, rows, strict=True):  # one row per job
                job.task.score(job.item, row["output"])
                handle.write(json.dumps(row) + "\n")
                handle.flush()
        per_row = (time.perf_counter() - start) / len(rows)
    d, b = statistics.median(direct), statistics.median(bench)
    return {"generations": len(jobs), "direct_s": d, "harness_s": b, "overhead": (b - d) / d,
            "bookkeeping_ms_per_row": 1000 * per_row, "bookkeeping_share": per_row * len(jobs) / d}
