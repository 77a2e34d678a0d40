"""`make results-gpu`: the GPU measurements of issue #30 in one run of under 8 minutes on one H100/H200, with only the
repository (nothing is downloaded).

1. Engine speed (`engine.jsonl`): a randomly initialised Llama of TinyLlama-1.1B's shape, built on the device in
   bfloat16, on a 512-token prompt (64 random tokens said 8 times, so that copying drafters find something) and 256
   new tokens: `ar.greedy` (the baseline), `hf.greedy` (transformers' `generate()`), transformers' static cache
   with `torch.compile` (method `hf.static_compile`, timed here), `spec.suffix` and `spec.pld`. One warm-up, then
   `--reps` generations each, taking turns. `score` is 1 where the tokens equal `ar.greedy`'s.
2. The zoo (`zoo-<dtype>.jsonl`, one file per dtype so that resuming never mixes them): zoo:ar-small's lossless
   methods (zoo:ar-tiny the draft) on the code and parallel-lists suites, and zoo:dlm-small's diffusion family on
   parallel-lists, in bfloat16 (exact mode on, the CUDA default) and float32; then bfloat16 with exact mode off
   (`zoo-bfloat16-noexact.jsonl`), whose `= base` column is the agreement without the mode.

Stages run in that order; a bench run that would start after `--budget-s` is skipped with a line saying so, and the
bench files resume, so running the command again finishes them. Every row records the dtype, exact mode and the machine
(`machine.device_name`: the GPU); `fastdecode report docs/results/gpu/*.jsonl` shows them like any other.

    python tools/results_gpu.py --out docs/results/gpu            # on the GPU machine (make results-gpu)
    python tools/results_gpu.py --smoke --out /tmp/gpu-smoke      # tiny shapes on the CPU, seconds (the test)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode import attention  # noqa: E402
from fastdecode.bench.harness import run_bench  # noqa: E402
from fastdecode.bench.jobs import machine, precision, versions  # noqa: E402
from fastdecode.bench.suites import Suite, get_suite  # noqa: E402
from fastdecode.models.exact import MARGIN, Exact, exact_mode  # noqa: E402
from fastdecode.models.graphs import graphs_mode  # noqa: E402
from fastdecode.models.loading import pick_device  # noqa: E402
from fastdecode.speculative.memory import DrafterMemory  # noqa: E402

# TinyLlama-1.1B's shape (its config.json), random weights
TINYLLAMA = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
TINY = {**TINYLLAMA, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
# zoo:ar-small's lossless methods: draft-free, those that draft with zoo:ar-tiny, those that draft with a head trained
# against zoo:ar-small (shipped beside it), and spec.dlm_draft, whose draft is zoo:dlm-small
LOSSLESS = ["spec.pld", "hf.prompt_lookup", "spec.ngram", "spec.suffix", "spec.suffix:tree=true", "spec.recycling",
            "spec.lookahead", "spec.jacobi", "spec.layerskip", "spec.sparse_self", "hf.greedy", "spec.draft_model",
            "hf.assisted", "spec.rsd", "spec.dyntree", "spec.dyntree:graph=false", "spec.medusa",
            "spec.medusa:hydra=true", "spec.eagle3", "spec.dflash", "spec.dlm_draft"]
# the zoo weights a method of zoo:ar-small needs beyond its own (a device call carries a few: tools/gpu_parts.py)
ZOO_DIR = ROOT / "fastdecode" / "zoo"
DRAFT_MODELS = {"causal": "zoo:ar-tiny", "diffusion": "zoo:dlm-small"}  # the zoo's draft of each kind
HEADS = {"spec.medusa": "ar-small/heads/medusa", "spec.medusa:hydra=true": "ar-small/heads/hydra",
         "spec.eagle3": "ar-small/heads/eagle3", "spec.dflash": "ar-small/heads/dflash"}
DIFFUSION = ["dlm.threshold", "dlm.factor", "dlm.entropy_bound", "dlm.localleap", "dlm.prophet", "dlm.credit",
             "dlm.freedave", "dlm.adablock", "dlm.dcd", "dlm.r2", "dlm.ccd", "dlm.ete"]
ZOO = ("zoo:ar-small", "zoo:dlm-small")
# every block-based method with blocks of 16, as the zoo's card (the Makefile's DLM_BLOCKS)
BLOCKS = {m: {"block_length": 16} for m in ["dlm.baseline", *DIFFUSION] if m not in ("dlm.dcd", "dlm.adablock")}


@dataclass(frozen=True)
class Plan:
    """What one run measures: the engine's shape and lengths, and the zoo's suites and limits."""

    shape: dict[str, Any]
    prompt: int  # prompt tokens (a random block of prompt // 8 tokens said 8 times)
    new: int  # new tokens
    reps: int
    compile: bool
    ar_suites: tuple[tuple[str, int], ...]  # (suite, items per task)
    dlm_suites: tuple[tuple[str, int], ...]
    lossless: tuple[str, ...]
    diffusion: tuple[str, ...]
    zoo_params: dict[str, dict[str, Any]]
    one_task: bool  # smoke: the first task of each suite only
    # suites a method is not run on here: transformers' assisted loop took 29 s for the 3 code items on the H200
    # (2026-11-27; 2 s for the 14 parallel-lists items), time the device run's suite needs more; its agreement
    # outside exact mode is reported, never required (tools/gpu_verdict.py)
    not_on: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


FULL = Plan(TINYLLAMA, 512, 256, 3, True, (("code", 3), ("parallel-lists", 1)), (("parallel-lists", 1),),
            tuple(LOSSLESS), tuple(DIFFUSION), BLOCKS, False, {"hf.assisted": ("code",)})
SMOKE = Plan(TINY, 32, 12, 1, False, (("code", 1),), (("parallel-lists", 1),), ("spec.pld", "spec.suffix"),
             ("dlm.threshold",), {m.partition(":")[0]: {"max_new_tokens": 8} for m in ["ar.greedy", *LOSSLESS]},
             True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_llama(plan: Plan, device: torch.device, dtype: torch.dtype) -> fastdecode.CausalLM:
    """A randomly initialised Llama built directly on the device (no download, no host copy), in exact mode with CUDA
    graphs where `load` would turn them on (CUDA in low precision)."""
    torch.manual_seed(0)
    with torch.device(device):
        module = LlamaForCausalLM(LlamaConfig(**plan.shape)).to(dtype).eval()
    module.config.eos_token_id = None  # random weights: generate the full budget, never stop early
    module.generation_config.eos_token_id = None
    module.generation_config.pad_token_id = 0
    # the smoke run on the CPU asks for exact mode at a small width and the capture-free graphs (the same static
    # buffers), so that every engine variant runs its own path there too
    exact = Exact(8, 256) if plan.one_task else exact_mode(None, device, dtype)
    graphs = "replay" if plan.one_task else graphs_mode(None, device, exact)
    return fastdecode.CausalLM(module, name=f"random:{'tinyllama-1.1b' if plan.shape is TINYLLAMA else 'tiny'}",
                               exact=exact, graphs=graphs)


def repeated_prompt(plan: Plan, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(1)
    block = torch.randint(3, vocab, (plan.prompt // 8,), generator=g).tolist()
    return block * 8


def static_compile(model: fastdecode.CausalLM, prompt: list[int], new: int, compiled: bool) -> Callable[[], Any]:
    """transformers' own loop on its static cache; on CUDA `generate` compiles the forward itself (`torch.compile`,
    its auto-compile of static caches) unless `compiled` is False (`disable_compile`)."""
    module = model.model
    ids = torch.tensor([prompt], device=model.device)

    def run() -> list[int]:
        out = module.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                              min_new_tokens=new, cache_implementation="static", pad_token_id=0,
                              disable_compile=not compiled)
        return out[0, len(prompt):].tolist()
    return run


@dataclass(frozen=True)
class Run:
    """One engine runner: the row's method name, the method it runs, and its settings. The variants of ar.greedy
    measure what exact mode, CUDA graphs, the fused kernels (`NativeForward.fuse`) and fastdecode's own attention
    (`attention.use_grouped_attention`) each cost or save on one copy of the weights."""

    name: str
    method: str
    exact: bool = True
    graphs: bool = True
    fused: bool = False
    grouped: bool = False
    block: int | None = None  # exact mode's key block instead of the default (the cache's key columns)

    @property
    def kernels(self) -> tuple[bool, bool]:
        """(fused, grouped): a run's `= base` is against ar.greedy's run with the same two."""
        return self.fused, self.grouped


ENGINE_RUNS = (
    Run("ar.greedy", "ar.greedy"), Run("ar.greedy:graphs=false", "ar.greedy", graphs=False),
    Run("ar.greedy:exact=false", "ar.greedy", exact=False, graphs=False), Run("hf.greedy", "hf.greedy"),
    Run("spec.suffix", "spec.suffix"), Run("spec.pld", "spec.pld"),
    Run("ar.greedy:fused=true", "ar.greedy", fused=True), Run("spec.suffix:fused=true", "spec.suffix", fused=True),
    Run("ar.greedy:grouped=true", "ar.greedy", grouped=True),
    Run("ar.greedy:fused=true,grouped=true", "ar.greedy", fused=True, grouped=True),
    Run("spec.suffix:fused=true,grouped=true", "spec.suffix", fused=True, grouped=True),
    # the key block before the second device run (2048 columns, where the default is 256): the attention over the
    # whole storage, measured against the default in the same run
    Run("ar.greedy:block=2048", "ar.greedy", block=2048),
    Run("ar.greedy:fused=true,block=2048", "ar.greedy", fused=True, block=2048),
)
RUNS = {r.name: r for r in ENGINE_RUNS}
# the ar.greedy run each (fused, grouped) setting is compared with
BASES = {r.kernels: r.name for r in ENGINE_RUNS
         if r.method == "ar.greedy" and r.exact and r.graphs and r.block is None}


@contextlib.contextmanager
def setting(model: fastdecode.CausalLM, exact: bool, graphs: bool, fused: str | None = None,
            grouped: bool = False, block: int | None = None) -> Iterator[None]:
    """Exact mode (at another key `block` if given), CUDA graphs, the fused kernels (`fused`: torch.compile's
    backend) and the grouped attention on or off for the block, as loaded outside it (unfused, SDPA)."""
    saved = model.exact, model.graphs
    model.exact = saved[0] if exact else None
    if block is not None and model.exact is not None:
        model.exact = Exact(model.exact.width, block)
    model.graphs = saved[1] if exact and graphs else None
    if fused and model.native is not None:
        model.native.fuse(backend=fused)
    attention.use_grouped_attention(grouped)
    try:
        yield
    finally:
        model.exact, model.graphs = saved
        if model.native is not None:
            model.native.fuse(False)
        attention.use_grouped_attention(False)


def attention_kernels(model: fastdecode.CausalLM, prompt: list[int]) -> dict[str, Any]:
    """Which attention kernels a short generation launches (CUDA: torch's profiler; the issue asks whether the
    memory-efficient kernel replaced cuDNN's), with graphs off so that every kernel is seen."""
    if model.device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    with setting(model, True, False), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=4)
    names = sorted({e.key for e in prof.key_averages()
                    if any(w in e.key.lower() for w in ("attention", "fmha", "flash", "cudnn", "sdpa", "softmax"))})
    return {"attention_kernels": names[:20]}


