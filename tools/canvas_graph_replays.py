"""How many of a diffusion method's forwards the canvas graphs replay (models/canvas_graphs.py), with and without the
shape buckets: a count that does not depend on the hardware, so the CPU measures it with the capture-free graphs
(`graphs="replay"`), which keep the same books as CUDA graphs.

Each (method, buckets) runs a `fastdecode bench` suite (parallel-lists unless `--suite`) on zoo:dlm-small (`--limit`
items per task, no warm-up, so every shape starts unseen; the method's rows and its baseline's, `dlm.baseline`, in
one model) and writes one JSON row: eager forwards, captures, replays, the share replayed.

    python tools/canvas_graph_replays.py --out docs/results/exact/canvas-graphs.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.harness import run_bench  # noqa: E402

METHODS = ["dlm.baseline", "dlm.threshold", "dlm.freedave", "dlm.learn2pd"]


def measure(method: str, buckets: bool, limit: int, suite: str) -> dict:
    model = fastdecode.load("zoo:dlm-small", device="cpu", graphs="replay")
    assert model.graphs is not None
    if not buckets:
        model.graphs.bucket = model.graphs.bucket_columns = 1
    with tempfile.TemporaryDirectory() as tmp:
        run_bench(suite, model, [method], Path(tmp) / "rows.jsonl", limit=limit, warmup=False)
        items = sum(1 for _ in open(Path(tmp) / "rows.jsonl"))
    stats = dict(model.graphs.stats)
    total = sum(stats.values())
    return {"method": method, "baseline": "dlm.baseline", "model": "zoo:dlm-small", "suite": suite,
            "limit": limit, "rows": items, "buckets": [model.graphs.bucket, model.graphs.bucket_columns], **stats,
            "forwards": total, "replayed": round(stats["replays"] / total, 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSONL file to write (replaced)")
    ap.add_argument("--limit", type=int, default=2, help="items per task (default 2)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--suite", default="parallel-lists", help="a suite zoo:dlm-small runs (default parallel-lists)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    command = " ".join(["python", "tools/canvas_graph_replays.py", *(argv if argv is not None else sys.argv[1:])])
    rows = []
    for method in args.methods:
        for buckets in (True, False):
            row = {**measure(method, buckets, args.limit, args.suite), "commit": commit.stdout.strip(),
                   "command": command}
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
