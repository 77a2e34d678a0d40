"""Does a zoo model's card hold with its weights rounded to bfloat16? (docs/zoo.md, "Weights in bfloat16")

Exports the committed model as `fastdecode train` would (fastdecode/train/export.py, dtype bfloat16) into a
temporary folder, evaluates it with the zoo's own evaluation (fastdecode/train/zoo.py: evaluate_zoo_model, which
loads the weights back as float32) and prints its figures beside the card's as one JSON line per model (also
written to --out, which `tools/measured.py` quotes in docs/zoo.md: docs/results/zoo/bf16.jsonl).

    python tools/zoo_bf16.py ar-small ar-tiny dlm-small --items 50 --out docs/results/zoo/bf16.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fastdecode.models.loading import load  # noqa: E402
from fastdecode.train.export import save_folder  # noqa: E402
from fastdecode.train.recipes import RECIPES  # noqa: E402
from fastdecode.train.zoo import evaluate_zoo_model, zoo_folder  # noqa: E402

CARD_JSON = "## Measured on the test split"


def card_metrics(name: str) -> dict:
    text = (zoo_folder(name) / "README.md").read_text(encoding="utf-8")
    return json.loads(text.split(CARD_JSON, 1)[1].split("```json", 1)[1].split("```", 1)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(RECIPES))
    parser.add_argument("--items", type=int, default=50, help="test items per task (the cards use 50)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the rows here (replaced)")
    args = parser.parse_args()
    rows = []
    torch.set_num_threads(args.threads)
    for name in args.names:
        start = time.perf_counter()
        adapter = load(f"zoo:{name}", device="cpu", dtype="float32")
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            save_folder(adapter.model, adapter.tokenizer, folder, [], dtype="bfloat16")
            size = (folder / "model.safetensors").stat().st_size
            got = evaluate_zoo_model(RECIPES[name], folder, args.items)
        card = card_metrics(name)
        row = {"model": name, "items_per_task": args.items, "card_items_per_task": card["items_per_task"],
               "bf16_megabytes": round(size / 1e6, 1),
               "fp32_megabytes": round((zoo_folder(name) / "model.safetensors").stat().st_size / 1e6, 1),
               "accuracy_bf16": got["accuracy"], "accuracy_card": card["accuracy"],
               "mean_bf16": got["mean_deterministic_list_accuracy"],
               "mean_card": card["mean_deterministic_list_accuracy"]}
        for key in ("code_bits_per_byte", "code_similarity", "greedy_agreement_with_ar_small"):
            if key in got:
                row[f"{key}_bf16"], row[f"{key}_card"] = got[key], card.get(key)
        row["minutes"] = round((time.perf_counter() - start) / 60, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
