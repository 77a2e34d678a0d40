"""A trained head's card: README.md of measured numbers and card.json (the same numbers, for the test that checks
the card's claim), written by the training loop beside the head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CARD_JSON = "card.json"


def _pct(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def write_card(folder: Path, card: dict[str, Any], command: str, threads: int, lines: list[str]) -> None:
    """README.md and card.json in `folder`, from the loop's numbers (`train_head`'s return value)."""
    (folder / CARD_JSON).write_text(json.dumps({**card, "command": command, "threads": threads}, indent=2) + "\n")
    data, held, training = card["data"], card["held_out"], card["training"]
    accs = [held[k] for k in sorted(held) if k.startswith("acc")]
    layers = card["target_layers"] or "the last hidden state only"
    text = [
        f"# {card['kind']} head for {card['target']}",
        "",
        f"A `{card['kind']}` drafter head trained against the frozen `{card['target']}` by fastdecode's head-training "
        f"loop (`fastdecode/train/heads.py`), seed {card['seed']}, {threads} thread(s). Reproduce:",
        "",
        "```",
        command,
        "```",
        "",
        *lines,
        f"Options: `{json.dumps(card['options'])}`; target layers read: {layers}. Weights in bfloat16.",
        "",
        "## Data",
        "",
        f"Self-distilled: {data['items']} items of the default task mixture (training seeds), the prompts with "
        f"`{card['target']}`'s own greedy answers (batched `ar.greedy`, {data['regeneration_s']:.0f} s, cached under "
        f"`~/.cache/fastdecode/selfdata/`); {data['train_items']} train ({data['answer_tokens']:,} answer tokens), "
        f"the last {data['items'] - data['train_items']} held out.",
        "",
        "## Training",
        "",
        f"{training['steps']} AdamW steps, peak lr {training['lr']}, ≤ {training['batch_tokens']} padded tokens a "
        f"batch: {card['trained_tokens']:,} tokens through the target, of which "
        f"{card['trained_answer_tokens']:,} answer tokens the heads learned from; {card['train_s'] / 60:.1f} min "
        f"(regeneration not included). Loss log: `train_log.jsonl`.",
        "",
        "## Measured",
        "",
        f"Held-out top-1 agreement with the target per draft position (head 0 first): {_pct(accs)}.",
        "",
    ]
    measured = card.get("measured")
    if measured:
        text += [
            f"`{measured['method']}` ({json.dumps(measured['params'])}, greedy, lossless) on the first "
            f"{measured['per_task']} test items of every parallel-lists task ({measured['items']} items): "
            f"**τ = {measured['tau']:.2f}** tokens per target forward; share of target forwards whose draft "
            f"position k was accepted: {_pct(measured['accept_per_position'])}.",
            "",
            "`tests/unit/test_shipped_heads.py` measures τ again on these items and checks it against this card.",
            "",
        ]
    (folder / "README.md").write_text("\n".join(text))
