"""One driver for every `llamacpp.*` method: llama-cpp-python's own generation loop on the converted weights.

fastdecode tokenises; llama.cpp gets token ids and returns token ids, so the rows are comparable with every other
method's. Its loop is watched the way `hf/driver.py` watches transformers': every `eval` call is one target forward
(the prompt, then the last token plus any drafted ones), and the tokens yielded before the next `eval` are what that
forward committed. The same wrapper asks the caller's `should_stop` (the server's timeout and disconnect) before
each forward and ends the row there, since llama.cpp's loop never passes through a torch module that the server
could watch as it watches `hf.*`'s. The loaded runtime is kept between calls (one per converted file and settings),
so a benchmark pays the conversion and the load in its warm-up, not in its rows.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import IncompatibleMethodError
from ..hf.driver import Run, Step, replay
from ..models.causal import CausalLM
from ..types import PromptBatch, StepEvent
from .convert import cached_gguf

_RUNTIMES: dict[tuple[Any, ...], Any] = {}  # (path, n_ctx, threads, logits_all) -> llama_cpp.Llama, a few at most
_KEEP = 2


@atexit.register
def _close_all() -> None:
    """Free the runtimes before the interpreter tears llama_cpp's module down (its finaliser fails after that)."""
    while _RUNTIMES:
        _RUNTIMES.popitem()[1].close()


def runtime(model: CausalLM, n_ctx: int, logits_all: bool, dtype: str = "f32") -> Any:
    """A `llama_cpp.Llama` on `model`'s weights, with as many threads as torch uses (bench --threads)."""
    import llama_cpp  # an optional extra; the registry checks it is installed before the driver runs

    if model.device.type != "cpu":
        raise IncompatibleMethodError(  # llama-cpp-python's CPU build is what the extra installs
            f"llamacpp.* runs llama.cpp on the CPU; load the model on the CPU (device='cpu'), not {model.device}."
        )
    path = str(cached_gguf(model, dtype))
    threads = torch.get_num_threads()
    key = (path, os.path.getmtime(path), n_ctx, threads, logits_all)
    if key not in _RUNTIMES:
        while len(_RUNTIMES) >= _KEEP:
            _RUNTIMES.pop(next(iter(_RUNTIMES))).close()
        _RUNTIMES[key] = llama_cpp.Llama(
            model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads, n_threads_batch=threads,
            logits_all=logits_all, verbose=False, seed=0,
        )
    return _RUNTIMES[key]


def _context(batch: PromptBatch, max_new_tokens: int, extra: int) -> int:
    """A context length that holds the longest prompt, its new tokens and one more draft, rounded up to 256."""
    need = max(batch.lengths) + max_new_tokens + extra + 1
    return -(-need // 256) * 256


class _Stopped(Exception):
    """Raised from the `eval` wrapper when the caller's `should_stop` says the rows are no longer wanted."""


def generate_one(llm: Any, prompt: list[int], max_new_tokens: int, eos: frozenset[int], draft: Any = None,
                 should_stop: Callable[[], bool] | None = None) -> Run:
    """Greedy generation of one prompt by llama.cpp's loop, its forwards counted from `eval` calls; `should_stop`
    is asked before each forward, and True ends the row with the tokens it has."""
    run = Run()
    evals: list[int] = []  # tokens fed to each eval call
    inner = llm.eval

    def counted(tokens: Any) -> None:
        if should_stop is not None and should_stop():
            raise _Stopped
        evals.append(len(tokens))
        inner(tokens)

    llm.eval = counted  # an instance attribute, deleted below
    llm.draft_model = draft
    llm.reset()  # no prefix reuse from an earlier prompt: every row pays its own prefill
    yielded: list[int] = []  # tokens committed after each eval call
    try:
        for token in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            while len(yielded) < len(evals):
                yielded.append(0)
            yielded[-1] += 1
            run.tokens.append(int(token))
            if int(token) in eos or len(run.tokens) >= max_new_tokens:
                break
    except _Stopped:  # the caller no longer wants the row: it ends at this forward, not after max_new_tokens
        pass
    finally:
        del llm.eval
        llm.draft_model = None
    for fed, count in zip(evals, yielded, strict=False):
        drafted = 0 if not run.steps else fed - 1  # the first eval holds the prompt
        run.steps.append(Step(proposed=drafted, accepted=max(0, count - 1), draft_forwards=0))
    return run


def llamacpp_driver(
    model: CausalLM, batch: PromptBatch, max_new_tokens: int, draft: Any = None, draft_len: int = 0,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[StepEvent]:
    """Generate each prompt on its own with llama.cpp, then replay the steps of all rows in lockstep."""
    llm = runtime(model, _context(batch, max_new_tokens, draft_len), logits_all=draft is not None)
    eos = model.eos_token_ids
    yield from replay([generate_one(llm, batch.row(b), max_new_tokens, eos, draft, should_stop)
                       for b in range(batch.size)])
