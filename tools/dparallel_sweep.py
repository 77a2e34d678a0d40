"""Stricter commit rules on a dParallel student (docs/diffusion.md, "dParallel"): accuracy and TPF of each
`METHOD:NAME=VALUE,...` configuration on the first 10 test items of every parallel-lists task (blocks of 16, the
task's fitted canvas, batch of one, one thread), one JSON line each, with the tasks that have several right answers.

    python tools/dparallel_sweep.py zoo:dlm-small-dparallel dlm.threshold:threshold=0.95 ... > FILE.jsonl
"""

from __future__ import annotations

import json
import sys

import torch

import fastdecode
from fastdecode.bench.evaluate import default_budget
from fastdecode.bench.suites import SUITES
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt

PER_TASK = 10


def run(model, spec: str) -> dict:
    method, _, settings = spec.partition(":")
    params = {k: float(v) for k, v in (p.split("=") for p in settings.split(",") if p)}
    per: dict[str, list[float]] = {}
    for name, _ in SUITES["parallel-lists"].tasks:
        task = TASKS[name]
        for item in task.items(DEFAULT_TEST_SEED, PER_TASK):
            r = fastdecode.generate(model, format_prompt(item.prompt), method,
                                    max_new_tokens=default_budget(task, model), block_length=16, **params)
            p = per.setdefault(name, [0.0, 0, 0])
            p[0] += task.score(item, r.text)
            p[1] += r.stats.new_tokens
            p[2] += r.stats.forwards
    n = PER_TASK * len(per)
    return {"config": spec, "items": n, "accuracy": round(sum(v[0] for v in per.values()) / n, 4),
            "tpf": round(sum(v[1] for v in per.values()) / sum(v[2] for v in per.values()), 3),
            "several_answers": {k: {"correct": v[0], "tpf": round(v[1] / v[2], 2)} for k, v in per.items()
                                if not TASKS[k].deterministic}}


def main() -> None:
    torch.set_num_threads(1)
    model = fastdecode.load(sys.argv[1], dtype="float32")
    for spec in sys.argv[2:]:
        print(json.dumps({"model": sys.argv[1], **run(model, spec)}), flush=True)


if __name__ == "__main__":
    main()
