"""`fastdecode train filter`: Learn2PD's filter (`heads/filter.py`) trained on a masked-diffusion model's own
decoding trajectories.

Data: `dlm.baseline` (one token per step, blocks of the filter's width, the canvas the bench fits to each task)
decodes training-seed items of the zoo's list, letter and puzzle tasks; at every step the filter's features of the
current block are logged, and once the run ends each logged masked position is labelled 1 when its prediction at
that step equals the token the run ended with there (after End-of-Text Prediction's EOS padding), the paper's
"Extremely Greedy Parallel" oracle. The last `held_out` items of each task are kept out of training. Trajectories
are written task by task and a checkpoint every `checkpoint_every` steps, so an interrupted run resumes where it
stopped. Nothing here prints: progress goes to the `report` callback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..bench.suites import SUITES
from ..bench.tasks import TASKS, format_prompt
from ..diffusion.driver import denoise, settle
from ..diffusion.policies.baseline import BaselineConfig, LowConfidence
from ..diffusion.policy import Step, View, columns
from ..engine import encode_batch
from ..errors import ParameterError, close_names
from ..heads import save_head
from ..heads.filter import FEATURES, FilterHead, History
from .checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from .selfdata import Report

LOG = "train_log.jsonl"
SUITE_NAMES = ("parallel-lists", "puzzles")
DATA_SEED = 500_000  # training seeds of the tasks: items(DATA_SEED + seed, n)


@dataclass(frozen=True)
class FilterTraining:
    """What the filter trains on and how (every field settable with `--set NAME=VALUE`)."""

    items: int = 20  # training-seed items per task (the last `held_out` of them kept out of training)
    held_out: int = 5
    batch: int = 20  # rows decoded at once while logging trajectories
    tasks: str = ""  # comma-separated task names; "" = every task of parallel-lists and puzzles
    width: int = 16  # the filter's block: dlm.baseline decodes blocks of this width for the data
    hidden: int = 32
    features: str = "conf,committed"  # the filter's inputs, comma-separated, of heads/filter.py FEATURES
    steps: int = 3000
    batch_size: int = 512  # logged block-steps per training step
    lr: float = 3e-3
    checkpoint_every: int = 500
    eval_per_task: int = 4  # test items per parallel-lists task for the card's decoding numbers (0 = skip)

    def __post_init__(self) -> None:
        if not 0 < self.held_out < self.items or self.steps < 1 or self.width < 1 or self.batch < 1:
            raise ParameterError(f"0 < held_out < items, steps >= 1, width >= 1 and batch >= 1, got {self}")


def task_names(cfg: FilterTraining | None = None) -> list[str]:
    """The tasks whose trajectories the filter learns from: `cfg.tasks`, or every task of SUITE_NAMES."""
    named = [t.strip() for t in (cfg.tasks if cfg else "").split(",") if t.strip()]
    unknown = [t for t in named if t not in TASKS]
    if unknown:
        raise ParameterError(f"Unknown task(s) {unknown} for the filter's trajectories. "
                             f"{close_names(unknown[0], TASKS)}")
    return named or [name for suite in SUITE_NAMES for name, _ in SUITES[suite].tasks]


class Recorder:
    """A policy that decodes as `inner` and logs each step's filter features, view offsets and predictions."""

    def __init__(self, inner: LowConfidence, history: History, width: int) -> None:
        self.inner, self.history, self.width = inner, history, width
        self.log: list[tuple[torch.Tensor, ...]] = []

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        return self.inner.view(gen, rows)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        cols = columns(step)  # [R, W]
        feats = self.history.features(step.rows, cols, step.inview, step.masked, step.x0, step.conf, self.width)
        self.log.append((step.rows.clone(), cols, step.masked.clone(), step.x0.clone(), feats))
        return self.inner.commit(step)


