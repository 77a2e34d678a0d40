"""Do the fused kernels build under this torch? The zoo's diffusion forward (`MDLMForMaskedDiffusion.fuse`) and causal
direct forward (`NativeForward.fuse`) compiled by inductor (whole graph, dynamic shapes) on this machine's device, two
prompts of different lengths each, with the fall-back to the unfused forward turned into an error; prints whether the
tokens equal the unfused run's (float32 on the CPU; in bfloat16 a fused kernel may round differently).

A check for a torch version other than the one the project pins (the lent GPUs run torch 2.11): dynamo's tracing is
the same on every device, so a graph break or an unsupported call shows here on the CPU (inductor builds C++ there).

    python tools/fused_compile.py                       # zoo:dlm-small and zoo:ar-small, float32 and bfloat16

`--backend eager` traces without building kernels (dynamo alone: what tests/bench/test_fused_compile.py runs).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.errors import FastDecodeWarning  # noqa: E402

METHODS = {"zoo:dlm-small": "dlm.baseline", "zoo:ar-small": "ar.greedy"}
PROMPTS = ("def add(a, b):\n", "x = [1, 2, 3]\nfor")


def fused_module(model: object) -> object:
    """What `fuse` belongs to: the diffusion model itself, or a causal model's direct forward."""
    native = getattr(model, "native", None)
    return native if native is not None else model.model  # type: ignore[attr-defined]


def check(name: str, dtype: str, device: str, tokens: int, backend: str = "inductor") -> str:
    model = fastdecode.load(name, device=device, dtype=dtype, graphs=False)
    method = METHODS[name]
    plain = [fastdecode.generate(model, p, method, max_new_tokens=tokens).token_ids for p in PROMPTS]
    fused_module(model).fuse(True, backend=backend)  # type: ignore[attr-defined]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastDecodeWarning)  # "could not be built ... runs unfused" fails the check
        fused = [fastdecode.generate(model, p, method, max_new_tokens=tokens).token_ids for p in PROMPTS]
    seconds = time.perf_counter() - start
    same = sum(a == b for a, b in zip(plain, fused, strict=True))
    return (f"{name} {dtype} on {device}: fused forward built and ran in {seconds:.1f} s (compile included), "
            f"tokens equal to the unfused run's on {same} of {len(PROMPTS)} prompts (torch {torch.__version__})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (eager: tracing alone)")
    args = parser.parse_args(argv)
    for name in args.models:
        for dtype in args.dtypes:
            print(check(name, dtype, args.device, args.tokens, args.backend), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
