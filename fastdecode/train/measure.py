"""What a trained drafter head's card states: τ and the acceptance per draft position of the method that decodes
with it, measured on held-out test items (greedy, lossless, batch of rows at once)."""

from __future__ import annotations

from typing import Any

from ..bench.suites import SUITES
from ..bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from ..engine import generate


def suite_prompts(suite: str, per_task: int) -> list[str]:
    """The first `per_task` test items of each task of `suite`, formatted as the bench formats them."""
    return [format_prompt(item.prompt) for name, _ in SUITES[suite].tasks
            for item in TASKS[name].items(DEFAULT_TEST_SEED, per_task)]


def measure_tau(target: Any, method: str, params: dict[str, Any], prompts: list[str],
                max_new_tokens: int = 256) -> dict[str, Any]:
    """τ (tokens per target forward, the bonus token included) and, per draft position k, the share of target
    forwards whose position-k draft token was accepted, over `prompts` decoded greedily by `method`."""
    results = generate(target, prompts, method, max_new_tokens=max_new_tokens, **params)
    tokens = sum(r.stats.new_tokens for r in results)
    forwards = sum(r.stats.forwards for r in results)
    depth = max((len(r.stats.accepted_per_position) for r in results), default=0)
    per_position = [sum(r.stats.accepted_per_position[k] for r in results if k < len(r.stats.accepted_per_position))
                    for k in range(depth)]
    return {"method": method, "items": len(prompts), "tokens": tokens, "forwards": forwards,
            # per item, in order: what a test re-measures on a few of them
            "item_tokens": [r.stats.new_tokens for r in results], "item_forwards": [r.stats.forwards for r in results],
            "tau": round(tokens / forwards, 3) if forwards else 0.0,
            "accept_per_position": [round(a / forwards, 3) for a in per_position] if forwards else []}
