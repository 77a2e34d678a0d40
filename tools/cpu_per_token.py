"""CPU milliseconds per generated token of ar.greedy, spec.suffix and spec.pld on six `code` items (zoo:ar-small,
one thread, 64 new tokens each): a quick check that a change to the engine costs nothing. Run it from two checkouts
alternately (`cd CHECKOUT && python tools/cpu_per_token.py`) and compare; CPU time moves less than wall time on a
shared machine. Prints one JSON line."""

from __future__ import annotations

import json
import time

import torch

import fastdecode
from fastdecode.bench.suites import get_suite
from fastdecode.bench.tasks import format_prompt

METHODS = ("ar.greedy", "spec.suffix", "spec.pld")


def main() -> None:
    torch.set_num_threads(1)
    model = fastdecode.load("zoo:ar-small")
    task, seed, _ = get_suite("code").plan()[0]
    prompts = [format_prompt(item.prompt) for item in task.items(seed, 6)]
    out = {}
    for method in METHODS:
        fastdecode.generate(model, prompts[0], method, max_new_tokens=8)  # warm-up
        start, tokens = time.process_time(), 0
        for prompt in prompts:
            tokens += fastdecode.generate(model, prompt, method, max_new_tokens=64).stats.new_tokens
        out[method] = round((time.process_time() - start) / tokens * 1000, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
