"""The demo: the `quick` suite through the bench harness on the bundled zoo models, then the report and plots.

Models that are not bundled (or whose methods are not registered) are skipped with a note, so the demo
runs with whatever the zoo holds. `run_demo` takes any model paths, which is how the tests drive it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..models.loading import zoo_names
from ..registry import list_methods
from .harness import Progress, run_bench
from .report import Report, build_report
from .suites import BenchError, Suite

DEMO_DIR = Path("runs/demo")
DEMO_SUITE = "quick"
# causal methods shown on the target: the baselines, transformers' references and the model-free drafters;
# the methods that draft with zoo:ar-tiny join them when it is bundled
CAUSAL_METHODS = ("ar.greedy", "hf.greedy", "hf.prompt_lookup", "spec.pld", "spec.suffix")
DRAFT_METHODS = ("hf.assisted", "spec.draft_model")
# methods that draft with a head trained against zoo:ar-small (fastdecode/zoo/ar-small/heads/KIND), shown when the
# head is bundled: EAGLE-3, the trained drafter that measured best here (docs/learned-eagle3.md)
HEAD_METHODS = {"spec.eagle3": "eagle3"}
# diffusion methods on dlm-small: the LLaDA baseline (one token per step) and Fast-dLLM's threshold rule
# (dlm.freedave, lossless, is left out: on a CPU its batched draft forwards cost more wall time than they save)
DIFFUSION_METHODS = ("dlm.baseline", "dlm.threshold")
# spec.draft_model with hf.assisted's settings, and hf.assisted's threshold fixed as spec.draft_model's is (transformers
# adapts it where scikit-learn is installed), so the two draft-model rows are like for like on any machine
DEMO_PARAMS: dict[str, dict[str, float | bool]] = {
    "spec.draft_model": {"num_draft_tokens": 20, "confidence_stop": 0.4}, "hf.assisted": {"adaptive_threshold": False},
    **{m: {"block_length": 16} for m in DIFFUSION_METHODS}}


@dataclass(frozen=True)
class DemoModel:
    """A model to run, the methods to run on it (the baseline is added by the harness) and its drafter."""

    model: str
    methods: tuple[str, ...]
    draft: str | None = None


@dataclass
class DemoResult:
    results: Path
    report_path: Path
    report: Report
    notes: list[str] = field(default_factory=list)


def zoo_plan(available: Sequence[str] | None = None) -> tuple[list[DemoModel], list[str]]:
    """What the demo runs given the bundled zoo models, and a note for everything it has to skip."""
    names = set(zoo_names() if available is None else available)
    registered = {m.name for m in list_methods()}
    plan: list[DemoModel] = []
    notes: list[str] = []
    if "ar-small" in names:
        methods = [m for m in CAUSAL_METHODS if m in registered]
        for method, kind in HEAD_METHODS.items():
            if method in registered and _head_bundled("ar-small", kind):
                methods.append(method)
            elif method in registered:
                notes.append(f"zoo:ar-small's {kind} head is not bundled, so {method} is skipped; train it with "
                             f"`fastdecode train drafter --target zoo:ar-small --kind {kind}`.")
        draft = None
        if "ar-tiny" in names:
            methods += [m for m in DRAFT_METHODS if m in registered]
            draft = "zoo:ar-tiny"
        else:
            notes.append("zoo:ar-tiny is not bundled, so hf.assisted and spec.draft_model (which draft with it) "
                         "are skipped; make it with `fastdecode train ar-tiny`.")
        plan.append(DemoModel("zoo:ar-small", tuple(methods), draft))
    else:
        notes.append("zoo:ar-small is not bundled, so the causal methods are skipped; "
                     "make it with `fastdecode train ar-small`.")
    if "dlm-small" not in names:
        notes.append("zoo:dlm-small is not bundled, so the diffusion methods are skipped; "
                     "make it with `fastdecode train dlm-small`.")
    elif "dlm.baseline" not in registered:
        notes.append("zoo:dlm-small is bundled but no diffusion method (dlm.baseline) is registered, so it is skipped.")
    else:
        plan.append(DemoModel("zoo:dlm-small", tuple(m for m in DIFFUSION_METHODS if m in registered)))
    return plan, notes


# the image model's methods beside ar.sample: 4 images a class each, scored by the shipped evaluator; about half a
# minute on one thread (`make results-image-methods` is the measured run the README quotes)
IMAGE_MODEL = "img-ar"
IMAGE_METHODS = ("spec.sjd:temperature=1", "spec.gsd:temperature=1", "img.zipar", "img.dd1", "img.dd2")


def run_demo_images(out_dir: str | Path = DEMO_DIR, available: Sequence[str] | None = None,
                    fresh: bool = True) -> tuple[Any, list[str]]:
    """The image part of the demo: a grid of samples per method and its forwards per image, in out_dir/image/.
    Returns the benchmark's summary (None when zoo:img-ar or its evaluator is not bundled) and notes."""
    names = set(zoo_names() if available is None else available)
    if IMAGE_MODEL not in names:
        return None, [f"zoo:{IMAGE_MODEL} is not bundled, so the image methods are skipped; make it with "
                      f"`fastdecode train img-vq` and `fastdecode train img-ar`."]
    if available is None and not (resources.files("fastdecode") / "zoo" / "img-eval" / "evaluator.json").is_file():
        return None, ["the image evaluator (zoo/img-eval) is not bundled, so the image methods are skipped; make it "
                      "with `fastdecode train img-eval`."]
    from .imagegen import ImageBenchConfig, run_image_bench  # numpy-heavy: only when the image model is there

    folder = Path(out_dir) / "image"
    if fresh:
        for name in ("samples.jsonl", "metrics.jsonl"):
            (folder / name).unlink(missing_ok=True)
    cfg = ImageBenchConfig(per_class=4, latency_images=2, throughput_batch=8, batch=40, kid_subset=40)
    registered = {m.name for m in list_methods()}
    methods = [m for m in IMAGE_METHODS if m.partition(":")[0] in registered]
    return run_image_bench(f"zoo:{IMAGE_MODEL}", methods, folder, cfg=cfg, independent=False,
                           command="fastdecode demo"), []


