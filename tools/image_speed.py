"""Forwards per image, mean accepted length and wall time at batch 1 of image decoding methods beside ar.sample,
in one run (issue #33's speed bars for spec.sjd, its MC-SJD coupling, spec.lantern, spec.gsd and img.zipar).

Each method generates the same labels (class i for image i, `--per-class` of each) one image at a time at batch 1
with the same seeds, the methods taking turns per image so a slow spell of a shared machine falls on all of them.
One JSONL row per (method configuration): forwards per image, tokens per forward (the mean accepted length τ of a
speculative method, the bonus token included), accepted drafts per forward, seconds per image, and the ratios to
ar.sample's row of the same run. Quality is not measured here (img-eval's suite scores samples).

    python tools/image_speed.py --model zoo:img-ar --per-class 2 --threads 1 \
        --out docs/results/image/speed.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402

# (label, method, parameters): the configurations the bars compare, at temperature 1 and the model's own guidance
CONFIGS: list[tuple[str, str, dict]] = [
    ("ar.sample", "ar.sample", {}),
    ("spec.sjd (window=16)", "spec.sjd", {"window": 16}),
    ("spec.sjd (window=16, coupling)", "spec.sjd", {"window": 16, "coupling": True}),
    ("spec.lantern (delta=0.1, k=4)", "spec.lantern", {"window": 16, "delta": 0.1, "k": 4}),
    ("spec.lantern (delta=0.1, k=8)", "spec.lantern", {"window": 16, "delta": 0.1, "k": 8}),
    ("spec.lantern (delta=0.2, k=8)", "spec.lantern", {"window": 16, "delta": 0.2, "k": 8}),
    ("spec.gsd (ranks=7, prob_gap=0.3, max_dist=1)", "spec.gsd", {"window": 16, "ranks": 7, "prob_gap": 0.3,
                                                                  "max_dist": 1.0}),
    ("spec.gsd (ranks=7, prob_gap=0.15, max_dist=0.5)", "spec.gsd", {"window": 16, "ranks": 7, "prob_gap": 0.15,
                                                                     "max_dist": 0.5}),
    ("img.zipar (window=2)", "img.zipar", {"window": 2}),
    ("img.zipar (window=3)", "img.zipar", {"window": 3}),
]


def run(model, label: str, method: str, params: dict, prompt: str, seed: int) -> dict:
    start = time.perf_counter()
    r = fastdecode.generate(model, prompt, method, temperature=1.0, seed=seed, **params)
    s = r.stats
    return {"label": label, "seconds": time.perf_counter() - start, "forwards": s.forwards,
            "tokens": s.new_tokens, "accepted": s.accepted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:img-ar")
    ap.add_argument("--per-class", type=int, default=2, help="images per class label, per method")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="labels to run (ar.sample always runs)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "image" / "speed.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model)
    labels = [str(c) for c in range(10) for _ in range(args.per_class)]
    configs = [c for c in CONFIGS if args.only is None or c[0] == "ar.sample" or c[0] in args.only]
    for label, method, params in configs:  # warm-up: one image each
        run(model, label, method, params, "0", args.seed)
    found: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for i, prompt in enumerate(labels):
        for label, method, params in configs:
            found[label].append(run(model, label, method, params, prompt, args.seed + i))
        print(f"image {i + 1}/{len(labels)}", file=sys.stderr, flush=True)
    base = _summary(found["ar.sample"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "python tools/image_speed.py " + " ".join(sys.argv[1:])
    with args.out.open("a") as f:
        for label, method, params in configs:
            row = {"suite": "image-speed", "model": args.model, "label": label, "method": method,
                   "params": {"temperature": 1.0, **params}, "images": len(labels), "batch": 1,
                   "threads": args.threads, **_summary(found[label]), "command": command}
            row["forwards_vs_ar"] = row["forwards_per_image"] / base["forwards_per_image"]
            row["speedup_vs_ar"] = base["seconds_per_image"] / row["seconds_per_image"]
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row))


def _summary(rows: list[dict]) -> dict:
    n = len(rows)
    forwards = sum(r["forwards"] for r in rows)
    return {"forwards_per_image": forwards / n, "tokens_per_forward": sum(r["tokens"] for r in rows) / forwards,
            "accepted_per_forward": sum(r["accepted"] for r in rows) / forwards,
            "seconds_per_image": sum(r["seconds"] for r in rows) / n}


if __name__ == "__main__":
    main()
