"""Decode time per token of sparse.streaming with positions="shift" and "original" against dense attention, on
zoo:ar-small (positions stretched 32x), after a 4096-token prompt: 24 decode steps, one thread, 3 interleaved
repeats, medians. What the position shift's re-rotation costs per step (issue #34).

    python tools/streaming_shift_speed.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import fastdecode
from fastdecode.attention import make_selector
from fastdecode.train.long import extend_positions

PROMPT, STEPS, REPEATS = 4096, 24, 3


def per_token(model: Any, cache: Any, sparse: Any) -> float:
    """Seconds per decode step after the prefilled prompt (the cache cropped back to it first)."""
    cache.crop(PROMPT)
    token = torch.tensor([[7]])
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(STEPS):
            logits = model.forward(token, torch.tensor([[PROMPT + i]]), cache, sparse=sparse)
            token = logits[:, -1:].argmax(-1)
    return (time.perf_counter() - start) / STEPS


def main() -> None:
    torch.set_num_threads(1)
    model = fastdecode.load("zoo:ar-small")
    extend_positions(model.model, "linear", 32.0, 32768)
    ids = torch.randint(5, 300, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(capacity=PROMPT + STEPS + 8)
    model.forward(ids, torch.arange(PROMPT)[None], cache)
    rules = {"dense": "dense", "shift": "streaming:budget=256", "original": "streaming:budget=256,positions=original"}
    times: dict[str, list[float]] = {name: [] for name in rules}
    for _ in range(REPEATS):
        for name, rule in rules.items():
            times[name].append(per_token(model, cache, make_selector(rule, model)))
    for name, seconds in times.items():
        print(f"{name}: {1000 * statistics.median(seconds):.1f} ms/token")


if __name__ == "__main__":
    main()
