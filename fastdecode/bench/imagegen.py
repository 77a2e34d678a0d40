"""The image benchmark (`fastdecode bench-image`, `make results-image`): class-conditional generation, scored.

One invocation is one run: every method entry (the baseline `ar.sample` first, always) draws `per_class` images of
every class, seeded, in batches; each image is one row of `samples.jsonl` (the bench's row fields: `score` is 1 when
the evaluator reads the asked class, `forwards` the image's forwards, `wall_s` its share of its batch's time), so
`fastdecode report` reads them too. Then, per entry, one row of `metrics.jsonl` holds what only a set has: the
Fréchet distance, KID, class accuracy, k-NN precision/recall against the reference set, the guided teacher's NLL per
token of the samples, forwards per image, and wall time per image at batch 1 and at batch 64, all measured in this
run beside the baseline's. Two more rows per run give the floors: the tokenizer's (the reference set against the
real test images) and the independent baseline (every token from its class-conditional per-position marginal of the
train codes: what a one-step sampler ignoring token dependence reaches). A grid PNG per entry (`grids/`) shows the
first samples of each class; `imagereport.py` lays the numbers and grids out in `report.md`.

The reference set is the test split passed through the model's tokenizer (encode, decode), so its blur is not
charged to the methods. The evaluator (`fastdecode/zoo/img-eval`) is trained on the train split only.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..engine import generate, resolve
from ..errors import FastDecodeError
from ..image.evaluator import Evaluator, load_evaluator
from ..image.metrics import frechet_distance, kid, precision_recall
from ..models.base import ModelAdapter
from .harness import Entry, check_out, read_rows
from .imagereport import write_grid, write_report
from .jobs import load_model, machine, versions

SUITE = "image-classes"
BASELINE = "ar.sample"
INDEPENDENT = "independent"  # not a method: the per-position marginal sampler (rows' `method`)
SAMPLES, METRICS = "samples.jsonl", "metrics.jsonl"
ImageSet = tuple[np.ndarray, np.ndarray]  # uint8 [N, H, W], int64 labels [N]


class ImageBenchError(FastDecodeError, ValueError):
    """An image benchmark that cannot run: a text model, a bad count, a method that fails."""


@dataclass(frozen=True)
class ImageBenchConfig:
    per_class: int = 20  # images of each class per method entry, for the quality metrics
    seed: int = 0  # the run's seed: batch j of class c draws with seed (seed, c, j) folded into one int
    batch: int = 64  # images of one class generated together for the quality metrics
    latency_images: int = 10  # images timed one at a time (batch 1), one class after another
    throughput_batch: int = 64  # the batch timed for wall time per image at batch 64 (one batch, after a warm-up)
    grid_per_class: int = 4  # samples of each class in the grid PNG
    kid_subset: int = 500

    def check(self) -> None:
        for name in ("per_class", "batch", "latency_images", "throughput_batch", "grid_per_class", "kid_subset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ImageBenchError(f"{name} must be a positive whole number, not {value!r}.")
        if self.per_class < 4:
            raise ImageBenchError(f"per_class must be at least 4 (k-NN recall needs k + 1 = 4 points), "
                                  f"not {self.per_class}.")


@dataclass
class RunData:
    """What a run compares every method with, computed once."""

    reference: ImageSet  # the test images through the tokenizer
    real: ImageSet  # the test images themselves
    train_codes: tuple[torch.Tensor, np.ndarray]  # [N, h*w] codes of the train split, labels
    evaluator: Evaluator
    ref_features: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


def sample_seed(run_seed: int, cls: int, chunk: int) -> int:
    return (run_seed * 1000 + cls) * 10_000 + chunk


def image_data(model: ModelAdapter) -> tuple[ImageSet, ImageSet]:
    """(train, test) images of the model's data set: MNIST-5k for 28x28 models, the 8x8 digits for 8x8 ones."""
    from ..image import data  # the image extra's data sets

    size = model.image.size if model.image is not None else None
    if size == (28, 28):
        return data.mnist5k("train"), data.mnist5k("test")
    if size == (8, 8):
        return data.digits("train"), data.digits("test")
    raise ImageBenchError(f"No benchmark data set for {size} images: pass train= and test= to run_image_bench.")


def prepare(model: ModelAdapter, train: ImageSet, test: ImageSet, evaluator: Evaluator) -> RunData:
    spec = model.image
    assert spec is not None
    codes = spec.encode(test[0])  # [N, h*w]
    recon = spec.decode(codes)  # [N, H, W]
    data = RunData((recon, test[1]), test, (spec.encode(train[0]), np.asarray(train[1])), evaluator)
    data.ref_features = evaluator.score(recon).features
    return data


# -- generation ----------------------------------------------------------------------------------------------------

