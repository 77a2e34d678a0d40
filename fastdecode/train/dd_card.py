"""The card of a Distilled Decoding network: README.md of measured numbers and card.json (the same numbers, read by
tests/image/test_dd_shipped.py, which measures the claim again on a few rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CARD_JSON = "card.json"


def write_dd_card(folder: Path, card: dict[str, Any], command: str, threads: int) -> None:
    (folder / CARD_JSON).write_text(json.dumps({**card, "command": command, "threads": threads}, indent=2) + "\n")
    kind = card["kind"]
    what = {"dd1": "Distilled Decoding 1 (1- or 2-step) network", "dd2": "Distilled Decoding 2 one-step generator"}
    text = [f"# {kind}: {what.get(kind, kind)} for {card['teacher']}", "",
            f"Trained by `fastdecode train {kind}` (fastdecode/train/{kind}.py), seed {card['seed']}, {threads} "
            "thread(s); method `img." + kind + "`; choices and measurements in docs/image-dd.md. Reproduce:", "",
            "```", command, "```", "",
            f"Settings: `{json.dumps(card['training'])}`. Weights in bfloat16 (safetensors).", "", "## Measured", ""]
    if kind == "dd1":
        agree = card["held_out_agreement"]
        text += [f"Started from: {card.get('init', 'teacher')}. Teacher pairs made in {card['data_s']:.0f} s; "
                 f"training {card['train_s'] / 60:.1f} min; last loss "
                 f"`{json.dumps(card['final_loss'])}`.", "",
                 f"{card['training']['eval_rows']} fresh pairs (their own seed, never trained on): share of codes "
                 f"equal to the teacher's mapped codes for the same noise: 1 step **{agree['1-step']:.3f}**, 2 steps "
                 f"**{agree['2-step']:.3f}**.", ""]
    else:
        text += [f"Generator initialised from `{card['init']}`; training {card['train_s'] / 60:.1f} min; last step "
                 f"`{json.dumps(card['final'])}`.", "",
                 f"Teacher NLL per code of {card['training']['eval_rows']} one-step samples: "
                 f"**{card['teacher_nll_per_token']:.3f}** nats.", ""]
    text += ["Image quality and speed beside `ar.sample`: docs/results/image/ (rows) and docs/image-dd.md.", ""]
    (folder / "README.md").write_text("\n".join(text))
