"""`fastdecode serve` through the official openai client against a live server on 127.0.0.1 (zoo:ar-tiny)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from serve_live import NAME, Live, free_port, prompts, questions

import fastdecode
from fastdecode.bench.tasks import format_prompt
from fastdecode.serve import ServeConfig

GREEDY = ["ar.greedy", "spec.pld", "spec.suffix", "spec.ngram", "hf.greedy"]


def _extra(method: str, **params) -> dict:
    return {"fastdecode": {"method": method, **params}}


@pytest.mark.parametrize("method", GREEDY)
def test_completion_equals_generate(client, tiny, method):
    for prompt in prompts(3):
        r = client.completions.create(model=NAME, prompt=prompt, max_tokens=24, extra_body=_extra(method))
        ref = fastdecode.generate(tiny, prompt, method, max_new_tokens=24)
        assert r.choices[0].text == ref.text
        assert r.choices[0].finish_reason == ("stop" if ref.stats.finish_reason == "eos" else "length")
        assert r.usage.completion_tokens == ref.stats.new_tokens
        assert r.usage.prompt_tokens == len(ref.prompt_ids)
        details = r.usage.completion_tokens_details
        if method == "spec.suffix":  # it learns from every request, so its drafts depend on what came before
            assert 0 <= details.accepted_prediction_tokens < r.usage.completion_tokens
            continue
        assert details.accepted_prediction_tokens == ref.stats.accepted
        assert details.rejected_prediction_tokens == ref.stats.proposed - ref.stats.accepted


def test_chat_uses_the_zoo_format(client, tiny):
    q = questions(1)[0]
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": q}], max_tokens=24)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == fastdecode.generate(tiny, format_prompt(q), max_new_tokens=24).text
    assert r.object == "chat.completion"


def test_models_and_health(client, live):
    assert [m.id for m in client.models.list().data] == [NAME]
    h = httpx.get(live.url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok"


def _sse_lines(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streaming_equals_whole_response(client, live, tiny, kind):
    q = questions(2)[1]
    if kind == "completion":
        stream = client.completions.create(model=NAME, prompt=format_prompt(q), max_tokens=32, stream=True,
                                           stream_options={"include_usage": True}, extra_body=_extra("spec.pld"))
        chunks = list(stream)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        stream = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": q}], max_tokens=32,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body=_extra("spec.pld"))
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[0].choices[0].delta.role == "assistant"
    ref = fastdecode.generate(tiny, format_prompt(q), "spec.pld", max_new_tokens=32)
    assert text == ref.text
    assert len([c for c in chunks if c.choices]) > 2  # streamed in pieces, not in one
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == ref.stats.new_tokens
    assert usage.completion_tokens_details.accepted_prediction_tokens == ref.stats.accepted
    # the raw stream: server-sent events, the last one [DONE]
    lines = _sse_lines(live.url + "/v1/completions", {"model": NAME, "prompt": format_prompt(q), "max_tokens": 8,
                                                      "stream": True})
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    assert all("usage" not in json.loads(line[6:]) for line in lines[:-1])  # no usage unless asked


def test_n_seed_and_stop(client, tiny):
    prompt = prompts(1)[0]
    greedy = client.completions.create(model=NAME, prompt=prompt, max_tokens=20, n=3)
    ref = fastdecode.generate(tiny, prompt, max_new_tokens=20).text
    assert [c.index for c in greedy.choices] == [0, 1, 2] and {c.text for c in greedy.choices} == {ref}
    # sampling: a seed repeats, and n draws are n different rows of one generator
    a, b = (client.completions.create(model=NAME, prompt=prompt, max_tokens=20, n=3, temperature=1.0, seed=7)
            for _ in range(2))
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    # a stop string cuts the text before it and ends the choice with "stop"
    stop = ref[5:8]
    cut = client.completions.create(model=NAME, prompt=prompt, max_tokens=20, stop=[stop])
    assert cut.choices[0].text == ref[: ref.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=NAME, prompt=prompt, max_tokens=20, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ref[: ref.find(stop)]


def test_logprobs(client, tiny):
    q = questions(1)[0]
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": q}], max_tokens=10,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:  # greedy: the emitted token is the most likely one
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs), abs=1e-5)
    c = client.completions.create(model=NAME, prompt=format_prompt(q), max_tokens=10, logprobs=2)
    assert len(c.choices[0].logprobs.token_logprobs) == c.usage.completion_tokens
    assert "".join(c.choices[0].logprobs.tokens).strip() == c.choices[0].text.strip()


BAD = [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    ({"model": NAME}, 400),  # no prompt
    ({"model": NAME, "prompt": "x", "max_tokens": 0}, 400),
    ({"model": NAME, "prompt": "x", "n": 0}, 400),
    ({"model": NAME, "prompt": "x", "temperature": -1}, 400),
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": "spec.nope"}}, 400),
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": "dlm.threshold"}}, 400),  # a diffusion method
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": "spec.draft_model"}}, 400),  # needs a draft
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": "spec.pld", "top_k": -3}}, 400),
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": "ar.greedy", "bogus": 1}}, 400),
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": 5}}, 400),
    ({"model": NAME, "prompt": "x", "fastdecode": {"method": "ar.greedy"}, "temperature": 0.8}, 400),
    ({"model": NAME, "prompt": "word " * 600, "max_tokens": 8}, 400),  # over the context
    ({"model": NAME, "prompt": "x", "max_tokens": 100000}, 400),
    ({"model": NAME, "prompt": ""}, 400),
    ({"model": NAME, "prompt": [99999999]}, 400),
    ({"model": NAME, "prompt": "x", "presence_penalty": 1.0}, 400),
    ({"model": NAME, "prompt": "x", "stream": True, "logprobs": 1}, 400),
    ({"model": NAME, "prompt": "x", "stop": [str(i) for i in range(17)]}, 400),
    ({"model": "gpt-4", "prompt": "x"}, 404),
]


@pytest.mark.parametrize(("body", "status"), BAD)
def test_malformed_requests_get_openai_errors(live, body, status):
    if isinstance(body, bytes):
        r = httpx.post(live.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(live.url + "/v1/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]


def test_malformed_chat_and_routes(live):
    for body in ({"model": NAME, "messages": []}, {"model": NAME, "messages": [{"role": "robot", "content": "x"}]},
                 {"model": NAME, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                 {"model": NAME, "messages": [{"role": "assistant", "content": "x"}]}):
        r = httpx.post(live.url + "/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"], r.text
    r = httpx.get(live.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(live.url + "/health").status_code == 200  # the engine survived all of it


def _counter(live, name: str) -> float:
    text = httpx.get(live.url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith(f'fastdecode:{name}{{model_name="{NAME}"}} '))
    return float(line.split()[-1])


def test_metrics(client, live):
    client.completions.create(model=NAME, prompt=prompts(1)[0], max_tokens=24, extra_body=_extra("spec.suffix"))
    text = httpx.get(live.url + "/metrics").text
    for name in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "num_requests_waiting", "num_requests_running",
                 "generation_tokens_total", "time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_count", "avg_generation_throughput_toks_per_s"):
        assert f'fastdecode:{name}{{model_name="{NAME}"}} ' in text, name
    assert _counter(live, "spec_decode_num_drafts_total") > 0
    assert f'fastdecode:spec_decode_num_accepted_tokens_per_pos{{model_name="{NAME}",position=' in text


def _wait_idle(live, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while live.scheduler.live:
        assert time.monotonic() < deadline, f"{live.scheduler.live} requests never ended"
        time.sleep(0.02)


LONG = "def f(x):\n    return"  # ar-tiny runs on to max_tokens after it (no EOS in 400 tokens)


def test_cancellation_mid_stream(live):
    before = _counter(live, "generation_tokens_total")
    body = {"model": NAME, "prompt": LONG, "max_tokens": 400, "stream": True,
            "fastdecode": {"method": "ar.greedy"}}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 3:
                break  # leave mid-stream: the connection closes
    _wait_idle(live)
    time.sleep(0.2)
    # the row left the batch: far fewer than 400 tokens were generated, and nothing is left behind
    assert _counter(live, "generation_tokens_total") - before < 300
    assert live.scheduler.live == 0 and live.scheduler.waiting == 0


def test_timeout(live):
    live.app.state.config.timeout_s = 0.05
    try:
        r = httpx.post(live.url + "/v1/completions", json={"model": NAME, "prompt": LONG, "max_tokens": 400},
                       timeout=60)
    finally:
        live.app.state.config.timeout_s = 600.0
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    _wait_idle(live)


def test_full_queue_gets_429(live, tiny):
    from fastdecode.serve.scheduler import Request

    sched = live.scheduler
    entered, release = threading.Event(), threading.Event()

    def blocking_sink(event: tuple) -> None:  # holds the engine thread at this request's first event
        entered.set()
        release.wait(30)

    sched.submit(Request([tiny.encode("Q: x\nA: ")], 1, "ar.greedy", {"max_new_tokens": 4}, {}, blocking_sink))
    assert entered.wait(30)
    sched.max_queue = 1
    results: list[httpx.Response] = []

    def post() -> None:
        results.append(httpx.post(live.url + "/v1/completions", timeout=60,
                                  json={"model": NAME, "prompt": "Q: x\nA: ", "max_tokens": 2}))

    waiting = threading.Thread(target=post)
    try:
        waiting.start()
        deadline = time.monotonic() + 10
        while sched.waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(live.url + "/v1/completions", json={"model": NAME, "prompt": "Q: y\nA: ", "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert r.json()["error"]["code"] == "queue_full"
    finally:
        sched.max_queue = 256
        release.set()
    waiting.join(30)
    assert results[0].status_code == 200  # the queued one was served once the engine moved on
    _wait_idle(live)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the RSS from /proc")
def test_load_64_concurrent_streams(live, tiny):
    """64 streaming requests at once, four methods: all finish, each exactly once, each equal to its own single
    generation, within a time limit; afterwards nothing is left and the memory is back near its idle level."""
    methods = ["ar.greedy", "spec.pld", "spec.suffix", "ar.greedy"]
    qs = prompts(16)
    jobs = [(i, qs[i % 16], methods[i % 4]) for i in range(64)]
    refs = {(p, m): fastdecode.generate(tiny, p, m, max_new_tokens=16).text for _, p, m in jobs}

    async def one(client: openai.AsyncOpenAI, i: int, prompt: str, method: str) -> tuple[int, str, str]:
        stream = await client.completions.create(model=NAME, prompt=prompt, max_tokens=16, stream=True,
                                                 extra_body={**_extra(method), "user": str(i)})
        text = "".join([c.choices[0].text async for c in stream if c.choices])
        return i, text, stream.response.headers.get("content-type", "")

    async def run_all() -> list[tuple[int, str, str]]:
        client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(client, *job) for job in jobs)), timeout=90)
        finally:
            await client.close()

    asyncio.run(run_all())  # warm-up: the allocator reaches its working size
    _wait_idle(live)
    idle = _rss_mb()
    start = time.monotonic()
    out = asyncio.run(run_all())
    elapsed = time.monotonic() - start
    assert sorted(i for i, _, _ in out) == list(range(64))  # none lost, none twice
    for i, text, _ in out:
        _, prompt, method = jobs[i]
        assert text == refs[(prompt, method)], (i, method)
    assert elapsed < 60
    _wait_idle(live)
    assert live.scheduler.waiting == 0 and _counter(live, "num_requests_running") == 0
    assert _rss_mb() - idle < 64, "memory did not come back near its idle level"


def test_shutdown_refuses_new_requests_with_503(tiny):
    server = Live(tiny, ServeConfig(served_name=NAME))
    try:
        server.scheduler.shutdown(wait=True)
        r = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "Q: x\nA: ", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    finally:
        server.stop()


def test_graceful_shutdown_finishes_requests_in_flight(tmp_path):
    """`fastdecode serve` in its own process: SIGTERM while four requests run or wait: all four finish."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "fastdecode", "serve", "--model", "zoo:ar-tiny", "--port", str(port),
                             "--threads", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        results: dict[int, list[str]] = {}
        started = threading.Barrier(5)

        def stream(i: int) -> None:
            body = {"model": "zoo:ar-tiny", "prompt": LONG, "max_tokens": 48, "stream": True,
                    "fastdecode": {"method": "ar.greedy", "repetition_penalty": 1.0 + i / 1000}}  # four batches
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                started.wait()  # accepted (the headers came back): running or queued
                got = [line for line in r.iter_lines() if line]
            results[i] = got

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        started.wait(timeout=60)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        # uvicorn ends by raising the signal it caught again, after the shutdown: the exit status of a SIGTERM
        assert proc.wait(60) in (0, -signal.SIGTERM)
        assert sorted(results) == [0, 1, 2, 3]
        for got in results.values():
            assert got[-1] == "data: [DONE]"
            finish = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in got[:-1]]
            assert finish[-1] == "length"  # all 48 tokens: nothing was cut off by the shutdown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_chat_template_where_the_tokenizer_has_one(tiny):
    from fastdecode.serve.app import chat_prompt
    from fastdecode.serve.protocol import ChatRequest

    body = ChatRequest.model_validate({"model": NAME, "messages": [{"role": "system", "content": "Be brief."},
                                                                   {"role": "user", "content": "hi"}]})
    assert chat_prompt(tiny, body) == tiny.encode("Be brief.\nQ: hi\nA: ")  # no template: the zoo's format
    old = getattr(tiny.tokenizer, "chat_template", None)
    tiny.tokenizer.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                                    "{% if add_generation_prompt %}<assistant>{% endif %}")
    try:
        ids = chat_prompt(tiny, body)
    finally:
        tiny.tokenizer.chat_template = old
    assert tiny.decode(ids) == "<system>Be brief.<user>hi<assistant>"