def _head_bundled(model: str, kind: str) -> bool:
    return (resources.files("fastdecode") / "zoo" / model / "heads" / kind / "model.safetensors").is_file()


def require_models(models: Sequence[DemoModel]) -> None:
    if not models:
        raise BenchError("No zoo models to run: make them with `fastdecode train ar-small` (see README).")


def run_demo(
    models: Sequence[DemoModel],
    out_dir: str | Path = DEMO_DIR,
    *,
    suite: str | Suite = DEMO_SUITE,
    limit: int | None = None,
    fresh: bool = True,
    command: str | None = "fastdecode demo",
    on_progress: Callable[[DemoModel, Progress], None] | None = None,
) -> DemoResult:
    """Bench every model on `suite` into `out_dir/results.jsonl`, then write `out_dir/report.md` and the plots.

    `fresh` starts a new results file (the demo measures this machine); otherwise finished rows are kept.
    """
    require_models(models)
    out_dir = Path(out_dir)
    results = out_dir / "results.jsonl"
    if fresh and results.exists():
        results.unlink()
    for m in models:
        params = {k: v for k, v in DEMO_PARAMS.items() if k in m.methods}
        run_bench(suite, m.model, list(m.methods), results, draft=m.draft, params=params, limit=limit, command=command,
                  on_progress=functools.partial(on_progress, m) if on_progress else None)
    report_path = out_dir / "report.md"
    report = build_report([results], out=report_path, plots_dir=out_dir, command=f"fastdecode report {results} "
                          f"--out {report_path} --plots {out_dir}")
    return DemoResult(results, report_path, report)
