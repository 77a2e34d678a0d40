"""The DuoAttention gates' card: README.md and card.json of measured numbers, written beside the gates.

It states the gates themselves, the training loss, and two measures of the head split they give (top `retrieval`
share dense, the rest streaming), each beside the far-mass ranking's split (`gates=far_mass`):

- the authors' objective on held-out prompts with the split as deployed (binary gates, 64 sinks + a 256-token
  window): the mean squared distance of the final hidden states to the dense model's on the question and answer
  of the first test items of `longctx.passkey`, with every head streaming as the reference;
- `longctx.passkey` accuracy of dense greedy decoding and of `sparse.duo` with either split on the same items; per
  item the score is kept so that a test can decode a few of them again and check the card.

`fastdecode train duo` writes the card after training; `python -m fastdecode.train.duo_card FOLDER` measures and
writes it again for gates already trained (the numbers do not depend on how the gates were made).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..bench.tasks import DEFAULT_TEST_SEED, format_prompt
from ..bench.tasks.longctx import PasskeyTask
from ..engine import generate
from ..sparse.duo import SINKS, WINDOW, DuoConfig, head_scores, top_share
from .duo import DuoTraining, distill_step, passkey_ids, register_attention

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


def pattern_error(model: Any, dense: torch.Tensor, size: str, items: int) -> list[float]:
    """The authors' distillation term with a binary split (`dense` `[layers, kv_heads]` bool: heads at full
    attention, the others streaming over 64 sinks + a 256-token window) on each of the first `items` test items of
    longctx.passkey@`size`."""
    register_attention()
    cfg = DuoTraining(sinks=SINKS, window=WINDOW)
    errors = []
    with torch.no_grad():
        for item in PasskeyTask(size).items(DEFAULT_TEST_SEED, items):
            ids, labels = passkey_ids(model.tokenizer, item)
            distill, _ = distill_step(model.model, dense.float().to(model.device), ids.to(model.device), labels, cfg)
            errors.append(round(float(distill), 6))
    return errors


def splits(model: Any, gates: str) -> dict[str, torch.Tensor]:
    """The head splits the card compares: the gates', the far-mass ranking's, and every head streaming."""
    share = DuoConfig().retrieval
    trained, source = head_scores(model, gates)
    if source != "gates":
        raise ValueError(f"{gates} holds no gates that fit {model.name}")
    far, _ = head_scores(model, "far_mass")
    return {"gates": top_share(trained, share), "far_mass": top_share(far, share),
            "all streaming": torch.zeros_like(trained, dtype=torch.bool)}


def measure_errors(model: Any, items: int, gates: str) -> list[dict[str, Any]]:
    rows = []
    for label, dense in splits(model, gates).items():
        for size in CONTEXTS:
            errors = pattern_error(model, dense, size, items)
            rows.append({"split": label, "context": size, "items": items, "dense_heads": dense.int().tolist(),
                         "error": round(sum(errors) / len(errors), 6), "item_errors": errors})
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
        *([f"Measured again for these gates by `{card['card_command']}`.", ""] if card.get("card_command") else []),
        *_error_lines(card),
        f"`longctx.passkey` accuracy on the first {n} test items at each context (greedy, float32, "
        f"retrieval share {card['retrieval']}; `duo far_mass`: the same rule ranking heads by far attention mass, "
        "the fallback where no gates ship):",
        "",
        *_context_table("decoding", acc, ".2f"),
        "",
        f"With {n} items one item moves a rate by {1 / max(1, n):.3f}. sparse.duo's prefill is dense (as every "
        "sparse.* rule's here), so the answer's first token comes from a dense forward: accuracy separates the "
        "splits less than the hidden-state error above.",
        "",
        "`tests/sparse/test_duo.py` measures a few of these items again with the shipped gates and checks them "
        "against this card.",
        "",
    ]
    (folder / "README.md").write_text("\n".join(text))


def _context_table(first: str, rows: dict[str, dict[str, float]], fmt: str) -> list[str]:
    """A markdown table: one row per label, one column per context length (nan where unmeasured)."""
    return [
        f"| {first} | " + " | ".join(CONTEXTS) + " |",
        "|---|" + "---|" * len(CONTEXTS),
        *[f"| {label} | " + " | ".join(format(values.get(c, float("nan")), fmt) for c in CONTEXTS) + " |"
          for label, values in rows.items()],
    ]


def _error_lines(card: dict[str, Any]) -> list[str]:
    rows = card.get("pattern_error") or []
    if not rows:
        return []
    err: dict[str, dict[str, float]] = {}
    for r in rows:
        err.setdefault(r["split"], {})[r["context"]] = r["error"]
    return [
        f"Hidden-state error of the deployed split (the training loss's distillation term with binary gates, "
        f"{SINKS} sinks + a {WINDOW}-token window, on the question and answer of the first {rows[0]['items']} "
        "test items of `longctx.passkey`; lower is closer to dense):",
        "",
        *_context_table("split", err, ".5f"),
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    """`python -m fastdecode.train.duo_card FOLDER`: measure trained gates again and rewrite their card."""
    import argparse

    from ..models.loading import load

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("folder", help="the gates' folder (it holds card.json from `fastdecode train duo`)")
    ap.add_argument("--eval-items", type=int, default=8)
    ap.add_argument("--budgets", default="320,128")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    folder = Path(args.folder)
    card = json.loads((folder / CARD_JSON).read_text())
    command, threads = card.pop("command"), card.pop("threads")
    model = load(card["target"], device="cpu", dtype="float32")
    card["pattern_error"] = measure_errors(model, args.eval_items, str(folder))
    card["decoding"] = measure(model, args.eval_items, tuple(int(b) for b in args.budgets.split(",")),
                               gates=str(folder))
    card["card_command"] = (f"python -m fastdecode.train.duo_card {args.folder} --eval-items {args.eval_items} "
                            f"--budgets {args.budgets}")
    write_card(folder, card, command, threads)


if __name__ == "__main__":
    main()
