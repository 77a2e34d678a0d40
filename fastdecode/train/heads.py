"""The one training loop for drafter heads: a frozen target, self-distilled batches, AdamW on the head alone.

Every head kind trains here; what differs is its objective (`objectives/<kind>.py`, a `HeadObjective`): the layers
it reads, the head it builds, its loss. The loop regenerates (or reads from the cache) the target's greedy answers
on training seeds (`selfdata.py`), cuts them into length-sorted padded batches, runs the target on each without
gradient (`TargetBatch`: last hidden states, the layers asked, logits) and steps the head. The data order and every
random draw follow from the seed and the step alone, and a checkpoint (safetensors: the head, AdamW's moments; JSON:
the step and the log) is written every `checkpoint_every` steps, so an interrupted run resumes where it stopped and
ends as the uninterrupted one would. At the end the head is saved in bfloat16 and the method that decodes with it
is measured on held-out items for the card. Nothing here prints: progress goes to the `report` callback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ParameterError
from ..heads import Head, load_head, save_head
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint
from .data import Example
from .head_card import write_card
from .measure import measure_tau, suite_prompts
from .objectives import HeadObjective, TargetBatch, head_objective
from .selfdata import DEFAULT_ITEMS, Report, regeneration, self_distilled

LOG = "train_log.jsonl"


@dataclass(frozen=True)
class HeadTraining:
    """How long and how a head trains (every field settable with `--set NAME=VALUE`)."""

    steps: int = 600
    lr: float = 1e-3  # peak, after a linear warm-up; cosine decay to 10 %
    warmup: int = 20
    weight_decay: float = 0.0
    batch_tokens: int = 2048  # padded tokens per batch (prompt included: the target reads it)
    items: int = DEFAULT_ITEMS  # self-distilled training items (the cache is shared by every kind at this size)
    tasks: str = ""  # comma-separated task names for the data, equal weights; "" = the zoo's default mixture
    held_out: int = 200  # of those, the last ones: per-position accuracy on text the head never trained on
    checkpoint_every: int = 50
    eval_per_task: int = 4  # test items per parallel-lists task for the card's τ (0 = skip)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_tokens < 64 or not 0 <= self.held_out < self.items:
            raise ParameterError(f"steps >= 1, batch_tokens >= 64 and 0 <= held_out < items, got {self}")


def split_settings(pairs: dict[str, str]) -> tuple[HeadTraining, dict[str, Any]]:
    """`--set` pairs: `HeadTraining` fields (typed by their annotation) and the head's own options (JSON values,
    else strings)."""
    hints = typing.get_type_hints(HeadTraining)
    train: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for name, text in pairs.items():
        if name in hints:
            try:
                train[name] = hints[name](text)
            except ValueError:
                raise ParameterError(f"--set {name}={text}: {name} takes a {hints[name].__name__}") from None
        else:
            try:
                options[name] = json.loads(text)
            except ValueError:
                options[name] = text
    return HeadTraining(**train), options


def target_batch(target: Any, examples: list[Example], layers: tuple[int, ...]) -> TargetBatch:
    """Right-padded ids of `examples` and what the frozen target computes on them (ordinary tensors, no grad)."""
    T = max(len(e.ids) for e in examples)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(examples), T), pad, dtype=torch.long)  # [B, T]
    attention = torch.zeros(len(examples), T, dtype=torch.bool)
    answer = torch.zeros(len(examples), T, dtype=torch.bool)
    for b, e in enumerate(examples):
        ids[b, : len(e.ids)] = torch.tensor(e.ids)
        attention[b, : len(e.ids)] = True
        answer[b, e.prompt_len : len(e.ids)] = True
    positions = torch.arange(T).expand(len(examples), T)
    out = target.forward(ids.to(target.device), positions.to(target.device), None,
                         attention_mask=attention.long().to(target.device), hidden=layers or True)
    # outside inference mode: the head's graph may save them for its backward
    return TargetBatch(ids, attention, answer, out.hidden.float().clone().cpu(),
                       tuple(x.float().clone().cpu() for x in out.layers), out.logits.clone().cpu())


def length_batches(examples: list[Example], batch_tokens: int) -> list[list[int]]:
    """Indices of `examples` grouped by length so that each padded batch holds at most `batch_tokens` tokens."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    groups: list[list[int]] = [[]]
    for i in order:
        longest = len(examples[i].ids)  # the longest so far: sorted ascending
        if groups[-1] and longest * (len(groups[-1]) + 1) > batch_tokens:
            groups.append([])
        groups[-1].append(i)
    return groups


def batch_at(groups: list[list[int]], step: int, seed: int) -> list[int]:
    """The batch of `step`: epochs over `groups`, each in its own seeded order (a resumed run draws the same)."""
    epoch, index = divmod(step, len(groups))
    order = list(range(len(groups)))
    random.Random(f"heads-{seed}-{epoch}").shuffle(order)
    return groups[order[index]]


