"""The sparse calibration file a model ships, made from the `longctx` suite's training items.

`python -m fastdecode.bench.calibration MODEL_FOLDER` runs `fastdecode.sparse.calibration.calibrate` (sparse.duo,
sparse.lychee and sparse.double read its record) on `longctx_prompts` and writes `sparse_calibration.json` beside
the weights, as the zoo's ar-long has it. The prompts are made here, on the benchmark's side, and handed in: the
sparse family never imports the benchmark.
"""

from __future__ import annotations

import argparse
import random

import torch

from ..sparse.calibration import calibrate, save
from .tasks import format_prompt
from .tasks.longctx import OPS


def longctx_prompts(items: int = 4, context: int = 1024, seed: int = 0) -> list[tuple[str, str]]:
    """(task, prompt) of `items` training items (train seeds, never a test item) of the long-context tasks in
    turn, each filled to about `context` tokens and wrapped in the zoo's template."""
    rng = random.Random(seed)
    prompts = []
    for i in range(items):
        task = OPS[i % len(OPS)]("1k")
        task.context = context
        item = task.make_item(random.Random(rng.randrange(1_000_000)))  # train seeds
        prompts.append((task.op, format_prompt(item.prompt)))
    return prompts


def main(argv: list[str] | None = None) -> None:
    """`python -m fastdecode.bench.calibration MODEL_FOLDER`: calibrate and write the file beside the weights."""
    from ..models.loading import load, resolve

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model", help="a model folder or zoo:NAME")
    ap.add_argument("--out", default=None, help="folder to write sparse_calibration.json to (default: the model's)")
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load(args.model)
    record = calibrate(model, longctx_prompts(args.items, args.context), context=args.context)
    save(record, args.out or resolve(args.model))


if __name__ == "__main__":
    main()
