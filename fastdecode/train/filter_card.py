"""The Learn2PD filter's card: README.md and card.json of measured numbers, written beside the filter.

Beside the filter's held-out accuracy and precision it states what decoding with it gives: `dlm.learn2pd` beside
`dlm.baseline` and `dlm.threshold` (blocks of the filter's width) on the first test items of every parallel-lists
task, each task's items in one batch on the canvas the bench fits to the task; per item the new tokens, forwards and
score are kept so a test can re-measure a few of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..bench.suites import SUITES
from ..bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from ..engine import generate

CARD_JSON = "card.json"
METHODS = ("dlm.learn2pd", "dlm.baseline", "dlm.threshold")


def measure_decoding(model: Any, method: str, params: dict[str, Any], per_task: int,
                     suite: str = "parallel-lists", tasks: int | None = None) -> dict[str, Any]:
    """`method` on the first `per_task` test items of each task of `suite` (of its first `tasks` tasks, default
    all): per item tokens, forwards, score."""
    tokens, forwards, scores = [], [], []
    for name, _ in SUITES[suite].tasks[:tasks]:
        task = TASKS[name]
        items = task.items(DEFAULT_TEST_SEED, per_task)
        results = generate(model, [format_prompt(i.prompt) for i in items], method,
                           max_new_tokens=task.canvas_length(model.tokenizer), **params)
        for item, r in zip(items, results, strict=True):
            tokens.append(r.stats.new_tokens)
            forwards.append(r.stats.forwards)
            scores.append(task.score(item, r.text))
    n = len(scores)
    return {"method": method, "params": params, "suite": suite, "per_task": per_task, "items": n,
            "accuracy": round(sum(scores) / max(1, n), 4), "tpf": round(sum(tokens) / max(1, sum(forwards)), 3),
            "forwards": sum(forwards), "item_tokens": tokens, "item_forwards": forwards, "item_scores": scores}


def write_card(folder: Path, card: dict[str, Any], command: str, threads: int) -> None:
    (folder / CARD_JSON).write_text(json.dumps({**card, "command": command, "threads": threads}, indent=2) + "\n")
    held, fit, data, tr = card["held_out"], card["train_fit"], card["data"], card["training"]
    taus = [k for k in held if k[0].isdigit()]
    rows = [f"| {t} | {held[t]['accuracy']:.3f} | {held[t]['precision']:.3f} | {held[t]['recall']:.3f} | "
            f"{held[t]['called']:.3f} | {fit[t]['precision']:.3f} |" for t in taus]
    text = [
        f"# Learn2PD filter for {card['target']}",
        "",
        f"The filter `dlm.learn2pd` decodes `{card['target']}` with (Learn2PD, arXiv 2509.25188): an MLP of "
        f"{card['params']:,} parameters ({tr['width']} positions × {len(card['features'])} features → {tr['hidden']} "
        f"→ {tr['width']} logits) that says which masked positions of a block already hold their final token. "
        f"Features per position: {', '.join(card['features'])} (`fastdecode/heads/filter.py`). Seed {card['seed']}, "
        f"{threads} thread(s), weights in bfloat16. Reproduce:",
        "",
        "```",
        command,
        "```",
        "",
        "## Data",
        "",
        f"`dlm.baseline` (one token per step, blocks of {tr['width']}, the fitted canvas) on {tr['items']} "
        f"training-seed items of each of {len(data['tasks'])} tasks (parallel-lists and puzzles), "
        f"{data['trajectory_s'] / 60:.1f} min; label: the step's prediction equals the token the run ended with. "
        f"The last {tr['held_out']} items of every task are held out: {data['train_samples']:,} block-steps train, "
        f"{data['held_samples']:,} held out ({held['positions']:,} masked positions, of which "
        f"{held['final_rate']:.1%} already final).",
        "",
        "## Training",
        "",
        f"{tr['steps']} AdamW steps of {tr['batch_size']} block-steps, peak lr {tr['lr']}, binary cross-entropy on "
        f"the masked positions; {card['train_s']:.0f} s. Loss log: `train_log.jsonl`.",
        "",
        "## Measured",
        "",
        "Held-out masked positions, by threshold τ (called final when sigmoid ≥ τ):",
        "",
        "| τ | accuracy | precision | recall | called final | precision (train) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    decoding = card.get("decoding") or []
    if decoding:
        first = decoding[0]
        text += [
            f"Decoding the first {first['per_task']} test items of every {first['suite']} task ({first['items']} "
            "items, each task's items in one batch, fitted canvas, greedy):",
            "",
            "| method | params | accuracy | forwards | TPF |",
            "|---|---|---|---|---|",
            *[f"| {d['method']} | `{json.dumps(d['params'])}` | {d['accuracy']:.3f} | {d['forwards']} | "
              f"{d['tpf']:.2f} |" for d in decoding],
            "",
            "`tests/unit/test_learn2pd.py` decodes a few of these items again and checks them against this card.",
            "",
        ]
    (folder / "README.md").write_text("\n".join(text))