def lr_at(step: int, cfg: HeadTraining) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_head(target: Any, kind: str, out: str | Path, *, seed: int = 0, cfg: HeadTraining | None = None,
               options: dict[str, Any] | None = None, report: Report | None = None, command: str = "",
               threads: int = 1) -> dict[str, Any]:
    """Train a `kind` head against `target` into `out` (resuming from its checkpoint), save it in bfloat16 with its
    card (README.md, card.json; `command` is the line that reproduces it) and return the card's numbers."""
    cfg = cfg or HeadTraining()
    options = dict(options or {})
    goal = head_objective(kind)
    folder = Path(out).expanduser()
    tasks = tuple(t.strip() for t in cfg.tasks.split(",") if t.strip())
    data = self_distilled(target, seed=seed, n_items=cfg.items, report=report, tasks=tasks)
    made = regeneration(target, seed, cfg.items, tasks)
    train_set, held = data[: len(data) - cfg.held_out], data[len(data) - cfg.held_out :]
    layers = goal.target_layers(target, options)
    torch.manual_seed(seed)
    head = goal.build_head(target, options).to(target.device).float().train()
    goal.prepare(head, train_set)  # fitted on the data before any step (a resumed run then loads its own)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    state = _resume(folder, head, opt, kind, seed, cfg, options)
    groups = length_batches(train_set, cfg.batch_tokens)
    log: list[dict[str, Any]] = state["log"]
    elapsed = float(state["elapsed_s"])
    tick = time.perf_counter()
    for step in range(int(state["step"]), cfg.steps):
        examples = [train_set[i] for i in batch_at(groups, step, seed)]
        with torch.no_grad():
            batch = target_batch(target, examples, layers)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        loss, metrics = goal.head_loss(head, target, batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        row = {"step": step + 1, "loss": round(loss.item(), 4), "lr": lr_at(step, cfg),
               "tokens": int(batch.attention.sum()), "answer_tokens": int(batch.answer.sum()),
               **{k: round(float(v), 4) for k, v in metrics.items()}}
        log.append(row)
        if report is not None:
            report("train", step + 1, cfg.steps, {"loss": row["loss"], **metrics})
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            _checkpoint(folder, head, opt, kind, seed, cfg, options, step + 1, log,
                        elapsed + time.perf_counter() - tick)
    train_s = elapsed + time.perf_counter() - tick
    head.eval()
    save_head(head, folder, dtype="bfloat16")
    (folder / LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    saved = load_head(folder, device=target.device, dtype=torch.float32)  # what ships: the bfloat16 weights
    card: dict[str, Any] = {
        "kind": kind, "target": str(getattr(target, "name", "")), "seed": seed, "options": options,
        "training": dataclasses.asdict(cfg), "target_layers": list(layers),
        "data": {"items": len(data), "train_items": len(train_set),
                 "answer_tokens": sum(len(e.ids) - e.prompt_len for e in train_set),
                 "regeneration_s": made.get("seconds", 0.0), "regeneration_threads": made.get("threads", 0)},
        "train_s": round(train_s, 1),
        "trained_tokens": sum(r["tokens"] for r in log),
        "trained_answer_tokens": sum(r["answer_tokens"] for r in log),
        "held_out": held_out_metrics(goal, saved, target, held, layers, cfg.batch_tokens),
    }
    if goal.method and cfg.eval_per_task:
        if report is not None:
            report("measure", 0, 1, {})
        params = goal.method_params(str(folder))
        card["measured"] = {"suite": "parallel-lists", "per_task": cfg.eval_per_task, "params": options_text(params),
                            **measure_tau(target, goal.method, params, suite_prompts("parallel-lists",
                                                                                      cfg.eval_per_task))}
    write_card(folder, card, command or f"fastdecode train drafter --kind {kind} --seed {seed}", threads,
               goal.card_lines(options))
    clear_checkpoint(folder)
    return card


def options_text(params: dict[str, Any]) -> dict[str, Any]:
    """The method's parameters without the head's folder (a path of this machine)."""
    return {k: v for k, v in params.items() if k != "head"}


@torch.no_grad()
def held_out_metrics(goal: HeadObjective, head: Head, target: Any, held: list[Example], layers: tuple[int, ...],
                     batch_tokens: int) -> dict[str, float]:
    """The objective's metrics (e.g. per-position top-1 agreement) averaged over the held-out items, weighted by
    each batch's answer tokens."""
    sums: dict[str, float] = {}
    weight = 0
    gen = torch.Generator().manual_seed(0)
    for group in length_batches(held, batch_tokens):
        batch = target_batch(target, [held[i] for i in group], layers)
        _, metrics = goal.head_loss(head, target, batch, gen)
        w = int(batch.answer.sum())
        weight += w
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * w
    return {k: round(v / max(1, weight), 4) for k, v in sums.items()}


def _identity(kind: str, seed: int, cfg: HeadTraining, options: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "seed": seed, "options": options,
            "training": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("eval_per_task",)}}


def _checkpoint(folder: Path, head: Head, opt: torch.optim.Optimizer, kind: str, seed: int, cfg: HeadTraining,
                options: dict[str, Any], step: int,
                log: list[dict[str, Any]], elapsed: float) -> None:
    save_checkpoint(folder, {"head": head}, {"opt": opt},
                    {**_identity(kind, seed, cfg, options), "step": step, "elapsed_s": elapsed, "log": log})


def _resume(folder: Path, head: Head, opt: torch.optim.Optimizer, kind: str, seed: int, cfg: HeadTraining,
                options: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's step, log and time, loaded into `head` and `opt`; a fresh start when there is none."""
    return (load_checkpoint(folder, {"head": head}, {"opt": opt}, _identity(kind, seed, cfg, options))
            or {"step": 0, "log": [], "elapsed_s": 0.0})