@dataclass
class Drawn:
    """The images of one method entry: pixels, codes, labels, forwards and wall seconds per image."""

    images: list[np.ndarray] = field(default_factory=list)
    codes: list[list[int]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)


def _generate(model: ModelAdapter, labels: Sequence[str], method: str, params: Mapping[str, Any], seed: int
              ) -> tuple[list[Any], float]:
    start = time.perf_counter()
    results = generate(model, list(labels), method, **{**params, "seed": seed})
    return results, time.perf_counter() - start


def draw(model: ModelAdapter, method: str, params: Mapping[str, Any], cfg: ImageBenchConfig) -> Drawn:
    """per_class images of every class, in batches of cfg.batch; where the method refuses a batch, one image at a
    time (its rows then say batch 1)."""
    spec = model.image
    assert spec is not None
    out = Drawn()
    for c, label in enumerate(spec.labels):
        for chunk, start in enumerate(range(0, cfg.per_class, cfg.batch)):
            n = min(cfg.batch, cfg.per_class - start)
            seed = sample_seed(cfg.seed, c, chunk)
            try:
                results, wall = _generate(model, [label] * n, method, params, seed)
                done = [(r, wall / n, seed, n) for r in results]
            except FastDecodeError:
                if n == 1:
                    raise
                done = []  # a method that generates one image at a time: each image its own seed
                for i in range(n):
                    one, wall = _generate(model, [label], method, params, seed + i)
                    done.append((one[0], wall, seed + i, 1))
            for r, wall_each, used, size in done:
                out.images.append(np.asarray(r.image))
                out.codes.append(list(r.token_ids))
                out.labels.append(c)
                out.forwards.append(r.stats.forwards)
                out.wall_s.append(wall_each)
                out.seeds.append(used)
                out.batch.append(size)
    return out


def draw_independent(model: ModelAdapter, data: RunData, cfg: ImageBenchConfig) -> Drawn:
    """Every token from its class-conditional per-position empirical marginal of the train codes (add-one
    smoothing over the codes seen at that position in that class, none elsewhere)."""
    spec = model.image
    assert spec is not None
    codes, labels = data.train_codes
    out = Drawn()
    gen = torch.Generator().manual_seed(sample_seed(cfg.seed, 0, 9999))
    for c in range(spec.C):
        mine = codes[torch.as_tensor(labels == c)]  # [n_c, h*w]
        counts = torch.zeros(spec.tokens, spec.K)  # [h*w, K]
        counts.scatter_add_(1, mine.T.long(), torch.ones(mine.T.shape))
        start = time.perf_counter()
        drawn = torch.multinomial(counts / counts.sum(1, keepdim=True), cfg.per_class, replacement=True,
                                  generator=gen).T  # [per_class, h*w]
        images = spec.decode(drawn)  # [per_class, H, W]
        wall = (time.perf_counter() - start) / cfg.per_class
        for i in range(cfg.per_class):
            out.images.append(images[i])
            out.codes.append(drawn[i].tolist())
            out.labels.append(c)
            out.forwards.append(0)
            out.wall_s.append(wall)
            out.seeds.append(cfg.seed)
            out.batch.append(cfg.per_class)
    return out


def time_entry(model: ModelAdapter, method: str, params: Mapping[str, Any], cfg: ImageBenchConfig
               ) -> dict[str, Any]:
    """Wall seconds per image at batch 1 (latency_images images, one class after another) and at batch
    throughput_batch (one batch after one warm-up batch); None with the error where the method refuses batches."""
    spec = model.image
    assert spec is not None
    _generate(model, [spec.labels[0]], method, params, 1)  # warm-up
    walls, forwards = [], []
    for i in range(cfg.latency_images):
        results, wall = _generate(model, [spec.labels[i % spec.C]], method, params, sample_seed(cfg.seed, i, 5000))
        walls.append(wall)
        forwards.append(results[0].stats.forwards)
    out: dict[str, Any] = {"wall_s_b1": float(np.mean(walls)), "forwards_b1": float(np.mean(forwards)),
                           "batch": cfg.throughput_batch}
    labels = [spec.labels[i % spec.C] for i in range(cfg.throughput_batch)]
    try:
        _generate(model, labels, method, params, 2)  # warm-up at this shape
        _, wall = _generate(model, labels, method, params, sample_seed(cfg.seed, 0, 6000))
        out["wall_s_batch"] = wall / cfg.throughput_batch
    except FastDecodeError as e:
        out["wall_s_batch"], out["batch_error"] = None, str(e)
    return out


# -- scoring -------------------------------------------------------------------------------------------------------

