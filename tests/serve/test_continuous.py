"""Continuous batching in the serve scheduler: an ar.* or spec.* request that arrives while a batch runs joins it at
the next step, with its own max_tokens, and every output equals its single-request greedy output."""

from __future__ import annotations

import threading
import time

import pytest

import fastdecode
from fastdecode.bench.tasks import format_prompt
from fastdecode.config import build_config
from fastdecode.engine import resolve
from fastdecode.serve.scheduler import Request, Scheduler

QUESTIONS = ["Reverse this list: [I, J, Z, Z]", "Sort these letters: q w e r t y u i o p",
             "Count the items: [a, b, c, d, e, f, g, h]", "Repeat: abc abc abc abc abc abc abc abc"]


class _Sink:
    def __init__(self) -> None:
        self.events: list[tuple[float, tuple]] = []
        self.done = threading.Event()

    def __call__(self, event: tuple) -> None:
        self.events.append((time.monotonic(), event))
        if event[0] in ("end", "error"):
            self.done.set()

    def first(self, kind: str) -> float:
        return next(t for t, e in self.events if e[0] == kind)

    def tokens(self) -> list[int]:
        return next(e[5] for _, e in self.events if e[0] == "finish")


def _request(model, prompt: list[int], max_tokens: int, sink: _Sink, method: str = "ar.greedy") -> Request:
    params = {"max_new_tokens": max_tokens}
    config = vars(build_config(resolve(model, method).config, params, method))
    return Request([prompt], 1, method, params, dict(config), sink)


@pytest.mark.parametrize("method", ["ar.greedy", "spec.pld", "spec.suffix"])
def test_a_request_arriving_mid_batch_joins_it(tiny, method):
    prompts = [tiny.encode(format_prompt(q)) for q in QUESTIONS]
    refs = [fastdecode.generate(tiny, p, "ar.greedy", max_new_tokens=48).token_ids for p in prompts]
    long = max(range(len(prompts)), key=lambda i: len(refs[i]))
    short = next(i for i in range(len(prompts)) if i != long)
    assert len(refs[long]) >= 16, "no prompt gives a long enough output to join during"
    short_ref = fastdecode.generate(tiny, prompts[short], "ar.greedy", max_new_tokens=4).token_ids

    scheduler = Scheduler(tiny, max_batch=4, window_s=0)
    try:
        a, b = _Sink(), _Sink()
        scheduler.submit(_request(tiny, prompts[long], 48, a, method))
        deadline = time.monotonic() + 30
        while scheduler.metrics.generation_tokens == 0:  # the first batch is running
            assert time.monotonic() < deadline
            time.sleep(0.001)
        scheduler.submit(_request(tiny, prompts[short], 4, b, method))
        assert a.done.wait(60) and b.done.wait(60)
        assert scheduler.joined == 1  # b joined a's running batch instead of waiting for it to end
        assert b.first("finish") < a.first("finish")  # and left it before a finished
        assert a.tokens() == refs[long] and b.tokens() == short_ref
        deadline = time.monotonic() + 10  # the engine forgets the requests right after their last event
        while scheduler.live or scheduler.metrics.running:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        scheduler.shutdown()


def test_a_request_with_a_sparse_attention_rule_is_served_with_it(tiny):
    """Rows cannot join a session that decodes with a sparse rule, so such a request runs as its own batch through
    generate(): its output is the sparse one, not the dense one a continuous session would give. (A lossless method,
    ar.greedy or spec.*, refuses a sparse rule: ar.sample is the method with a session that takes one.)"""
    method = "ar.sample"
    prompt = tiny.encode(format_prompt(QUESTIONS[0]) + " " + " ".join(["the quick brown fox"] * 20))
    params = {"max_new_tokens": 12, "seed": 3, "attention": "streaming:budget=8,sinks=1,recent=4"}
    ref = fastdecode.generate(tiny, prompt, method, **params).token_ids
    scheduler = Scheduler(tiny, max_batch=4, window_s=0)
    try:
        sink = _Sink()
        config = vars(build_config(resolve(tiny, method).config, dict(params), method))
        req = Request([prompt], 1, method, dict(params), dict(config), sink)
        assert not scheduler._continuous(req)
        scheduler.submit(req)
        assert sink.done.wait(60)
        assert sink.tokens() == ref
    finally:
        scheduler.shutdown()
