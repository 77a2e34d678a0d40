"""Measure a shipped head's card again with the card's own method, parameters and items, and rewrite card.json and
README.md with the result (per-item counts included, which `tests/unit/test_shipped_heads.py` re-checks on a few
items). Greedy decoding is deterministic for a thread count, so τ only changes if the head or the code did.

    python tools/remeasure_head_card.py fastdecode/zoo/ar-small/heads/eagle3 --threads 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import fastdecode
from fastdecode.train.head_card import CARD_JSON, write_card
from fastdecode.train.measure import measure_tau, suite_prompts
from fastdecode.train.objectives import head_objective


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    card = json.loads((args.folder / CARD_JSON).read_text())
    measured = card["measured"]
    target = fastdecode.load(card["target"], device="cpu", dtype="float32")
    prompts = suite_prompts(measured["suite"], measured["per_task"])
    again = measure_tau(target, measured["method"], {**measured["params"], "head": str(args.folder)}, prompts)
    card["measured"] = {**measured, **{k: v for k, v in again.items() if k != "method"}}
    command, threads = card.pop("command"), card.pop("threads")
    write_card(args.folder, card, command, threads, head_objective(card["kind"]).card_lines(card["options"]))
    print(json.dumps({k: card["measured"][k] for k in ("tau", "accept_per_position")}))


if __name__ == "__main__":
    main()
