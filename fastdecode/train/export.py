"""Save a trained zoo model as a Hugging Face folder with its model card and loss log."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from .objectives import objective
from .recipes import Recipe

# the weights' dtype on disk: bfloat16 halves a zoo model's size; the zoo cards' accuracies hold with the weights
# rounded to it (docs/zoo.md, "Weights in bfloat16"); loading casts back to the dtype asked for (float32 on CPU)
EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def save_folder(model, tokenizer, folder: Path, log: list[dict], dtype: str = "bfloat16") -> None:
    """Write the model's weights in `dtype` (a name of EXPORT_DTYPES), its tokenizer and a thinned loss log."""
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"Unknown export dtype {dtype!r}; choose one of {sorted(EXPORT_DTYPES)}.")
    folder.mkdir(parents=True, exist_ok=True)
    # a copy: the trained model itself keeps its float32 weights; transformers 5 writes safetensors only
    copy.deepcopy(model).to(EXPORT_DTYPES[dtype]).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with open(folder / "train_log.jsonl", "w") as f:
        for row in log[:: max(1, len(log) // 200)]:  # a thinned log keeps the package small
            f.write(json.dumps(row) + "\n")


def write_card(folder: Path, recipe: Recipe, command: str, minutes: float, threads: int, metrics: dict) -> None:
    from ..train.data import DEFAULT_MIXTURE

    mixture = {**DEFAULT_MIXTURE, **recipe.mixture}
    lines = [
        f"# {recipe.name}", "", recipe.description + ".", "",
        "## Reproduce", "", "```bash", command, "```", "",
        f"Trained in {minutes:.1f} minutes on this project's 2-core CPU machine "
        f"({threads} torch thread{'s' if threads != 1 else ''}), "
        f"{recipe.steps} steps of about {recipe.batch_tokens} tokens"
        + (f" (rows of {recipe.pack_len} tokens packed with whole examples)" if recipe.pack_len else "")
        + (", bfloat16 autocast" if recipe.bf16 else "")
        + f", AdamW lr {recipe.lr}, warm-up {recipe.warmup}, cosine to 10%.",
        "", "## Shape", "",
        f"hidden {recipe.hidden_size}, layers {recipe.num_layers}, "
        f"heads {recipe.num_heads} (kv {recipe.num_kv_heads}), "
        f"MLP {recipe.intermediate_size}, vocabulary {recipe.vocab_size}, positions 512, objective `{recipe.objective}`"
        + (f", initialised from `{recipe.init_from}`" if recipe.init_from else "") + ".",
        "", "## Data mixture (train seeds only; the first test prompts of every task are removed)", "",
        ", ".join(f"`{k}` {v:g}" for k, v in sorted(mixture.items())), "",
        *objective(recipe.objective).card_lines(recipe),
        *([f"Curriculum: the first {recipe.curriculum_steps} steps draw only from "
           + ", ".join(f"`{k}` {v:g}" for k, v in sorted(recipe.curriculum.items())) + ".", ""]
          if recipe.curriculum_steps else []),
        "## Measured on the test split", "", "```json", json.dumps(metrics, indent=2), "```", "",
    ]
    (folder / "README.md").write_text("\n".join(lines))