@torch.no_grad()
def trajectories(model: Any, prompts: list[str], canvas: int, width: int) -> dict[str, torch.Tensor]:
    """`dlm.baseline`'s run on `prompts` as filter training samples: features `[S, width, F]`, labels and the
    masked positions `[S, width]` (only those are judged), and `item` `[S]` (the prompt each sample comes from)."""
    batch = encode_batch(model, prompts, canvas)
    cfg = BaselineConfig(max_new_tokens=canvas, block_length=width)
    B = batch.size
    rec = Recorder(LowConfidence(cfg, model.mask_token_id, B, model.device, None), History(B, canvas, model.device),
                   width)
    final = torch.full((B, canvas), model.mask_token_id, dtype=torch.long, device=model.device)  # [B, N]
    for ev in denoise(model, batch, cfg, rec, None, "dlm.baseline"):
        for b, pairs in enumerate(ev.tokens):
            for offset, token in pairs:
                final[b, offset] = token
    eos = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long, device=model.device)
    final, _ = settle(final, model.mask_token_id, eos)
    feats, labels, masked, items = [], [], [], []
    for rows, cols, m, x0, f in rec.log:
        W = cols.shape[1]
        label = x0 == final[rows[:, None].expand_as(cols), cols]  # [R, W]
        feats.append(f)
        labels.append(torch.nn.functional.pad(label & m, (0, width - W)))
        masked.append(torch.nn.functional.pad(m, (0, width - W)))
        items.append(rows)
    return {"feats": torch.cat(feats).cpu(), "labels": torch.cat(labels).cpu(), "masked": torch.cat(masked).cpu(),
            "item": torch.cat(items).cpu()}


def collect(model: Any, folder: Path, seed: int, cfg: FilterTraining, report: Report | None) -> dict[str, Any]:
    """Every task's trajectories, logged once into `folder` (one safetensors file a task) and read back after."""
    folder.mkdir(parents=True, exist_ok=True)
    names = task_names(cfg)
    seconds = 0.0
    for done, name in enumerate(names):
        path = folder / f"{name}.safetensors"
        if not path.is_file():
            tick = time.perf_counter()
            data = _task_trajectories(model, name, seed, cfg)
            save_file(data, str(path), metadata={"seconds": str(round(time.perf_counter() - tick, 1))})
        if report is not None:
            report("data", done + 1, len(names), {})
    train: dict[str, list[torch.Tensor]] = {}
    held: dict[str, list[torch.Tensor]] = {}
    for name in names:
        data = load_file(str(folder / f"{name}.safetensors"))
        with open(folder / f"{name}.safetensors", "rb") as f:  # the time it took, from the file's header
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        seconds += float(header.get("__metadata__", {}).get("seconds", 0))
        keep = data["item"] < cfg.items - cfg.held_out
        for into, sel in ((train, keep), (held, ~keep)):
            for k in ("feats", "labels", "masked"):
                into.setdefault(k, []).append(data[k][sel])
    out = {k: {f: torch.cat(v) for f, v in part.items()} for k, part in (("train", train), ("held", held))}
    if not (out["train"]["masked"].any() and out["held"]["masked"].any()):
        raise ParameterError(f"{model.name or 'the model'} left no trajectories to train or to hold out (every "
                             "prompt with its canvas is longer than its positions?): raise items or held_out.")
    return {**out, "seconds": seconds}


