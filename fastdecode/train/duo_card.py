"""The DuoAttention gates' card: README.md and card.json of measured numbers, written beside the gates.

It states the gates themselves, the training loss, and what decoding with them gives: `longctx.passkey` accuracy
of dense greedy decoding, of `sparse.duo` with the trained gates and of `sparse.duo` with the far-mass ranking
(`gates=far_mass`), on the first test items at each context; per item the score is kept so that a test can decode
a few of them again and check the card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..bench.tasks import DEFAULT_TEST_SEED, format_prompt
from ..bench.tasks.longctx import PasskeyTask
from ..engine import generate

CARD_JSON = "card.json"
CONTEXTS = ("1k", "2k")


def configurations(budgets: tuple[int, ...]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, method, params) of every decoding the card measures."""
    out: list[tuple[str, str, dict[str, Any]]] = [("dense", "ar.greedy", {})]
    for b in budgets:
        out.append((f"duo gates b{b}", "sparse.duo", {"budget": b}))
        out.append((f"duo far_mass b{b}", "sparse.duo", {"budget": b, "gates": "far_mass"}))
    return out


def passkey_scores(model: Any, method: str, params: dict[str, Any], size: str, items: int,
                   gates: str | None = None) -> list[float]:
    """Scores of `method` on the first `items` test items of longctx.passkey@`size`, one prompt at a time
    (`gates`: a gates folder, for sparse.duo when it does not read the model's shipped ones)."""
    task = PasskeyTask(size)
    extra = {"gates": gates} if gates and method == "sparse.duo" and "gates" not in params else {}
    scores = []
    for item in task.items(DEFAULT_TEST_SEED, items):
        r = generate(model, [format_prompt(item.prompt)], method, max_new_tokens=task.max_new_tokens,
                     **params, **extra)[0]
        scores.append(task.score(item, r.text))
    return scores


def measure(model: Any, items: int, budgets: tuple[int, ...], gates: str | None = None,
            report: Any = None) -> list[dict[str, Any]]:
    rows = []
    configs = configurations(budgets)
    for i, (label, method, params) in enumerate(configs):
        for size in CONTEXTS:
            scores = passkey_scores(model, method, params, size, items, gates)
            rows.append({"label": label, "method": method, "params": params, "context": size, "items": items,
                         "accuracy": round(sum(scores) / len(scores), 4), "item_scores": scores})
        if report is not None:
            report(i + 1, len(configs))
    return rows


def write_card(folder: Path, card: dict[str, Any], command: str, threads: int) -> None:
    (folder / CARD_JSON).write_text(json.dumps({**card, "command": command, "threads": threads}, indent=2) + "\n")
    tr, gates = card["training"], card["gates"]
    heads = [f"| {i} | " + " | ".join(f"{a:.3f}" for a in row) + " |" for i, row in enumerate(gates)]
    acc: dict[str, dict[str, float]] = {}
    for r in card["decoding"]:
        acc.setdefault(r["label"], {})[r["context"]] = r["accuracy"]
    n = card["decoding"][0]["items"] if card["decoding"] else 0
    text = [
        f"# DuoAttention gates for {card['target']}",
        "",
        f"One gate per (layer, key/value head) of `{card['target']}` ({len(gates)} layers × {len(gates[0])} heads), "
        "trained as DuoAttention's authors do (mit-han-lab/duo-attention, `duo_attn/train.py`) with the model "
        "frozen: each head's output is α·full attention + (1−α)·streaming attention "
        f"({tr['sinks']} sinks + a {tr['window']}-token window), loss = mean squared distance of the final hidden "
        "states to the dense model's on the question and answer + "
        f"{tr['reg']}·mean|α|. `sparse.duo` keeps the top `retrieval` share of heads by α dense "
        f"(`fastdecode/sparse/duo.py`). Seed {card['seed']}, {threads} thread(s), gates in bfloat16. Reproduce:",
        "",
        "```",
        command,
        "```",
        "",
        "## Training",
        "",
        f"{tr['steps']} AdamW steps (lr {tr['lr']}, the authors' warm-up/decay schedule), one training-seed "
        f"`longctx.passkey` item a step at {tr['context_min']}–{tr['context_max']} tokens ({tr['lengths']} lengths); "
        f"{card['train_s'] / 60:.1f} min. Loss {card['loss_first']} at the first step; over the last fifth the "
        f"distillation term averaged {card['distill_last_fifth']}, and mean|α| ended at {card['l1_last']}. "
        "Log: `train_log.jsonl`.",
        "",
        "## Gates (α, clamped to [0, 1])",
        "",
        "| layer | " + " | ".join(f"head {h}" for h in range(len(gates[0]))) + " |",
        "|---|" + "---|" * len(gates[0]),
        *heads,
        "",
        "## Measured",
        "",
        f"`longctx.passkey` accuracy on the first {n} test items at each context (greedy, float32, "
        f"retrieval share {card['retrieval']}; `duo far_mass`: the same rule ranking heads by far attention mass, "
        "the fallback where no gates ship):",
        "",
        "| decoding | " + " | ".join(CONTEXTS) + " |",
        "|---|" + "---|" * len(CONTEXTS),
        *[f"| {label} | " + " | ".join(f"{a.get(c, float('nan')):.2f}" for c in CONTEXTS) + " |"
          for label, a in acc.items()],
        "",
        "`tests/sparse/test_duo.py` decodes a few of these items again with the shipped gates and checks them "
        "against this card.",
        "",
    ]
    (folder / "README.md").write_text("\n".join(text))