@torch.no_grad()
def teacher_nll(model: ModelAdapter, codes: Sequence[Sequence[int]], labels: Sequence[int], cfg_scale: float,
                batch: int = 128) -> float:
    """Mean negative log-likelihood per token (nats) of the codes under the guided teacher: logits
    u + s (c - u) from the class row c and the null row u, restricted to the code ids, at temperature 1."""
    spec = model.image
    assert spec is not None
    module = model.model  # the Hugging Face causal LM
    total, count = 0.0, 0
    for start in range(0, len(codes), batch):
        x = torch.as_tensor([list(c) for c in codes[start:start + batch]], dtype=torch.long)  # [B, h*w]
        cls = torch.as_tensor([spec.class_token(int(c)) for c in labels[start:start + batch]])[:, None]  # [B, 1]
        null = torch.full_like(cls, spec.null_token)
        rows = torch.cat([torch.cat([cls, x[:, :-1]], 1), torch.cat([null, x[:, :-1]], 1)]).to(model.device)
        logits = module(input_ids=rows).logits[..., :spec.K].float()  # [2B, h*w, K]
        cond, uncond = logits.chunk(2)
        guided = uncond + cfg_scale * (cond - uncond)  # [B, h*w, K]
        logp = torch.log_softmax(guided, -1).gather(-1, x.to(model.device)[..., None])  # [B, h*w, 1]
        total -= float(logp.sum())
        count += x.numel()
    return total / count


def quality(drawn: Drawn, data: RunData, cfg: ImageBenchConfig) -> tuple[dict[str, Any], np.ndarray]:
    """FD, KID, class accuracy and k-NN precision/recall of the drawn images against the reference set; and the
    per-image correctness (the rows' score)."""
    scores = data.evaluator.score(np.stack(drawn.images))
    correct = scores.predicted == np.asarray(drawn.labels)
    k = kid(scores.features, data.ref_features, subset_size=cfg.kid_subset, seed=cfg.seed)
    pr = precision_recall(data.ref_features, scores.features)
    return {"n": len(drawn.images), "fd": frechet_distance(scores.features, data.ref_features),
            "kid": k.mean, "kid_std": k.std, "kid_subsets": k.subsets, "kid_subset_size": k.subset_size,
            "class_accuracy": float(correct.mean()), "precision": pr.precision, "recall": pr.recall}, correct


def floors(data: RunData, cfg: ImageBenchConfig) -> dict[str, Any]:
    """The tokenizer floor (the real test images against the reference set) and the KID floor (the two halves of
    the reference set against each other: what sampling noise alone gives)."""
    real = data.evaluator.score(data.real[0])
    ref = data.ref_features
    half = len(ref) // 2
    order = np.random.default_rng(cfg.seed).permutation(len(ref))
    a, b = ref[order[:half]], ref[order[half:2 * half]]
    pr = precision_recall(ref, real.features)
    return {"fd": frechet_distance(real.features, ref), "kid": kid(real.features, ref, seed=cfg.seed).mean,
            "class_accuracy": float((real.predicted == data.real[1]).mean()),
            "reference_class_accuracy": float((data.evaluator.score(data.reference[0]).predicted
                                               == data.reference[1]).mean()),
            "precision": pr.precision, "recall": pr.recall,
            "halves_fd": frechet_distance(a, b), "halves_kid": kid(a, b, seed=cfg.seed).mean, "n": len(ref)}


# -- the run ---------------------------------------------------------------------------------------------------------

Progress = Callable[[str, int, int], None]  # phase, done, total


@dataclass
class ImageBenchSummary:
    out_dir: Path
    run: str
    metrics: list[dict[str, Any]]
    grids: list[Path]
    report: Path