def _task_trajectories(model: Any, name: str, seed: int, cfg: FilterTraining) -> dict[str, torch.Tensor]:
    """One task's trajectories, `item` its item index; the items whose prompt and canvas do not fit in the model's
    positions are skipped (empty tensors when none fit)."""
    task = TASKS[name]
    canvas = task.canvas_length(model.tokenizer)
    limit = model.max_positions or 1 << 30
    prompts = [format_prompt(i.prompt) for i in task.items(DATA_SEED + seed, cfg.items)]
    kept = [i for i, p in enumerate(prompts) if len(model.encode(p)) + canvas <= limit]
    parts = []
    for start in range(0, len(kept), cfg.batch):
        chunk = kept[start : start + cfg.batch]
        part = trajectories(model, [prompts[i] for i in chunk], canvas, cfg.width)
        part["item"] = torch.tensor(chunk, dtype=torch.long)[part["item"]]
        parts.append(part)
    if not parts:
        F = len(FEATURES)
        return {"feats": torch.zeros(0, cfg.width, F), "labels": torch.zeros(0, cfg.width, dtype=torch.bool),
                "masked": torch.zeros(0, cfg.width, dtype=torch.bool), "item": torch.zeros(0, dtype=torch.long)}
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def lr_at(step: int, cfg: FilterTraining) -> float:
    warm = max(1, cfg.steps // 20)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, cfg.steps - warm))))


def loss_of(head: FilterHead, feats: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of the filter's logits on the masked positions `[S, width]`."""
    logits = head(feats)  # [S, width]
    return torch.nn.functional.binary_cross_entropy_with_logits(logits[masked], labels[masked].float())


@torch.no_grad()
def filter_metrics(head: FilterHead, data: dict[str, torch.Tensor],
                   taus: tuple[float, ...] = (0.5, 0.7, 0.9, 0.95)) -> dict[str, Any]:
    """Per threshold τ, on the masked positions: accuracy, precision (share of the positions called final that
    are), recall, and the share called final; and the share that are final (the base rate)."""
    prob = torch.sigmoid(head(data["feats"]))[data["masked"]]
    truth = data["labels"][data["masked"]]
    out: dict[str, Any] = {"positions": int(truth.numel()), "final_rate": round(truth.float().mean().item(), 4),
                           "loss": round(loss_of(head, data["feats"], data["labels"], data["masked"]).item(), 4)}
    for tau in taus:
        called = prob >= tau
        out[str(tau)] = {"accuracy": round((called == truth).float().mean().item(), 4),
                         "precision": round((called & truth).sum().item() / max(1, called.sum().item()), 4),
                         "recall": round((called & truth).sum().item() / max(1, truth.sum().item()), 4),
                         "called": round(called.float().mean().item(), 4)}
    return out


def train_filter(model: Any, out: str | Path, *, seed: int = 0, cfg: FilterTraining | None = None,
                 report: Report | None = None) -> tuple[FilterHead, dict[str, Any]]:
    """Log `model`'s trajectories, train the filter (resuming from `out`'s checkpoint), save it in bfloat16 into
    `out` with its training log, and return it (as saved) with the numbers for its card."""
    cfg = cfg or FilterTraining()
    folder = Path(out).expanduser()
    where = folder / CHECKPOINT
    data = collect(model, where / "trajectories", seed, cfg, report)
    train = data["train"]
    torch.manual_seed(seed)
    features = tuple(f.strip() for f in cfg.features.split(",") if f.strip())
    head = FilterHead.for_target(model, width=cfg.width, hidden=cfg.hidden, features=features).float().train()
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    state = _resume(folder, head, opt, seed, cfg)
    log: list[dict[str, Any]] = state["log"]
    elapsed, tick = float(state["elapsed_s"]), time.perf_counter()
    S = train["feats"].shape[0]
    for step in range(int(state["step"]), cfg.steps):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        pick = torch.randint(S, (cfg.batch_size,), generator=gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = loss_of(head, train["feats"][pick], train["labels"][pick], train["masked"][pick])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.append({"step": step + 1, "loss": round(loss.item(), 4), "lr": lr_at(step, cfg)})
        if report is not None:
            report("train", step + 1, cfg.steps, {"loss": loss.item()})
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
            _checkpoint(folder, head, opt, seed, cfg, step + 1, log, elapsed + time.perf_counter() - tick)
    train_s = elapsed + time.perf_counter() - tick
    head.eval()
    save_head(head, folder, dtype="bfloat16")
    (folder / LOG).write_text("".join(json.dumps(r) + "\n" for r in log))
    from ..heads import load_head

    saved = load_head(folder, device="cpu", dtype=torch.float32)
    assert isinstance(saved, FilterHead)
    card = {"seed": seed, "training": dataclasses.asdict(cfg), "params": sum(p.numel() for p in saved.parameters()),
            "features": list(saved.spec.features),
            "data": {"tasks": task_names(cfg), "train_samples": S, "held_samples": int(data["held"]["feats"].shape[0]),
                     "trajectory_s": round(data["seconds"], 1)},
            "train_s": round(train_s, 1),
            "held_out": filter_metrics(saved, data["held"]), "train_fit": filter_metrics(saved, train)}
    return saved, card


def _identity(seed: int, cfg: FilterTraining) -> dict[str, Any]:
    return {"seed": seed, "training": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "eval_per_task"}}


def _checkpoint(folder: Path, head: FilterHead, opt: torch.optim.Optimizer, seed: int, cfg: FilterTraining, step: int,
                log: list[dict[str, Any]], elapsed: float) -> None:
    save_checkpoint(folder, {"head": head}, {"opt": opt},
                    {**_identity(seed, cfg), "step": step, "elapsed_s": elapsed, "log": log})


def _resume(folder: Path, head: FilterHead, opt: torch.optim.Optimizer, seed: int,
            cfg: FilterTraining) -> dict[str, Any]:
    """The checkpoint's step, log and time, loaded into `head` and `opt`; a fresh start when there is none."""
    return (load_checkpoint(folder, {"head": head}, {"opt": opt}, _identity(seed, cfg))
            or {"step": 0, "log": [], "elapsed_s": 0.0})
