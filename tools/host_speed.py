"""Tokens per second of `ar.greedy` on zoo:ar-small, one torch thread, in the two settings whose host work issue #30
cut (docs/gpu.md, "Host work per step"): bfloat16 in exact mode with the capture-free graphs (`graphs="replay"`,
the CPU's stand-in for CUDA graphs: the same static buffers and the same operations outside the graph) and float32
with the CPU defaults. Uses only `fastdecode.load` and `fastdecode.generate`, so that the same command runs from an
older checkout for a before/after pair (`PYTHONPATH=CHECKOUT python tools/host_speed.py --label before`). Appends
one JSONL row per setting to `--out`.

    python tools/host_speed.py --label after --out docs/results/exact/host-cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

import fastdecode
from fastdecode.bench.suites import get_suite
from fastdecode.bench.tasks import format_prompt

SETTINGS = {"bf16-exact-replay": {"dtype": "bfloat16", "exact": True, "graphs": "replay"},
            "fp32": {"dtype": "float32"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help="what code ran (e.g. before, after)")
    ap.add_argument("--items", type=int, default=2, help="code suite items")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    task, seed, _ = get_suite("code").plan()[0]
    prompts = [format_prompt(item.prompt) for item in task.items(seed, args.items)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(fastdecode.__file__).parent).stdout.strip()
    for name in args.settings:
        model = fastdecode.load("zoo:ar-small", device="cpu", **SETTINGS[name])
        fastdecode.generate(model, prompts[0], "ar.greedy", max_new_tokens=8)  # warm-up
        wall, cpu, tokens = time.perf_counter(), time.process_time(), 0
        for prompt in prompts:
            tokens += fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=args.new_tokens).stats.new_tokens
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        row = {"label": args.label, "setting": name, "params": SETTINGS[name], "model": "zoo:ar-small",
               "method": "ar.greedy", "items": args.items, "new_tokens": tokens, "threads": 1,
               "tokens_per_s": round(tokens / wall, 2), "cpu_ms_per_token": round(cpu / tokens * 1000, 2),
               "fastdecode": str(Path(fastdecode.__file__).parent), "commit": commit}
        print(json.dumps(row))
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