def test_a_diffusion_model_is_served(tmp_path):
    dlm = fastdecode.load("zoo:dlm-small")
    server = Live(dlm, ServeConfig(served_name="dlm", method="dlm.threshold"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        prompt = prompts(1)[0]
        ref = fastdecode.generate(dlm, prompt, "dlm.threshold", max_new_tokens=32)
        r = client.completions.create(model="dlm", prompt=prompt, max_tokens=32)
        assert r.choices[0].text == ref.text
        chunks = [c for c in client.completions.create(model="dlm", prompt=prompt, max_tokens=32, stream=True)
                  if c.choices]
        assert "".join(c.choices[0].text for c in chunks) == ref.text  # the text comes when the canvas is done
        bad = httpx.post(server.url + "/v1/completions", json={"model": "dlm", "prompt": prompt, "logprobs": 1})
        assert bad.status_code == 400 and "diffusion" in bad.json()["error"]["message"]
    finally:
        server.stop()


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}


@pytest.mark.parametrize("method", ["ar.greedy", "spec.pld"])
def test_response_format_is_a_constraint(client, tiny, method):
    """OpenAI's json_schema response_format (and fastdecode's regex one) constrain the output exactly as
    generate(constraint=...) does; a bad schema is a 400 before anything runs."""
    pytest.importorskip("llguidance")
    import json

    from fastdecode.constraints import json_schema, regex

    prompt = prompts(1)[0]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=32, extra_body={
        "response_format": fmt, **_extra(method)})
    ref = fastdecode.generate(tiny, prompt, method, max_new_tokens=32, constraint=json_schema(SCHEMA))
    assert r.choices[0].text == ref.text
    assert json.loads(r.choices[0].text)["answer"] in ("yes", "no")
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, extra_body={
        "response_format": {"type": "regex", "regex": "[ab]{3}"}, **_extra(method)})
    assert r.choices[0].text == fastdecode.generate(tiny, prompt, method, max_new_tokens=8,
                                                    constraint=regex("[ab]{3}")).text
    import openai

    for bad in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
                {"type": "xml"}, {"type": "json_schema"}):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=NAME, prompt=prompt, max_tokens=8, extra_body={"response_format": bad})
        assert e.value.body["param"] == "response_format"


def test_response_format_is_never_dropped(client, tiny):
    """A constraint whose matcher fails mid-request is a 400 (it used to answer 200 with unconstrained text); an
    unsatisfiable regex is a 400 before anything runs; output cut by max_tokens before the constraint is complete
    ends with finish_reason "length" (issue #29)."""
    pytest.importorskip("llguidance")
    prompt = prompts(1)[0]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt=prompt, max_tokens=8, extra_body={
            "response_format": {"type": "regex", "regex": "(a{1000}){1000}"}})
    assert "matcher failed" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt=prompt, max_tokens=8, extra_body={
            "response_format": {"type": "regex", "regex": r"[^\s\S]"}})
    assert e.value.body["param"] == "response_format" and "unsatisfiable" in e.value.body["message"]
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=2, extra_body={
        "response_format": {"type": "regex", "regex": "[a-z]+( [a-z]+){5}"}})
    assert r.choices[0].finish_reason == "length"
