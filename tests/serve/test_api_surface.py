"""The server's API surface as vLLM, llama.cpp and lm-eval clients use it (zoo:ar-tiny, a live server).

lm-eval (`lm-eval[api]`, `local-completions`) is not installed here: its requests are sent as it builds them
(`_create_payload` of its completions API model: token-id prompts, `echo=True`, `logprobs=1`, `max_tokens` 0 or 1)
and its answer parsing (`token_logprobs[ctxlen:-1]`) is done on the reply.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from serve_live import NAME, prompts, questions

import fastdecode
from fastdecode.bench.tasks import format_prompt


def _post(live, path: str, body: dict) -> httpx.Response:
    return httpx.post(live.url + path, json=body, timeout=60)


def _reference_logprobs(tiny, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1, from one teacher-forced forward."""
    x = torch.tensor([ids], device=tiny.device)
    with torch.no_grad():
        logits = tiny.forward(x, torch.arange(len(ids), device=tiny.device)[None])[0]  # [T, V]
    lp = logits[:-1].log_softmax(-1)  # [T-1, V]: row t predicts ids[t + 1]
    return lp.gather(1, torch.tensor(ids[1:], device=lp.device)[:, None])[:, 0].tolist()


# -- item 1: vLLM / llama.cpp extras are honoured or refused, never ignored ------------------------

def test_sampling_extras_are_honoured(live, tiny):
    prompt = prompts(1)[0]
    for extra in ({"top_k": 1}, {"top_k": 5, "min_p": 0.2}, {"repetition_penalty": 1.3}):
        body = {"model": NAME, "prompt": prompt, "max_tokens": 16, "temperature": 0.7, "seed": 3, **extra}
        r = _post(live, "/v1/completions", body)
        assert r.status_code == 200, r.text
        ref = fastdecode.generate(tiny, prompt, "ar.sample", max_new_tokens=16, temperature=0.7, seed=3, **extra)
        assert r.json()["choices"][0]["text"] == ref.text, extra
    # repetition_penalty is a parameter of ar.greedy too
    r = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 16, "repetition_penalty": 1.5})
    ref = fastdecode.generate(tiny, prompt, "ar.greedy", max_new_tokens=16, repetition_penalty=1.5)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ref.text
    # vLLM's top_k=-1 means every token, as 0 does
    r = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 4, "top_k": -1})
    assert r.status_code == 200, r.text


