"""zoo:dlm-small-dparallel: dParallel (Chen et al., 2025) on the zoo, certainty-forcing distillation of zoo:dlm-small
on its own correct answers (`fastdecode train dparallel`; docs/diffusion.md, "dParallel").

1. Data: the teacher decodes training items of the parallel-lists tasks (train seeds, the zoo's mixture weights) as
   its card does (`dlm.baseline`, one token per step, blocks of 16, the task's fitted canvas); each answer is scored
   by the task's scorer and only the correct ones are kept, padded with EOS to the canvas as the teacher was trained.
   The answers are cached by item index (`$FASTDECODE_CACHE/dparallel/`), so an interrupted or larger run
   regenerates only what it lacks.
2. Training: the student starts as the teacher's weights and trains all of them (the authors train a LoRA of an 8B
   model; 10 M parameters train whole) on `objectives/dparallel.py`'s loss, AdamW, a short warm-up then a constant
   lr (the authors' schedule). The data order and every mask follow from the seed and the step, and a checkpoint
   (safetensors: weights and AdamW's moments; JSON: step, log) every `checkpoint_every` steps lets a rerun resume
   where it stopped and end as the uninterrupted run would.
3. The card: teacher and student decoded with `dlm.threshold` and `dlm.entropy_bound` (blocks of 16) on the first
   `eval_per_task` test items of every parallel-lists task, batch of one: accuracy, forwards, tokens per forward.

Nothing here prints: progress goes to the `report` callback.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..bench.evaluate import default_budget
from ..bench.suites import SUITES
from ..bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from ..engine import generate
from ..errors import ParameterError
from ..models.loading import load
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint
from .data import DEFAULT_MIXTURE, Example, collate, item_stream
from .export import save_folder
from .heads import batch_at, length_batches
from .loop import cpu_bf16_is_fast
from .objectives.dparallel import BLOCK, certainty_forcing
from .selfdata import Report, cache_root, fingerprint
from .selfdata import mixture as selfdata_mixture

TEACHER = "zoo:dlm-small"
NAME = "dlm-small-dparallel"
SUITE = "parallel-lists"
TEACHER_METHOD = "dlm.baseline"  # the teacher's card decoding: one token per step
CARD_METHODS = ("dlm.threshold", "dlm.entropy_bound")  # the rules the student is decoded with, defaults + blocks of 16
GEN_BATCH = 32  # rows per teacher batch (one task each: one canvas)
GEN_CHUNK = 400  # items decoded before the next ones are started


@dataclass(frozen=True)
class DParallelTraining:
    """How the student trains (every field settable with `--set NAME=VALUE`)."""

    # sized for the shared 2-core machine (docs/diffusion.md, "dParallel"): 400 items took 12 minutes to answer,
    # a step about 18 s at one thread beside six other jobs
    items: int = 400  # training items the teacher answers (the correct ones are kept)
    steps: int = 120
    lr: float = 5e-5
    warmup: int = 10  # linear warm-up, then constant (the authors' schedule)
    weight_decay: float = 0.01  # the authors' setting
    batch_tokens: int = 1536  # padded tokens per batch (each batch takes two forwards: the mask and its complement)
    entropy_weight: float = 2.0
    temperature: float = 0.5
    mask_ratio: float = 0.5
    checkpoint_every: int = 25
    eval_per_task: int = 10  # test items per parallel-lists task for the card (0 = skip)
    tasks: str = ""  # comma-separated tasks for the data, equal weights; "" = the parallel-lists tasks

    def __post_init__(self) -> None:
        if self.items < 1 or self.steps < 1 or self.batch_tokens < 64 or not 0 < self.mask_ratio < 1:
            raise ParameterError(f"items >= 1, steps >= 1, batch_tokens >= 64 and 0 < mask_ratio < 1; got {self}")


def parse_settings(pairs: dict[str, str]) -> DParallelTraining:
    """`--set NAME=VALUE` pairs as `DParallelTraining` fields (each typed by its annotation)."""
    hints = typing.get_type_hints(DParallelTraining)
    values: dict[str, Any] = {}
    for name, text in pairs.items():
        if name not in hints:
            raise ParameterError(f"Unknown dparallel setting {name!r}; choose from {sorted(hints)}.")
        try:
            values[name] = hints[name](text)
        except ValueError:
            raise ParameterError(f"--set {name}={text}: {name} takes a {hints[name].__name__}") from None
    return DParallelTraining(**values)


def mixture(tasks: str = "") -> dict[str, float]:
    """The parallel-lists tasks with the zoo's training weights (the suite the student is measured on), or the
    comma-separated `tasks` with equal weights."""
    if tasks:
        return selfdata_mixture(tuple(t.strip() for t in tasks.split(",") if t.strip()))
    return {name: DEFAULT_MIXTURE.get(name, 1.0) for name, _ in SUITES[SUITE].tasks}


# -- 1. the teacher's answers ----------------------------------------------------------------------------------------

def answers_path(teacher: Any, seed: int, tasks: str = "") -> Path:
    mix = "-" + hashlib.sha256(tasks.encode()).hexdigest()[:8] if tasks else ""
    return cache_root().parent / "dparallel" / f"{NAME}-{fingerprint(teacher)}-seed{seed}{mix}.jsonl"


def teacher_answers(teacher: Any, seed: int, n_items: int, report: Report | None = None,
                    tasks: str = "") -> list[dict]:
    """The first `n_items` training items of `mixture(tasks)` (seed `seed`), each with the teacher's answer and its
    score: rows {index, task, prompt (ids), answer (ids), canvas, score}, read from the cache or decoded and
    appended to it."""
    path = answers_path(teacher, seed, tasks)
    done: dict[int, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut by an interrupted write: decoded again
                continue
            done[int(row["index"])] = row
    items = list(itertools.islice(item_stream(mixture(tasks), seed), n_items))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        # prefixes of GEN_CHUNK items, each decoded task by task: a partial cache serves a smaller run
        for first in range(0, n_items, GEN_CHUNK):
            todo = sorted((i for i in range(first, min(n_items, first + GEN_CHUNK)) if i not in done),
                          key=lambda i: (items[i].task, len(items[i].prompt)))
            for task, group in itertools.groupby(todo, key=lambda i: items[i].task):
                indices = list(group)
                for start in range(0, len(indices), GEN_BATCH):
                    _answer(teacher, items, indices[start : start + GEN_BATCH], task, done, out)
                    if report is not None:
                        kept = sum(1 for k in range(n_items) if k in done and done[k]["score"] == 1.0)
                        report("data", sum(1 for k in range(n_items) if k in done), n_items, {"kept": float(kept)})
    return [done[i] for i in range(n_items)]


def _answer(teacher: Any, items: list, chunk: list[int], task: str, done: dict[int, dict], out: Any) -> None:
    """Decode the items `chunk` (all of `task`: one canvas) with the teacher; record and append each row."""
    canvas = default_budget(TASKS[task], teacher)
    tok = teacher.tokenizer
    prompts = [tok(format_prompt(items[i].prompt), add_special_tokens=True)["input_ids"] for i in chunk]
    started = time.perf_counter()
    with torch.inference_mode():
        results = generate(teacher, prompts, TEACHER_METHOD, max_new_tokens=canvas, block_length=BLOCK)
    share = (time.perf_counter() - started) / len(chunk)  # each row's share of its batch's wall time
    for i, prompt, r in zip(chunk, prompts, results, strict=True):
        done[i] = {"index": i, "task": task, "prompt": prompt, "answer": list(r.token_ids), "canvas": canvas,
                   "score": TASKS[task].score(items[i], r.text), "seconds": round(share, 3)}
        out.write(json.dumps(done[i]) + "\n")
    out.flush()


def training_examples(rows: list[dict], eos: int) -> list[Example]:
    """The correct answers as training rows: prompt + answer cut to the canvas and padded with EOS to it."""
    out = []
    for row in rows:
        if row["score"] != 1.0:
            continue
        answer = list(row["answer"])[: row["canvas"]]
        answer += [eos] * (row["canvas"] - len(answer))
        out.append(Example(list(row["prompt"]) + answer, len(row["prompt"]), row["task"]))
    return out


# -- 2. training -----------------------------------------------------------------------------------------------------

def lr_at(step: int, cfg: DParallelTraining) -> float:
    return cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup))


def train_student(teacher: Any, examples: list[Example], folder: Path, seed: int, cfg: DParallelTraining,
                  report: Report | None = None) -> tuple[torch.nn.Module, list[dict], float]:
    """The student (a copy of the teacher's network) trained `cfg.steps` steps, resuming from `folder`'s checkpoint;
    returns it, the loss log and the training seconds (all runs together)."""
    torch.manual_seed(seed)
    student = copy.deepcopy(teacher.model).float().cpu().train()  # trained on the CPU, wherever the teacher runs
    decay = [p for p in student.parameters() if p.dim() >= 2]
    rest = [p for p in student.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    state = _resume(folder, student, opt, seed, cfg)
    groups = length_batches(examples, cfg.batch_tokens)
    pad = teacher.tokenizer.pad_token_id
    mask_id = teacher.mask_token_id
    bf16 = cpu_bf16_is_fast()
    log: list[dict] = state["log"]
    elapsed = float(state["elapsed_s"])
    tick = time.perf_counter()
    for step in range(int(state["step"]), cfg.steps):
        ids, attention, answer = collate([examples[i] for i in batch_at(groups, step, seed)], pad, 1 << 30)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, parts = certainty_forcing(student, ids, attention, answer, mask_id, gen, BLOCK, cfg.mask_ratio,
                                            cfg.entropy_weight, cfg.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        row = {"step": step + 1, "loss": round(loss.item(), 4), "lr": lr_at(step, cfg), "rows": int(ids.shape[0]),
               "tokens": int(attention.sum()), **{k: round(v, 4) for k, v in parts.items()},
               "elapsed_s": round(elapsed + time.perf_counter() - tick, 1)}
        log.append(row)
        if report is not None:
            report("train", step + 1, cfg.steps, {"loss": row["loss"], **parts})
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            _checkpoint(folder, student, opt, seed, cfg, step + 1, log, elapsed + time.perf_counter() - tick)
    student.eval()
    return student, log, elapsed + time.perf_counter() - tick


def _identity(seed: int, cfg: DParallelTraining) -> dict[str, Any]:
    return {"seed": seed, "training": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "eval_per_task"}}


def _checkpoint(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int, cfg: DParallelTraining,
                step: int, log: list[dict[str, Any]], elapsed: float) -> None:
    save_checkpoint(folder, {"model": model}, {"opt": opt},
                    {**_identity(seed, cfg), "step": step, "elapsed_s": elapsed, "log": log})


def _resume(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int,
            cfg: DParallelTraining) -> dict[str, Any]:
    """The checkpoint's step, log and time, loaded into `model` and `opt`; a fresh start when there is none."""
    return (load_checkpoint(folder, {"model": model}, {"opt": opt}, _identity(seed, cfg))
            or {"step": 0, "log": [], "elapsed_s": 0.0})


# -- 3. the card -----------------------------------------------------------------------------------------------------

@torch.inference_mode()
def measure(model: Any, method: str, per_task: int) -> dict[str, Any]:
    """`method` (blocks of 16, the task's fitted canvas, batch of one) on the first `per_task` test items of every
    parallel-lists task: accuracy, forwards, tokens, TPF, wall time, and per item (score, tokens, forwards) for the
    test that re-checks a few of them."""
    per_item: list[list[float]] = []
    wall = 0.0
    for name, _ in SUITES[SUITE].tasks:
        task = TASKS[name]
        for item in task.items(DEFAULT_TEST_SEED, per_task):
            r = generate(model, format_prompt(item.prompt), method, max_new_tokens=default_budget(task, model),
                         block_length=BLOCK)
            wall += r.stats.wall_s
            per_item.append([task.score(item, r.text), r.stats.new_tokens, r.stats.forwards])
    tokens = sum(int(x[1]) for x in per_item)
    forwards = sum(int(x[2]) for x in per_item)
    return {"method": method, "block_length": BLOCK, "items": len(per_item),
            "accuracy": round(sum(x[0] for x in per_item) / len(per_item), 4), "tokens": tokens,
            "forwards": forwards, "tpf": round(tokens / max(1, forwards), 3), "wall_s": round(wall, 1),
            "per_item": per_item}


def card_numbers(student: Any, teacher: Any, per_task: int, report: Report | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for who, model in (("student", student), ("teacher", teacher)):
        for method in CARD_METHODS:
            if report is not None:
                report("measure", len(out), 2 * len(CARD_METHODS), {})
            out[f"{who}/{method}"] = measure(model, method, per_task)
    return out


def write_card(folder: Path, card: dict[str, Any], command: str) -> None:
    """README.md (the numbers in words and a table) and card.json (the same, for the test that re-checks them)."""
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    data, cfg, measured = card["data"], card["training"], card.get("measured", {})
    rows = [f"| {key.split('/')[0]} | `{m['method']}` | {m['accuracy']:.3f} | {m['tpf']:.2f} | {m['forwards']} | "
            f"{m['wall_s']:.1f} |" for key, m in measured.items()]
    summary = {k: {f: v for f, v in m.items() if f != "per_item"} for k, m in measured.items()}
    text = [
        f"# {NAME}", "",
        f"dParallel (certainty-forcing distillation, Chen et al., 2025) of `{TEACHER}` on its own correct answers: "
        "the same network, fine-tuned so that the confidence and entropy rules commit more tokens per forward "
        "(docs/diffusion.md, \"dParallel\").", "",
        "## Reproduce", "", "```bash", command, "```", "",
        f"Trained in {card['train_minutes']:.1f} minutes on this project's 2-core CPU machine ({card['threads']} "
        f"torch thread(s), shared with other jobs), {cfg['steps']} steps of about {cfg['batch_tokens']} padded "
        f"tokens, each two forwards (the drawn block masked at {cfg['mask_ratio']:g}, then its complement), AdamW lr "
        f"{cfg['lr']:g} after {cfg['warmup']} warm-up steps, constant; weight decay {cfg['weight_decay']:g}; loss = "
        f"cross-entropy + {cfg['entropy_weight']:g} x entropy at temperature {cfg['temperature']:g} on the masked "
        "positions predicted correctly; all weights trained. Weights in bfloat16.", "",
        "## Data", "",
        f"{data['items']} training items (train seeds, seed {card['seed']}) of the parallel-lists tasks, zoo mixture "
        f"weights, answered by `{TEACHER}` with `{TEACHER_METHOD}` (one token per step, blocks of {BLOCK}, the "
        f"task's fitted canvas) in {data['teacher_s']:.0f} s; the {data['kept']} answers its scorer marks correct "
        f"({data['kept'] / max(1, data['items']):.1%}) are kept, padded with EOS to the canvas "
        f"({data['answer_tokens']:,} answer tokens).", "",
        "## Measured on the test split", "",
        f"The first {card['eval_per_task']} test items of each parallel-lists task (batch of one, float32, blocks of "
        f"{BLOCK}, the methods' default thresholds), student beside teacher in the same run:", "",
        "| model | method | accuracy | tokens per forward | forwards | wall (s) |", "|---|---|---|---|---|---|",
        *rows, "", "```json", json.dumps(summary, indent=2), "```", "",
    ]
    (folder / "README.md").write_text("\n".join(text))


def build(out: Path, seed: int, threads: int, cfg: DParallelTraining, command: str,
          report: Report | None = None, teacher: Any = None) -> dict[str, Any]:
    """`fastdecode train dparallel`: teacher answers, training, export in bfloat16, then the card. `teacher` (a
    loaded masked-diffusion model) replaces zoo:dlm-small, for tests."""
    torch.set_num_threads(threads)
    teacher = teacher if teacher is not None else load(TEACHER, device="cpu", dtype="float32")
    rows = teacher_answers(teacher, seed, cfg.items, report, cfg.tasks)
    teacher_s = sum(float(r.get("seconds", 0.0)) for r in rows)  # when they were decoded, cached or not
    examples = training_examples(rows, teacher.tokenizer.eos_token_id)
    if not examples:
        raise ParameterError(f"None of the teacher's {cfg.items} answers was correct: nothing to train on.")
    student, log, train_s = train_student(teacher, examples, out, seed, cfg, report)
    save_folder(student, teacher.tokenizer, out, log, dtype="bfloat16")
    card: dict[str, Any] = {
        "name": NAME, "teacher": str(getattr(teacher, "name", TEACHER)), "seed": seed, "threads": threads,
        "training": dataclasses.asdict(cfg),
        "data": {"items": len(rows), "kept": len(examples), "teacher_s": round(teacher_s, 1),
                 "answer_tokens": sum(len(e.ids) - e.prompt_len for e in examples),
                 "kept_per_task": {t: sum(1 for e in examples if e.task == t) for t in mixture(cfg.tasks)}},
        "train_minutes": round(train_s / 60, 1),
        "final": {k: round(sum(r[k] for r in log[-25:]) / len(log[-25:]), 4)
                  for k in ("loss", "ce", "entropy", "acc")},
        "eval_per_task": cfg.eval_per_task,
    }
    if cfg.eval_per_task:
        shipped = load(out, device="cpu", dtype="float32")  # what ships: the bfloat16 weights
        card["measured"] = card_numbers(shipped, teacher, cfg.eval_per_task, report)
    write_card(out, card, command)
    clear_checkpoint(out)
    return card