def run_image_bench(model: str | ModelAdapter, methods: Sequence[str], out_dir: str | Path, *,
                    params: Mapping[str, Mapping[str, Any]] | None = None, cfg: ImageBenchConfig | None = None,
                    evaluator: Evaluator | None = None, train: ImageSet | None = None, test: ImageSet | None = None,
                    independent: bool = True, command: str | None = None,
                    on_progress: Progress | None = None) -> ImageBenchSummary:
    """Run `methods` (plus the baseline ar.sample) on `model`; append rows to out_dir/samples.jsonl and
    out_dir/metrics.jsonl, write the grids to out_dir/grids/ and rebuild out_dir/report.md from every metrics row.

    `params` maps a method to its parameters (a --methods entry `m:k=v` adds its own); `train`/`test` override the
    data set chosen from the model's image size; `evaluator` the shipped one (`fastdecode/zoo/img-eval`).
    """
    cfg = cfg or ImageBenchConfig()
    cfg.check()
    folder = Path(out_dir)
    check_out(folder / SAMPLES)
    report = on_progress or (lambda phase, done, total: None)
    target, model_id = load_model(model, {})
    assert target is not None and model_id is not None
    spec = target.image
    if spec is None:
        raise ImageBenchError(f"{model_id} is not an image model (no image.json): the image benchmark needs a "
                              "class-conditional image model such as zoo:img-ar.")
    entries = [Entry.parse(BASELINE), *(e for e in map(Entry.parse, dict.fromkeys(methods)) if e.text != BASELINE)]
    for e in entries:
        resolve(target, e.method)  # a method that does not fit the model is refused before anything runs
    evaluator = evaluator or load_evaluator()
    if train is None or test is None:
        train, test = image_data(target)
    data = prepare(target, train, test, evaluator)
    run = uuid.uuid4().hex[:12]
    meta = {"suite": SUITE, "model": model_id, "run": run, "command": command, **versions(),
            "machine": machine(target.device), "config": asdict(cfg)}
    folder.mkdir(parents=True, exist_ok=True)
    metrics: list[dict[str, Any]] = [{**meta, "method": "reference", "entry": "reference", **floors(data, cfg)}]
    grids = []
    baseline_timing: dict[str, Any] = {}
    todo: list[Entry | None] = [*entries, *([None] if independent else [])]
    for done, entry in enumerate(todo):
        label = entry.text if entry is not None else INDEPENDENT
        report(label, done, len(todo))
        given = {**(params or {}).get(entry.method, {}), **entry.own} if entry is not None else {}
        if entry is None:
            drawn, timing = draw_independent(target, data, cfg), {}
        else:
            try:
                drawn = draw(target, entry.method, given, cfg)
                timing = time_entry(target, entry.method, given, cfg)
            except FastDecodeError as e:
                raise ImageBenchError(f"{entry.text} failed on {model_id}: {e}") from e
        if entry is not None and entry.text == BASELINE:
            baseline_timing = timing
        scores, correct = quality(drawn, data, cfg)
        scale = _cfg_scale(target, given)
        nll = teacher_nll(target, drawn.codes, drawn.labels, scale)
        name = f"{_slug(model_id)}--{_slug(label)}--n{cfg.per_class}-s{cfg.seed}.png"
        grid = write_grid(folder / "grids" / name, drawn.images, drawn.labels, spec.C, cfg.grid_per_class)
        grids.append(grid)
        row = {**meta, "method": entry.method if entry else INDEPENDENT, "entry": label, "params": given,
               "is_baseline": entry is not None and entry.text == BASELINE, "cfg_scale": scale, **scores,
               "nll_per_token": nll,
               "forwards_per_image": float(np.mean(drawn.forwards)), **timing,
               **_speedups(timing, baseline_timing), "grid": str(grid.relative_to(folder)),
               "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        metrics.append(row)
        _append(folder / SAMPLES, _sample_rows(drawn, correct, label, entry, given, meta, target))
    report("done", len(todo), len(todo))
    _append(folder / METRICS, metrics)
    path = write_report(folder, read_metrics(folder / METRICS))
    return ImageBenchSummary(folder, run, metrics, grids, path)


def _cfg_scale(model: ModelAdapter, params: Mapping[str, Any]) -> float:
    spec = model.image
    assert spec is not None
    return float(params.get("cfg_scale", spec.cfg_scale))


def _speedups(timing: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float | None]:
    def ratio(key: str) -> float | None:
        a, b = timing.get(key), base.get(key)
        return b / a if a and b else None

    return {"speedup_b1": ratio("wall_s_b1"), "speedup_batch": ratio("wall_s_batch")}


def _sample_rows(drawn: Drawn, correct: np.ndarray, label: str, entry: Entry | None, given: Mapping[str, Any],
                 meta: Mapping[str, Any], model: ModelAdapter) -> list[dict[str, Any]]:
    spec = model.image
    assert spec is not None
    rows, seen = [], [0] * spec.C
    for i, c in enumerate(drawn.labels):
        rows.append({
            "suite": SUITE, "task": f"class.{spec.labels[c]}", "item": seen[c], "seed": drawn.seeds[i],
            "method": entry.method if entry else INDEPENDENT, "entry": label, "params": dict(given),
            "model": meta["model"], "draft": None, "is_baseline": entry is not None and entry.text == BASELINE,
            "baseline": BASELINE, "score": float(correct[i]), "new_tokens": len(drawn.codes[i]),
            "forwards": drawn.forwards[i], "wall_s": drawn.wall_s[i], "batch": drawn.batch[i],
            "token_ids": drawn.codes[i], "run": meta["run"],
        })
        seen[c] += 1
    return rows


def _append(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics rows of a run folder (a truncated last line, from a hard kill, is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def read_samples(path: Path) -> list[dict[str, Any]]:
    return read_rows(path)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in text).strip("_")
