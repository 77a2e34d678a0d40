"""Operations of the server: a client that leaves is cancelled, a body is bounded and tokenised off the event loop,
a timeout cuts a method that runs to completion (hf.*, llamacpp.*), and the metrics count every request alike."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from serve_live import NAME, Live

import fastdecode
from fastdecode.bench.tasks import format_prompt
from fastdecode.config import build_config
from fastdecode.engine import resolve
from fastdecode.serve import ServeConfig
from fastdecode.serve.scheduler import Request, Scheduler

LONG = "def f(x):\n    return"  # ar-tiny runs on to max_tokens after it (no EOS in 400 tokens)


def _metric(live, name: str, **labels: str) -> float:
    text = httpx.get(live.url + "/metrics").text
    want = ",".join([f'model_name="{NAME}"'] + [f'{k}="{v}"' for k, v in labels.items()])
    line = next((x for x in text.splitlines() if x.startswith(f"fastdecode:{name}{{{want}}} ")), None)
    return 0.0 if line is None else float(line.split()[-1])


def _wait_idle(live, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while live.scheduler.live:
        assert time.monotonic() < deadline, f"{live.scheduler.live} requests never ended"
        time.sleep(0.02)


def _body(method: str, max_tokens: int = 400, **extra) -> dict:
    return {"model": NAME, "prompt": LONG, "max_tokens": max_tokens, "fastdecode": {"method": method}, **extra}


def test_a_non_streaming_client_that_leaves_is_cancelled(live, tiny, monkeypatch):
    before = _metric(live, "generation_tokens_total")
    cancelled = _metric(live, "request_aborted_total", reason="cancelled")
    forward = tiny.forward

    def slow(*args, **kwargs):  # at most ~100 forwards a second on any machine: 400 tokens take 4 s or more
        time.sleep(0.01)
        return forward(*args, **kwargs)

    monkeypatch.setattr(tiny, "forward", slow)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection while tokens flow
        httpx.post(live.url + "/v1/completions", json=_body("ar.greedy"), timeout=1.0)
    _wait_idle(live)
    assert _metric(live, "generation_tokens_total") - before < 300  # the row left the batch
    assert _metric(live, "request_aborted_total", reason="cancelled") == cancelled + 1


def test_a_timeout_cuts_a_method_that_runs_to_completion(live, tiny):
    timeouts = _metric(live, "request_aborted_total", reason="timeout")
    forwards = 0

    def slow_first(module, args, output) -> None:  # the request has expired by the end of the first forward
        nonlocal forwards
        forwards += 1
        if forwards == 1:
            time.sleep(0.6)

    handle = tiny.model.register_forward_hook(slow_first)
    live.app.state.config.timeout_s = 0.5
    try:
        r = httpx.post(live.url + "/v1/completions", json=_body("hf.greedy"), timeout=60)
    finally:
        live.app.state.config.timeout_s = 600.0
        handle.remove()
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert forwards < 5  # transformers' loop was stopped at its next forward, not after 400 tokens
    _wait_idle(live)
    assert _metric(live, "request_aborted_total", reason="timeout") == timeouts + 1


def test_metrics_have_help_and_the_model_name_on_every_sample(live):
    lines = [x for x in httpx.get(live.url + "/metrics").text.splitlines() if x]
    typed = {x.split()[2] for x in lines if x.startswith("# TYPE")}
    helped = {x.split()[2] for x in lines if x.startswith("# HELP")}
    assert typed and typed == helped
    samples = [x for x in lines if not x.startswith("#")]
    assert samples and all(re.match(r'^fastdecode:\w+\{model_name="ar-tiny"[,}]', x) for x in samples), samples


@pytest.mark.parametrize("method", ["ar.greedy", "hf.greedy"])  # continuous, then batched to completion
def test_first_token_and_end_to_end_are_counted_once_per_request(live, method):
    ttft = _metric(live, "time_to_first_token_seconds_count")
    e2e = _metric(live, "e2e_request_latency_seconds_count")
    r = httpx.post(live.url + "/v1/completions", json=_body(method, 8, n=2), timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    _wait_idle(live)
    assert _metric(live, "time_to_first_token_seconds_count") == ttft + 1
    assert _metric(live, "e2e_request_latency_seconds_count") == e2e + 1


def test_a_body_over_the_limit_gets_413(tiny):
    server = Live(tiny, ServeConfig(served_name=NAME, max_body_mb=0.01))  # 10 kB
    try:
        big = _body("ar.greedy", 4) | {"prompt": "x " * 20_000}
        declared = httpx.post(server.url + "/v1/completions", json=big)
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "request_too_large" and "--max-body-mb" in declared.text

        def chunks():  # no Content-Length: the limit is counted as the body arrives
            for _ in range(40):
                yield b"x" * 1000

        chunked = httpx.post(server.url + "/v1/completions", content=chunks(),
                             headers={"content-type": "application/json"})
        assert chunked.status_code == 413
        small = httpx.post(server.url + "/v1/completions", json=_body("ar.greedy", 2), timeout=60)
        assert small.status_code == 200
    finally:
        server.stop()


def test_health_answers_while_a_large_body_is_tokenised(live):
    result: list[httpx.Response] = []
    body = _body("ar.greedy", 4) | {"prompt": "the quick brown fox jumps " * 20_000}  # 0.5 MB: about a second
    post = threading.Thread(target=lambda: result.append(
        httpx.post(live.url + "/v1/completions", json=body, timeout=120)))
    post.start()
    slowest = 0.0
    while post.is_alive():
        start = time.monotonic()
        assert httpx.get(live.url + "/health", timeout=30).status_code == 200
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.05)
    post.join()
    assert result[0].status_code == 400  # longer than the context, but read and tokenised
    assert slowest < 0.5


class _Sink:
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.done = threading.Event()

    def __call__(self, event: tuple) -> None:
        self.events.append(event)
        if event[0] in ("end", "error"):
            self.done.set()


def _run_one(model, method: str, prompt: str, max_tokens: int) -> tuple[_Sink, Scheduler]:
    sched = Scheduler(model, window_s=0)
    params = {"max_new_tokens": max_tokens}
    config = vars(build_config(resolve(model, method).config, params, method))
    sink = _Sink()
    sched.submit(Request([model.encode(prompt)], 1, method, params, dict(config), sink))
    assert sink.done.wait(120)
    sched.shutdown()
    return sink, sched


def test_a_speculative_stream_sends_one_chunk_per_engine_step(tiny):
    prompt = format_prompt("Repeat: abc abc abc abc abc abc abc abc")
    sink, _ = _run_one(tiny, "spec.pld", prompt, 48)
    _, _, completion, accepted, _ = sink.events[-1]
    chunks = [e for e in sink.events if e[0] in ("delta", "finish")]
    assert accepted > 0  # several tokens in some steps...
    assert len(chunks) <= completion - accepted  # ...but at most one chunk per step (a step: accepted drafts + 1)


def test_diffusion_generation_tokens_are_the_committed_tokens():
    dlm = fastdecode.load("zoo:dlm-small")
    sink, sched = _run_one(dlm, "dlm.threshold", format_prompt("Sort these letters: q w e r t y"), 32)
    _, _, completion, _, _ = sink.events[-1]
    assert sched.metrics.generation_tokens == completion  # not the 32 positions of its canvas


class _SlowLlama:
    """Stands in for llama_cpp.Llama (the extra is a 40-minute source build): a greedy loop that evaluates one token
    per forward, 0.05 s each, and always proposes token 5 (never EOS), so 400 tokens take 20 s if nothing stops it."""

    def __init__(self) -> None:
        self.evals = 0
        self.draft_model = None

    def reset(self) -> None:
        pass

    def eval(self, tokens) -> None:
        self.evals += 1
        time.sleep(0.05)

    def generate(self, tokens, **_):
        self.eval(tokens)
        while True:
            yield 5
            self.eval([5])


def test_a_timeout_cuts_llama_cpps_own_loop(live, monkeypatch):
    import importlib.machinery
    import sys
    import types

    from fastdecode.llamacpp import driver

    fake = types.ModuleType("llama_cpp")
    fake.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)  # the registry's requires check finds it
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    llm = _SlowLlama()
    monkeypatch.setattr(driver, "runtime", lambda *args, **kwargs: llm)
    timeouts = _metric(live, "request_aborted_total", reason="timeout")
    live.app.state.config.timeout_s = 0.5
    started = time.monotonic()
    try:
        r = httpx.post(live.url + "/v1/completions", json=_body("llamacpp.greedy"), timeout=60)
    finally:
        live.app.state.config.timeout_s = 600.0
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
    _wait_idle(live)
    assert time.monotonic() - started < 5 and llm.evals < 60  # stopped at a forward soon after 0.5 s, not at 400
    assert _metric(live, "request_aborted_total", reason="timeout") == timeouts + 1


def test_the_stop_hook_cuts_only_the_engine_threads_own_forwards(tiny):
    # the hook that stops hf.* once its batch is gone sits on the shared torch model: a forward that another thread
    # runs meanwhile (a library caller, a test comparing with generate()) must run, not be abandoned
    from types import SimpleNamespace

    from fastdecode.serve.scheduler import _Abandoned

    scheduler = Scheduler(tiny)
    try:
        gone = SimpleNamespace(cancelled=True)  # a request whose client left
        with scheduler._abandon_when_gone([gone]):  # type: ignore[list-item]
            other: list = []
            worker = threading.Thread(target=lambda: other.append(
                fastdecode.generate(tiny, "a b", "hf.greedy", max_new_tokens=3)))
            worker.start()
            worker.join(60)
            assert other and other[0].stats.new_tokens == 3
            with pytest.raises(_Abandoned):  # the engine's own thread: stopped at its next forward
                fastdecode.generate(tiny, "a b", "hf.greedy", max_new_tokens=3)
        assert fastdecode.generate(tiny, "a b", "hf.greedy", max_new_tokens=3).stats.new_tokens == 3  # hook removed
    finally:
        scheduler.shutdown()