def test_guided_fields_are_constraints(live, tiny):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    for extra in ({"guided_json": schema}, {"json_schema": schema}, {"guided_json": json.dumps(schema)},
                  {"guided_regex": "(yes|no)"}, {"guided_choice": ["yes", "no"]},
                  {"guided_grammar": 'root ::= "yes" | "no"'}, {"grammar": 'root ::= "yes" | "no"'}):
        body = {"model": NAME, "prompt": prompts(1)[0], "max_tokens": 24, **extra}
        r = _post(live, "/v1/completions", body)
        assert r.status_code == 200, (extra, r.text)
        text = r.json()["choices"][0]["text"]
        if "guided_json" in extra or "json_schema" in extra:
            assert isinstance(json.loads(text)["a"], bool)
        else:
            assert text in ("yes", "no"), (extra, text)
    r = _post(live, "/v1/completions", {"model": NAME, "prompt": "x", "guided_regex": "a",
                                        "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex"


@pytest.mark.parametrize(("field", "value"), [
    ("top_k", 5), ("min_p", 0.1),  # a greedy method has no top_k / min_p
    ("ignore_eos", True), ("presence_penalty", 0.5), ("frequency_penalty", 1.0), ("logit_bias", {"5": 10}),
    ("best_of", 3), ("min_tokens", 4), ("tool_choice", "required"), ("tools", [{"type": "function"}]),
    ("frobnicate", 1), ("top_a", 0.1),  # not known at all
    ("max_tokens", True), ("n", True), ("temperature", True), ("seed", False), ("top_k", True),  # bools
    ("logprobs", True),
])
def test_fields_it_cannot_honour_are_refused_by_name(live, field, value):
    r = _post(live, "/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 4, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"], err


def test_neutral_values_and_bookkeeping_fields_are_taken(live):
    body = {"model": NAME, "prompt": "x", "max_tokens": 2, "ignore_eos": False, "presence_penalty": 0,
            "frequency_penalty": 0.0, "logit_bias": {}, "best_of": 1, "user": "me", "metadata": {"k": "v"},
            "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "tool_choice": "auto", "parallel_tool_calls": True}
    assert _post(live, "/v1/completions", body).status_code == 200


# -- item 2: the context and integer fields --------------------------------------------------------

def test_context_length_exceeded_has_a_code_and_a_fix(live, tiny):
    limit = tiny.max_positions
    long_prompt = [5] * (limit + 10)
    for body, param, fix in (
        ({"prompt": long_prompt}, "prompt", f"at most {limit - 1} tokens"),
        ({"prompt": long_prompt, "max_tokens": 4}, "prompt", f"at most {limit - 1} tokens"),
        ({"prompt": [5] * (limit - 3), "max_tokens": 8}, "max_tokens", "lower max_tokens to at most 3"),
    ):
        r = _post(live, "/v1/completions", {"model": NAME, **body})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == param and fix in err["message"], err
        assert "at most 0" not in err["message"]
    r = _post(live, "/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "w " * 2000}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "messages"


# -- item 3: endpoints -----------------------------------------------------------------------------

def test_models_retrieve_and_version(live, client):
    m = client.models.retrieve(NAME)
    assert m.id == NAME and m.created > 0
    assert client.models.list().data[0].created == m.created
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    v = httpx.get(live.url + "/version").json()
    assert v["version"] == fastdecode.__version__
    r = client.completions.create(model=NAME, prompt="x", max_tokens=2)
    assert r.created > 0


def test_tokenize_detokenize_and_tokenizer_info(live, tiny):
    text = prompts(1)[0]
    t = _post(live, "/tokenize", {"model": NAME, "prompt": text}).json()
    assert t["tokens"] == tiny.encode(text) and t["count"] == len(t["tokens"])
    assert t["max_model_len"] == tiny.max_positions
    bare = _post(live, "/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True}).json()
    assert bare["tokens"] == list(tiny.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(bare["token_strs"]) == bare["count"]
    d = _post(live, "/detokenize", {"model": NAME, "tokens": t["tokens"]}).json()
    assert d["prompt"] == tiny.decode(t["tokens"])
    # messages are formatted as /v1/chat/completions formats them
    q = questions(1)[0]
    chat = _post(live, "/tokenize", {"messages": [{"role": "user", "content": q}]}).json()
    assert chat["tokens"] == tiny.encode(format_prompt(q))
    info = httpx.get(live.url + "/tokenizer_info").json()
    assert info["eos_token_ids"] == sorted(tiny.eos_token_ids) and info["model_max_length"] == tiny.max_positions
    assert "eos_token" in info and "bos_token" in info and "chat_template" in info
    assert info["add_bos_token"] == (tiny.encode("a")[0] == info["bos_token_id"])
    # lm-eval's RemoteTokenizer: eos_token_id is the first id of its text tokenised without special tokens
    eos = _post(live, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"]
    assert eos[0] in tiny.eos_token_ids
    for path, body, status in (("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404),
                               ("/tokenize", {}, 400), ("/tokenize", {"prompt": "x", "bogus": 1}, 400),
                               ("/detokenize", {"tokens": [-1]}, 400), ("/detokenize", {"tokens": "x"}, 400)):
        r = _post(live, path, body)
        assert r.status_code == status and r.json()["error"]["message"], (path, body, r.text)


# -- item 4: lm-eval's loglikelihood requests ------------------------------------------------------

@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_as_lm_eval_asks(live, tiny, max_tokens):
    """lm-eval's loglikelihood payload: token-id prompts (a batch), echo, logprobs=1, temperature 0."""
    contexts = [tiny.encode(p) for p in prompts(2)]
    conts = [tiny.tokenizer(" yes", add_special_tokens=False)["input_ids"], [tiny.encode("7")[-1]]]
    batch = [c + x for c, x in zip(contexts, conts, strict=True)]
    body = {"model": NAME, "prompt": batch, "temperature": 0, "max_tokens": max_tokens, "logprobs": 1, "seed": 1234,
            "echo": True}
    r = _post(live, "/v1/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    for choice, ids, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), batch,
                                   [len(c) for c in contexts], strict=True):
        lps = choice["logprobs"]
        assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None  # nothing predicts token 0
        n_out = len(lps["token_logprobs"]) - len(ids)
        assert n_out == max_tokens
        ref = _reference_logprobs(tiny, ids)
        assert lps["token_logprobs"][1 : len(ids)] == pytest.approx(ref, abs=1e-4)
        # lm-eval's parse_logprobs: the continuation's sum and whether it is the greedy one
        end = len(ids) if max_tokens == 0 else -1
        cont = lps["token_logprobs"][ctxlen:end]
        assert sum(cont) == pytest.approx(sum(ref[ctxlen - 1 :]), abs=1e-4)
        for tok, top in zip(cont, lps["top_logprobs"][ctxlen:end], strict=True):
            assert len(top) == 1 and tok <= max(top.values()) + 1e-6
        assert choice["text"].startswith(tiny.decode(ids))
    assert out["usage"]["completion_tokens"] == len(batch) * max_tokens


def test_echo_without_logprobs_and_prompt_logprobs(live, tiny):
    prompt = prompts(1)[0]
    plain = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 8}).json()
    echoed = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 8, "echo": True}).json()
    assert echoed["choices"][0]["text"] == tiny.decode(tiny.encode(prompt)) + plain["choices"][0]["text"]
    r = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 4, "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == plain["choices"][0]["text"][: len(choice["text"])] and choice["logprobs"] is None
    ids = tiny.encode(prompt)
    pl = choice["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    ref = _reference_logprobs(tiny, ids)
    for entry, token, lp in zip(pl[1:], ids[1:], ref, strict=True):
        mine = entry[str(token)]
        assert mine["logprob"] == pytest.approx(lp, abs=1e-4) and mine["rank"] >= 1
        assert 2 <= len(entry) <= 3 and any(e["rank"] == 1 for e in entry.values())
    for bad in ({"echo": True, "logprobs": 1, "stream": True}, {"max_tokens": 0, "logprobs": 1}):
        body = {"model": NAME, "prompt": prompt, "max_tokens": 4, **bad}
        assert _post(live, "/v1/completions", body).status_code == 400
    refused = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "logprobs": 1, "stream": True})
    assert "stream=false" in refused.json()["error"]["message"]  # the refusal says how to get them


def _streamed(live, body: dict) -> list[dict]:
    """The JSON chunks of a streamed completion (without [DONE])."""
    with httpx.stream("POST", live.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [x[len("data: "):] for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("max_tokens", [0, 8])
def test_echo_and_prompt_logprobs_stream_as_vllm_sends_them(live, tiny, max_tokens):
    """A stream's first chunk of each choice carries the echoed prompt's text and its prompt_logprobs; the whole
    stream says what the response without streaming says (max_tokens=0: the prompt only, scored)."""
    texts = prompts(2)
    body = {"model": NAME, "prompt": texts, "max_tokens": max_tokens, "echo": True, "prompt_logprobs": 2,
            "stream_options": {"include_usage": True}}
    whole = _post(live, "/v1/completions", body).json()
    chunks = _streamed(live, body)
    assert chunks[-1]["usage"] == whole["usage"]
    for want in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == want["index"]]
        assert "".join(c["text"] for c in mine) == want["text"]
        assert mine[0]["text"].startswith(tiny.decode(tiny.encode(texts[want["index"]])))  # the echo comes first
        # the same entries; the stream's come from a forward over the prompt alone, the response's over prompt +
        # output, so the float32 sums may differ in the last digits
        got, ref = mine[0]["prompt_logprobs"], want["prompt_logprobs"]
        assert got[0] is None and ref[0] is None and len(got) == len(ref)
        for a, b in zip(got[1:], ref[1:], strict=True):
            assert a.keys() == b.keys() and all(a[k]["decoded_token"] == b[k]["decoded_token"] for k in a)
            assert [a[k]["logprob"] for k in a] == pytest.approx([b[k]["logprob"] for k in a], abs=1e-4)
        assert all("prompt_logprobs" not in c for c in mine[1:])
        assert mine[-1]["finish_reason"] == want["finish_reason"]


def test_sixteen_stop_strings(live, tiny):
    """lm-eval's task files send up to 5 stop strings; the server takes up to 16."""
    prompt = prompts(1)[0]
    ref = fastdecode.generate(tiny, prompt, max_new_tokens=20).text
    stop = ref[5:8]
    stops = [f"never-{i}" for i in range(15)] + [stop]
    r = _post(live, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 20, "stop": stops})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ref[: ref.find(stop)]
