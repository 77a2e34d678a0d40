"""Self-distilled data for drafter heads: prompts of the zoo tasks' training seeds with the target's own greedy
answers, regenerated once per (target, seed, size) and cached, so every head kind trained on that target reuses it.

A head that learns the training references instead of what the target actually says drafts worse (EAGLE #276:
τ ≈ 1.9). Answers come from the engine's batched `ar.greedy` (items of one task together, so a batch's rows end at
about the same step); regeneration appends to a partial file as it goes, so an interrupted run picks up where it
stopped. The cache lives in `$FASTDECODE_CACHE/selfdata/` (default `~/.cache/fastdecode/selfdata/`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..bench.tasks import TASKS, format_prompt
from ..engine import generate
from ..errors import ParameterError, close_names
from .data import DEFAULT_MIXTURE, Example, item_stream

Report = Callable[[str, int, int, dict[str, float]], None]  # (phase, done, total, metrics)
DEFAULT_ITEMS = 4000  # ≈ 0.3 M answer tokens from ar-small, ≈ 6 minutes of batched greedy decoding on one thread
BATCH = 32  # rows per greedy batch
MIN_ANSWER = 16  # an item whose prompt leaves fewer positions than this to answer in is skipped


def cache_root() -> Path:
    return Path(os.environ.get("FASTDECODE_CACHE") or Path.home() / ".cache" / "fastdecode").expanduser() / "selfdata"


def fingerprint(target: Any) -> str:
    """A short hash of the target's config and output layer: a retrained target gets new data."""
    config = {k: v for k, v in target.config.to_dict().items() if k != "_name_or_path"}  # not where it was loaded
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    weight = target.model.get_output_embeddings().weight.detach().float().cpu()
    h.update(weight[:: max(1, weight.shape[0] // 64)].contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def data_path(target: Any, seed: int, n_items: int, tasks: tuple[str, ...] = ()) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(getattr(target, "name", "") or "model")).strip("_")
    mix = "-" + hashlib.sha256(",".join(tasks).encode()).hexdigest()[:8] if tasks else ""
    return cache_root() / f"{name}-{fingerprint(target)}-seed{seed}-n{n_items}{mix}.jsonl"


def mixture(tasks: tuple[str, ...] = ()) -> dict[str, float]:
    """The default task mixture, or the named tasks with equal weights (refusing an unknown one)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ParameterError(f"Unknown task(s) {unknown} for self-distilled data. {close_names(unknown[0], TASKS)}")
    return {t: 1.0 for t in tasks} if tasks else dict(DEFAULT_MIXTURE)


def self_distilled(target: Any, seed: int = 0, n_items: int = DEFAULT_ITEMS, report: Report | None = None,
                   batch: int = BATCH, tasks: tuple[str, ...] = ()) -> list[Example]:
    """`n_items` training items of the default task mixture (or of `tasks`; seed `seed`), each encoded as BOS +
    prompt + the target's greedy answer (through its EOS, or cut by the task's budget or the model's last
    position), regenerated or read from the cache. Items whose prompt leaves no room to answer are skipped."""
    path = data_path(target, seed, n_items, tasks)
    if path.is_file():
        return _read(path)
    started = time.perf_counter()
    tok = target.tokenizer
    limit = target.max_positions or 1 << 30
    stream = ((i, tok(format_prompt(i.prompt), add_special_tokens=True)["input_ids"])
              for i in item_stream(mixture(tasks), seed))
    kept = list(itertools.islice(((i, p) for i, p in stream if len(p) + MIN_ANSWER <= limit), n_items))
    items, prompts = [i for i, _ in kept], [p for _, p in kept]
    partial = path.with_suffix(".partial")
    done = {int(row["index"]): row for row in _rows(partial)} if partial.is_file() else {}
    todo = sorted((i for i in range(n_items) if i not in done), key=lambda i: (items[i].task, len(items[i].prompt)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("a") as out:
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            ids = [prompts[i] for i in chunk]
            budget = min(max(TASKS[items[i].task].max_new_tokens for i in chunk), limit - max(map(len, ids)))
            with torch.inference_mode():
                results = generate(target, ids, "ar.greedy", max_new_tokens=budget)
            for i, prompt, r in zip(chunk, ids, results, strict=True):
                row = {"index": i, "task": items[i].task, "prompt": prompt, "answer": list(r.token_ids)}
                done[i] = row
                out.write(json.dumps(row) + "\n")
            out.flush()
            if report is not None:
                report("data", len(done), n_items, {"tokens": float(sum(len(r["answer"]) for r in done.values()))})
    rows = [done[i] for i in range(n_items)]
    path.with_suffix(".meta.json").write_text(json.dumps({
        "seconds": round(time.perf_counter() - started, 1), "items": n_items,
        "answer_tokens": sum(len(r["answer"]) for r in rows), "threads": torch.get_num_threads()}) + "\n")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial.unlink()
    return [_example(r) for r in rows]


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by an interrupted write: regenerated
            continue
    return rows


def _read(path: Path) -> list[Example]:
    return [_example(r) for r in _rows(path)]


def _example(row: dict) -> Example:
    return Example(list(row["prompt"]) + list(row["answer"]), len(row["prompt"]), str(row["task"]))


def regeneration(target: Any, seed: int, n_items: int, tasks: tuple[str, ...] = ()) -> dict[str, Any]:
    """How the cached data was made (seconds, items, answer tokens, threads), as recorded when it was; {} if unknown
    (seconds count the last run only when a regeneration was interrupted and resumed)."""
    meta = data_path(target, seed, n_items, tasks).with_suffix(".meta.json")
    return json.loads(meta.read_text()) if meta.is_file() else {}
