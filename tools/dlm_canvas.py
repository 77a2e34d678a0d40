"""How much of dlm-small's training canvas is EOS padding: per task, answer tokens (+ EOS) against the canvas.

dlm-small is trained as LLaDA's SFT is, each answer padded with EOS to a fixed length, and decoded on a canvas
of that length. Up to v4 that length was the task's `max_new_tokens`, a tokenizer-independent budget (one token
per two characters), so with the zoo tokenizer most of each padded answer was EOS; since v5 it is
`Task.canvas_length` (fitted to the tokenizer). Prints a Markdown table of both.

    python tools/dlm_canvas.py [--items 500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastdecode.bench.tasks import TASKS, TRAIN_SEEDS  # noqa: E402
from fastdecode.train.data import DEFAULT_MIXTURE  # noqa: E402
from fastdecode.train.recipes import get_recipe  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=500, help="training items per task")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ROOT / "fastdecode" / "zoo" / "ar-small"))
    mixture = {**DEFAULT_MIXTURE, **get_recipe("dlm-small").mixture}
    print("| task | weight | answer + EOS, mean | longest | budget | EOS share | fitted canvas | EOS share |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    total_answer = total_budget = total_canvas = 0.0
    for name, weight in mixture.items():
        task = TASKS[name]
        if name.startswith("code"):
            continue
        items = task.items(TRAIN_SEEDS.start, args.items)
        lengths = [len(tokenizer(i.reference, add_special_tokens=False)["input_ids"]) + 1 for i in items]
        mean = sum(lengths) / len(lengths)
        canvas = task.canvas_length(tokenizer)
        total_answer += weight * mean
        total_budget += weight * task.max_new_tokens
        total_canvas += weight * canvas
        print(f"| {name} | {weight:g} | {mean:.1f} | {max(lengths)} | {task.max_new_tokens} | "
              f"{100 * (1 - mean / task.max_new_tokens):.0f} % | {canvas} | {100 * (1 - mean / canvas):.0f} % |")
    print(f"\nWeighted by the mixture (code left out), EOS padding is {100 * (1 - total_answer / total_budget):.0f} % "
          f"of the padded answer tokens on the budgets and {100 * (1 - total_answer / total_canvas):.0f} % on the "
          f"fitted canvases.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
