"""How much of dlm-small's training canvas is EOS padding: per task, answer tokens (+ EOS) against the budget.

dlm-small is trained as LLaDA's SFT is, each answer padded with EOS to a fixed length (the task's
`max_new_tokens`), and decoded on a canvas of that length. The budget is tokenizer-independent (one token per
two characters), so with the zoo tokenizer most of each padded answer is EOS. Prints a Markdown table.

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
    print("| task | weight | budget (canvas) | answer + EOS, mean | longest | EOS share of the padded answer |")
    print("|---|---:|---:|---:|---:|---:|")
    total_answer = total_canvas = 0.0
    for name, weight in mixture.items():
        task = TASKS[name]
        if name.startswith("code"):
            continue
        items = task.items(TRAIN_SEEDS.start, args.items)
        lengths = [len(tokenizer(i.reference, add_special_tokens=False)["input_ids"]) + 1 for i in items]
        mean = sum(lengths) / len(lengths)
        total_answer += weight * mean
        total_canvas += weight * task.max_new_tokens
        print(f"| {name} | {weight:g} | {task.max_new_tokens} | {mean:.1f} | {max(lengths)} | "
              f"{100 * (1 - mean / task.max_new_tokens):.0f} % |")
    print(f"\nWeighted by the mixture (code left out): {100 * (1 - total_answer / total_canvas):.0f} % of the padded "
          f"answer tokens are EOS padding.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