# the methods whose device reads the engine probe counts: the baseline, two host drafters, and a draft model's greedy
# chain (the target's own first layers: spec.layerskip with a fixed skip set, `skip_layers` below, and no confidence
# stop)
READ_PROBES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("ar.greedy", {}), ("spec.suffix", {}), ("spec.pld", {}),
    ("spec.layerskip", {"confidence_stop": 0.0, "max_draft_tokens": 4}))


def skip_layers(layers: int) -> str:
    """The upper half of a model's layers but its last (at least layer 1): spec.layerskip's fixed skip set."""
    return ",".join(str(i) for i in range(max(layers // 2, 1), max(layers - 1, 2)))


def device_reads(model: fastdecode.CausalLM, prompt: list[int], new: int, anywhere: bool = False) -> dict[str, Any]:
    """Copies from the device to the host per target forward of a generation of each of `READ_PROBES` (CUDA: torch's
    profiler; each such copy waits for the device, a synchronisation): the issue asks for at most one a speculative
    step. The generation runs once unprofiled first (compilation, captures). Off the GPU nothing is counted
    (`anywhere` runs the generations there all the same: the smoke test)."""
    cuda = model.device.type == "cuda"
    if not cuda and not anywhere:
        return {}
    from torch.profiler import ProfilerActivity, profile

    found = {}
    for method, params in READ_PROBES:
        if method == "spec.layerskip":
            params = {**params, "skip_layers": skip_layers(model.model.config.num_hidden_layers)}
        fastdecode.generate(model, prompt, method, max_new_tokens=new, memory=DrafterMemory(), **params)
        with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
            r = fastdecode.generate(model, prompt, method, max_new_tokens=new, memory=DrafterMemory(), **params)
        copies = sum(1 for e in prof.events() if "DtoH" in e.name or "Device -> Pageable" in e.name)
        syncs = sum(1 for e in prof.events() if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
        found[method] = {"forwards": r.stats.forwards, "dtoh_per_forward": round(copies / r.stats.forwards, 2),
                         "stream_syncs_per_forward": round(syncs / r.stats.forwards, 2)}
    return {"device_reads": found}


def step_probe(model: fastdecode.CausalLM, prompt: list[int], plan: Plan, out: Path,
               say: Callable[[str], None], profile: bool = True) -> dict[str, Any]:
    """Where a graphed `ar.greedy` step goes (CUDA graphs on): the steady-state wall time of a step (a generation of
    `plan.new` tokens less a shorter one over a cache of the same capacity, so the prefill, the eager first forward and
    the capture cancel out), the device time of one replay (synchronised before and after, medians), the capture of
    a new cache's graph (the model's kept storage dropped first: cache/pool.py), and what a generation costs beyond
    its steps (`fixed_ms`; `fixed_cold_ms` with a new cache's first forward and capture); the host's top operations by
    self CPU time over a short generation go to `engine-profile.txt`."""
    if model.graphs is None:
        return {}
    from fastdecode.models.graphs import Graphs

    def timed(new: int) -> float:
        gc.collect()
        _sync(model.device)
        t = time.perf_counter()
        fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=new)
        _sync(model.device)
        return time.perf_counter() - t

    # the short generation's cache must have the long one's capacity (exact mode sizes a cache to its request), or
    # its steps would attend over fewer key columns and the difference would not be one step's cost
    assert model.exact is not None  # (graphs run in exact mode)
    room = model.exact.capacity(len(prompt) + plan.new + MARGIN)
    short = next((n for n in range(max(plan.new // 4, 2), plan.new)
                  if model.exact.capacity(len(prompt) + n + MARGIN) == room), max(plan.new // 4, 2))
    walls = [(timed(plan.new), timed(short)) for _ in range(2)]
    step_ms = min(1e3 * (long - brief) / (plan.new - short) for long, brief in walls)
    replays: list[float] = []
    captures: list[float] = []
    replay, capture = Graphs._replay, Graphs._capture

    def timed_replay(self: Any, entry: Any, cache: Any) -> None:
        _sync(model.device)
        t = time.perf_counter()
        replay(self, entry, cache)
        _sync(model.device)
        replays.append(time.perf_counter() - t)

    def timed_capture(self: Any, *args: Any) -> None:
        _sync(model.device)
        t = time.perf_counter()
        capture(self, *args)
        _sync(model.device)
        captures.append(time.perf_counter() - t)

    Graphs._replay, Graphs._capture = timed_replay, timed_capture  # type: ignore[method-assign]
    model.graphs.pool.clear()  # a new cache's first forward and capture, as without the kept storage
    try:
        cold = timed(short)
    finally:
        Graphs._replay, Graphs._capture = replay, capture  # type: ignore[method-assign]
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        with profiler(activities=[ProfilerActivity.CPU]) as prof:
            fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=short)
        (out.parent / "engine-profile.txt").write_text(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
    replays.sort()
    # what a generation costs beyond its steps (the prompt's forwards, the set-up): with a kept storage whose graphs
    # replay from the first forward, and with a new one (its eager first forward and capture)
    fixed = {"fixed_ms": round(1e3 * min(brief for _, brief in walls) - short * step_ms, 1),
             "fixed_cold_ms": round(1e3 * cold - short * step_ms, 1)}
    result = {"step_ms": round(step_ms, 3), "replay_ms": round(1e3 * replays[len(replays) // 2], 3),
              "capture_ms": [round(1e3 * c, 1) for c in captures], "step_tokens": [short, plan.new], **fixed}
    say(f"engine step: {result}")
    return {"step": result}


def engine(plan: Plan, device: torch.device, out: Path, meta: dict[str, Any], say: Callable[[str], None],
           only: list[str] | None = None) -> None:
    model = random_llama(plan, device, torch.bfloat16 if device.type == "cuda" or not plan.one_task else torch.float32)
    prompt = repeated_prompt(plan, model.vocab_size)
    backend = "eager" if plan.one_task else "inductor"  # the smoke run traces the fused functions without compiling
    runners: dict[str, Callable[[], tuple[list[int], int]]] = {}
    if only is not None:  # the baselines always run: ar.greedy, and its run in each setting asked for
        only = [*only, "ar.greedy", *(BASES[RUNS[n].kernels] for n in only if n in RUNS)]
    for spec in ENGINE_RUNS:
        if only is not None and spec.name not in only:
            continue

        def run(spec: Run = spec) -> tuple[list[int], int]:
            # a fresh memory each time: spec.suffix must not remember the previous repetition's output
            with setting(model, spec.exact, spec.graphs, backend if spec.fused else None, spec.grouped, spec.block):
                r = fastdecode.generate(model, prompt, spec.method, max_new_tokens=plan.new, memory=DrafterMemory())
            return r.token_ids, r.stats.forwards
        name = spec.name
        runners[name] = run
    if only is None or "hf.static_compile" in only:
        hf_static = static_compile(model, prompt, plan.new, plan.compile)
        runners["hf.static_compile"] = lambda: (ids := hf_static(), len(ids))
    rows = []
    for name, run in runners.items():  # warm-up (and compilation)
        t = time.perf_counter()
        try:
            run()
        except Exception as e:  # one broken runner must not cost the others' rows on a lent device
            say(f"engine warm-up {name} FAILED: {type(e).__name__}: {e}")
            runners[name] = None  # type: ignore[assignment]
            continue
        say(f"engine warm-up {name}: {time.perf_counter() - t:.1f} s")
    runners = {k: v for k, v in runners.items() if v is not None}
    bases: dict[tuple[bool, bool], list[int]] = {}  # ar.greedy's tokens in each (fused, grouped) setting
    failed: set[str] = set()
    # each row is written as it is made: a device call's time limit that stops the stage keeps the rows before it
    with out.open("a") as written:
        for rep in range(plan.reps):
            for name, run in runners.items():
                if name in failed:
                    continue
                gc.collect()  # dead caches (and their retired graphs) go before the clock starts, not inside a run
                _sync(device)
                t = time.perf_counter()
                try:
                    ids, forwards = run()
                except Exception as e:  # keep the other runners' rows
                    say(f"engine {name} rep {rep} FAILED: {type(e).__name__}: {str(e)[:300]}")
                    failed.add(name)
                    continue
                _sync(device)
                wall = time.perf_counter() - t
                spec = RUNS.get(name, Run(name, name, exact=False, graphs=False))  # (hf.static_compile: neither)
                if name == BASES[spec.kernels]:
                    bases[spec.kernels] = ids
                row = engine_row(meta, model, spec, rep, ids, forwards, wall, bases.get(spec.kernels), plan,
                                 len(prompt))
                rows.append(row)
                written.write(json.dumps(row) + "\n")
                written.flush()
    for name in runners:
        mine = [r for r in rows if r["method"] == name]
        if not mine:
            continue
        rate = sum(r["new_tokens"] for r in mine) / sum(r["wall_s"] for r in mine)
        say(f"engine {name}: {rate:.1f} tokens/s, equal to ar.greedy {sum(r['score'] for r in mine):.0f}/{len(mine)}")
    probe = {**attention_kernels(model, prompt[:64]), **device_reads(model, prompt, 64),
             **step_probe(model, prompt, plan, out, say)}
    for key, fused, grouped in (("step_fused", True, False), ("step_grouped", False, True),
                                ("step_fused_grouped", True, True)):
        if BASES[fused, grouped] in runners:
            with setting(model, True, True, backend if fused else None, grouped):
                probe[key] = step_probe(model, prompt, plan, out, say, profile=False).get("step")
    probe["graphs"] = dict(model.graphs.stats) if model.graphs is not None else None
    out.with_name("engine-probe.json").write_text(json.dumps(probe, indent=1) + "\n")
    say(f"engine probe: {probe}")


def engine_row(meta: dict[str, Any], model: fastdecode.CausalLM, spec: Run, rep: int, ids: list[int],
               forwards: int, wall: float, base: list[int] | None, plan: Plan, prompt_tokens: int) -> dict[str, Any]:
    """One timed generation of the engine stage as a bench row, its setting (`spec`) in `params` and `exact`."""
    method, equal = spec.name, base is not None and ids == base
    params: dict[str, Any] = {"max_new_tokens": plan.new}
    if method == "hf.static_compile":
        params["compiled"] = plan.compile and model.device.type == "cuda"
    if spec.fused:
        params["fused"] = True
    if spec.grouped:
        params["grouped"] = True
    if spec.block is not None:
        params["block"] = spec.block
    params["graphs"] = bool(spec.exact and spec.graphs and model.graphs is not None)
    return {
        "suite": "engine", "task": f"engine.repeat-{prompt_tokens}", "item": rep, "seed": 0, "method": method,
        "params": params,
        "default_budget": True, "model": model.name, "draft": None,
        "is_baseline": method == "ar.greedy", "baseline": "ar.greedy",
        "lossless": method != "hf.static_compile", "score": float(equal), "scores": {},
        "equal_to_baseline": equal, "prompt_tokens": prompt_tokens, "new_tokens": len(ids), "forwards": forwards,
        "draft_forwards": 0, "proposed": 0, "accepted": 0, "accepted_per_position": [], "wall_s": wall,
        "draft_s": 0.0, "verify_s": 0.0, "peak_rss_mb": 0.0,
        "peak_device_mb": torch.cuda.max_memory_allocated(model.device) / 2**20 if model.device.type == "cuda" else 0.0,
        "finish_reason": "length", "tokens_per_forward": len(ids) / max(forwards, 1),
        "tokens_per_s": len(ids) / wall, "acceptance_rate": 0.0, "output": "", "token_ids": ids,
        **meta, **precision(model), "machine": machine(model.device), "run": meta["run"],
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "exact": model.exact.width if spec.exact and model.exact is not None else None,
    }


def suite_of(name: str, one_task: bool) -> Suite | str:
    if not one_task:
        return name
    s = get_suite(name)
    return Suite(s.name, s.description, s.tasks[:1])


def weights(name: str) -> Path:
    """The weights file of a zoo model (`zoo:NAME`) or shipped head (`MODEL/heads/KIND`)."""
    return ZOO_DIR / name.removeprefix("zoo:") / "model.safetensors"


def draft_of(method: str) -> str | None:
    """The zoo draft model a method of zoo:ar-small drafts with (the registry says whether it takes one, and of
    which kind); None: it drafts without one."""
    m = fastdecode.get_method(method.partition(":")[0])
    return DRAFT_MODELS[m.draft_kind] if m.needs_draft else None


def absent(model: str, method: str) -> Path | None:
    """A weights file that `method` on `model` needs and this checkout lacks (None: it can run)."""
    needed = [model, draft_of(method), HEADS.get(method)]
    return next((weights(n) for n in needed if n is not None and not weights(n).exists()), None)


def by_draft(methods: list[str]) -> dict[str | None, list[str]]:
    """The methods by the draft their bench run loads: those that draft with zoo:ar-tiny share one run with the
    draft-free ones (which ignore it), and each other draft model has a run of its own."""
    groups: dict[str | None, list[str]] = {}
    for method in methods:
        draft = draft_of(method)
        groups.setdefault(None if draft == "zoo:ar-tiny" else draft, []).append(method)
    if any(draft_of(m) for m in groups.get(None, [])):  # (one of them drafts with zoo:ar-tiny)
        groups["zoo:ar-tiny"] = groups.pop(None)
    return groups


def bench_apart(run: Callable[..., Any], methods: list[str], say: Callable[[str], None], label: str,
                strict: bool) -> None:
    """`run(methods=...)` (a bench run); where it raises on a lent device (not `strict`), each method again on its own,
    so that one broken method costs only its own rows (rows resume: the baseline's and the done methods' are kept);
    each failure is a FAILED line."""
    attempts = [methods]
    while attempts:
        these = attempts.pop(0)
        try:
            run(methods=these)
        except Exception as e:
            if strict:
                raise
            what = f"{type(e).__name__}: {str(e)[:300]}"
            if len(these) > 1:
                say(f"{label}: {what}; each method on its own")
                attempts = [[m] for m in these] + attempts
            else:
                say(f"{label} {these[0]} FAILED: {what}")


def zoo(plan: Plan, device: torch.device, dtype: str, exact: bool | Exact | None, out: Path, command: str,
        say: Callable[[str], None], time_left: Callable[[], bool], models: list[str],
        graphs: bool | None = None, fused: bool | None = None) -> None:
    """Each zoo model's methods on its suites, one bench run per draft model; a method whose weights (its model, draft
    or head) this checkout lacks is left out with a line saying which file."""
    load = {"device": str(device), "dtype": dtype, **({} if exact is None else {"exact": exact}),
            **({} if graphs is None else {"graphs": graphs}), **({} if fused is None else {"fused": fused})}
    for model, methods, suites in (("zoo:ar-small", plan.lossless, plan.ar_suites),
                                   ("zoo:dlm-small", plan.diffusion, plan.dlm_suites)):
        if model not in models or not methods:  # (--methods named none of this model's)
            continue
        runnable = []
        for method in methods:
            missing = absent(model, method)
            if missing is None:
                runnable.append(method)
            else:
                say(f"{model} {method} {dtype} left out: {missing.relative_to(ROOT)} is not in this checkout")
        for draft, group in by_draft(runnable).items():
            names = {m.partition(":")[0] for m in group} | {"ar.greedy", "dlm.baseline"}
            params = {m: p for m, p in plan.zoo_params.items() if m in names}
            for suite, limit in suites:
                these = [m for m in group if suite not in plan.not_on.get(m, ())]
                if not these:
                    continue
                if not time_left():
                    say(f"{model} {suite} {dtype} skipped: past --budget-s; run the command again to finish it")
                    continue
                run = functools.partial(run_bench, suite_of(suite, plan.one_task), model, out=out, draft=draft,
                                        params=params, limit=limit, command=command, load_kwargs=load,
                                        warmup=not plan.one_task)
                bench_apart(run, these, say, f"{model} {suite} {dtype}", strict=plan.one_task)
                say(f"{model} {suite} {dtype} exact={exact} draft={draft}: {out}")


def warm(device: torch.device, models: list[str], say: Callable[[str], None]) -> None:
    """A short generation of each zoo model in bfloat16 and float32, with its baseline method; nothing is kept."""
    for name in models:
        method = "dlm.baseline" if name.startswith("zoo:dlm") else "ar.greedy"
        for dtype in ("bfloat16", "float32"):
            model = fastdecode.load(name, device=str(device), dtype=dtype)
            fastdecode.generate(model, "def add(a, b):", method, max_new_tokens=16)
    _sync(device)
    say(f"warmed up: {', '.join(models)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu"), help="folder of the JSONL files")
    ap.add_argument("--device", default=None, help="default: cuda (the CPU with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and one item each: the CPU, seconds")
    ap.add_argument("--budget-s", type=float, default=360.0,
                    help="no bench run starts after this many seconds (one run takes up to about two minutes)")
    ap.add_argument("--reps", type=int, default=None, help="timed generations of each engine runner (default 3)")
    ap.add_argument("--stages", nargs="+", default=["engine", "bfloat16", "float32", "bfloat16-noexact",
                                                         "bfloat16-nographs"])
    ap.add_argument("--models", nargs="+", default=list(ZOO), choices=list(ZOO),
                    help="the zoo models of the zoo stages (a device call that carries one model at a time)")
    engine_runs = [*RUNS, "hf.static_compile"]
    ap.add_argument("--engine-runs", nargs="+", default=None, choices=engine_runs,
                    help="the engine's runners (default all; ar.greedy, the baseline, always runs)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="the zoo's methods instead of the plan's (both models; the baseline always runs)")
    args = ap.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    if args.reps is not None:
        plan = dataclasses.replace(plan, reps=args.reps)
    if args.methods is not None:
        ar = tuple(m for m in args.methods if not m.startswith("dlm."))
        plan = dataclasses.replace(plan, lossless=ar, diffusion=tuple(m for m in args.methods if m not in ar))
    device = pick_device(args.device or ("cpu" if args.smoke else "cuda"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "tools/results_gpu.py", *(argv if argv is not None else sys.argv[1:])])
    meta = {"command": command, "run": uuid.uuid4().hex[:12], **versions()}
    start = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {text}", flush=True)

    def time_left() -> bool:
        return time.perf_counter() - start <= args.budget_s

    stages: dict[str, Callable[[], None]] = {
        "engine": lambda: engine(plan, device, out / "engine.jsonl", meta, say, args.engine_runs),
        # exact mode is the CUDA default in bfloat16; the smoke run on the CPU asks for it, at a small width
        "bfloat16": lambda: zoo(plan, device, "bfloat16", Exact(8, 256) if args.smoke else None,
                                out / "zoo-bfloat16.jsonl", command, say, time_left, args.models),
        "float32": lambda: zoo(plan, device, "float32", None, out / "zoo-float32.jsonl", command, say,
                               time_left, args.models),
        # each zoo model's baseline alone in float32: against the bfloat16 rows of the same process (the same
        # `command`), bfloat16 at least as fast (tools/gpu_verdict.py), without the other methods' float32 runs
        "float32-baseline": lambda: zoo(dataclasses.replace(plan, lossless=("ar.greedy",), diffusion=("dlm.baseline",)),
                                        device, "float32", None, out / "zoo-float32.jsonl", command, say, time_left,
                                        args.models),
        # exact mode without CUDA graphs: whether a method's identity in bfloat16 depends on the capture
        "bfloat16-nographs": lambda: zoo(plan, device, "bfloat16", Exact(8, 256) if args.smoke else None,
                                         out / "zoo-bfloat16-nographs.jsonl", command, say, time_left, args.models,
                                         graphs=False),
        "bfloat16-noexact": lambda: zoo(plan, device, "bfloat16", False, out / "zoo-bfloat16-noexact.jsonl",
                                        command, say, time_left, args.models),
        # float32 eager (the diffusion family's graphs are on in every dtype on CUDA): bfloat16 against float32 with
        # and without them
        "float32-nographs": lambda: zoo(plan, device, "float32", None, out / "zoo-float32-nographs.jsonl", command,
                                        say, time_left, args.models, graphs=False),
        # the CUDA graphs without the fused kernels (on by default with them): what the fusion saves
        "bfloat16-unfused": lambda: zoo(plan, device, "bfloat16", Exact(8, 256) if args.smoke else None,
                                        out / "zoo-bfloat16-unfused.jsonl", command, say, time_left, args.models,
                                        fused=False),
        # one short generation per zoo model and dtype, nothing written: the process's first CUDA work (context,
        # cuBLAS handles, the allocator's first blocks) goes here rather than into the first stage's rows
        "warm": lambda: warm(device, args.models, say),
    }
    for name in args.stages:
        if name not in stages:
            raise SystemExit(f"unknown stage {name!r}: pick from {', '.join(stages)}")
        if not time_left():
            say(f"stage {name} skipped: past --budget-s {args.budget_s:.0f}; run the command again to finish it")
            continue
        try:
            stages[name]()
        except Exception as e:  # on a lent device a broken stage must not cost the next ones
            if args.smoke:
                raise
            say(f"stage {name} FAILED: {type(e).__name__}: {str(e)[:300]}")
    say("done")


if __name__ == "__main__":
    main()
