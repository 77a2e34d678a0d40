"""Where a decode step's device time goes: the kernels of a few `ar.greedy` steps on the 1.1B shape (random weights,
bfloat16, exact mode), by self device time, with CUDA graphs (kernels inside a replayed graph, where the profiler
sees them) and without (each kernel launched eagerly), unfused and fused (`NativeForward.fuse`), with SDPA and with
fastdecode's grouped attention (`attention.use_grouped_attention`). One table per setting goes to
OUT/kernels-<setting>.txt, the most telling first (a device call's time limit may cut the last). `--smoke` runs
the tiny shape on the CPU (seconds; CPU operators only).

    python tools/gpu_kernels.py --out OUT             # on the GPU machine
    python tools/gpu_kernels.py --smoke --out /tmp/k  # the CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastdecode  # noqa: E402


def _results_gpu():
    spec = importlib.util.spec_from_file_location("results_gpu", ROOT / "tools" / "results_gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["results_gpu"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--steps", type=int, default=32, help="decode steps profiled after a warm-up generation")
    args = ap.parse_args(argv)
    rg = _results_gpu()
    plan = rg.SMOKE if args.smoke else rg.FULL
    device = torch.device("cpu" if args.smoke else "cuda")
    model = rg.random_llama(plan, device, torch.bfloat16)
    prompt = rg.repeated_prompt(plan, model.vocab_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    backend = "eager" if args.smoke else "inductor"
    settings = (("graphs", True, False, False), ("graphs-fused-grouped", True, True, True),
                ("graphs-grouped", True, False, True), ("graphs-fused", True, True, False),
                ("eager", False, False, False))
    for name, graphs, fused, grouped in settings:
        with rg.setting(model, True, graphs, backend if fused else None, grouped):
            fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=4)  # warm-up (compiles where fused)
            with profile(activities=activities) as prof:
                fastdecode.generate(model, prompt[: len(prompt) // 8], "ar.greedy", max_new_tokens=args.steps)
        table = prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90)
        (out / f"kernels-{name}.txt").write_text(table + "\n")
        print(f"{name}: {out / f'kernels-{name}.txt'}", flush=True)


if __name__ == "__main__":
    main()
