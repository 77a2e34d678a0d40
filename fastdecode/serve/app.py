"""The FastAPI app: OpenAI's `/v1/completions`, `/v1/chat/completions`, `/v1/models` and `/v1/models/{id}`;
vLLM's `/version`, `/tokenize`, `/detokenize` and `/tokenizer_info` (what lm-eval's tokenizer backend asks); plus
`/health` and `/metrics`. Handlers validate and tokenise, then hand the request to the engine thread
(`scheduler.py`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..bench.tasks.base import format_prompt
from ..config import build_config
from ..engine import check_draft, compile_constraint, encode_batch, resolve
from ..errors import ArgumentError, FastDecodeError
from ..models.base import ModelAdapter
from .limits import DEFAULT_MAX_BODY_MB, BodyLimit
from .metrics import Metrics
from .protocol import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    ServeError,
    TokenizeRequest,
    error_body,
    usage,
)
from .scheduler import Request as EngineRequest
from .scheduler import Scheduler
from .vllm import check_ids, token_text, tokenizer_info, vllm_prompt_logprobs


@dataclasses.dataclass
class ServeConfig:
    served_name: str
    method: str = "ar.greedy"  # the default method of a request that names none
    max_queue: int = 256
    max_batch: int = 16
    window_s: float = 0.005
    timeout_s: float | None = 600.0  # per request, from arrival to its last token
    max_body_mb: float = DEFAULT_MAX_BODY_MB  # a larger request body gets 413 before it is read

    def check(self) -> None:
        """Refuse settings with which the server could not answer anything (every request a 429, no batch)."""
        for name, value, least in (("max_queue", self.max_queue, 1), ("max_batch", self.max_batch, 1)):
            if value < least:
                raise ArgumentError(f"--{name.replace('_', '-')} must be at least {least}, not {value}.")
        for flag, amount in (("batch_window_ms", self.window_s * 1000), ("timeout", self.timeout_s or 0.0)):
            if amount < 0:
                raise ArgumentError(f"--{flag.replace('_', '-')} must not be negative, not {amount:g}.")
        if not self.max_body_mb > 0:
            raise ArgumentError(f"--max-body-mb must be more than 0, not {self.max_body_mb}.")


def create_app(model: ModelAdapter, draft: ModelAdapter | None = None, config: ServeConfig | None = None) -> FastAPI:
    cfg = config or ServeConfig(served_name=model.name)
    cfg.check()
    resolve(model, cfg.method)  # a default method that does not fit the model is refused before serving
    check_draft(resolve(model, cfg.method), model, draft)
    metrics = Metrics(model_name=cfg.served_name)
    created = int(time.time())  # the served model's `created`: when this server started

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.scheduler = Scheduler(model, draft, metrics=metrics, max_queue=cfg.max_queue,
                                        max_batch=cfg.max_batch, window_s=cfg.window_s)
        yield
        # uvicorn has waited for the open connections (in-flight requests finish); the engine drains what is left
        await asyncio.get_running_loop().run_in_executor(None, app.state.scheduler.shutdown)

    app = FastAPI(title="fastdecode", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=int(cfg.max_body_mb * 1e6))
    app.state.metrics = metrics
    app.state.config = cfg

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:  # a bug: still OpenAI's shape
        return JSONResponse(error_body(f"Internal error: {type(exc).__name__}: {exc}", "server_error"),
                            status_code=500)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        sched: Scheduler = request.app.state.scheduler
        ok = sched.alive
        return JSONResponse({"status": "ok" if ok else "engine stopped", "waiting": sched.waiting,
                             "live": sched.live}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prom() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    def model_card() -> dict[str, Any]:
        return {"id": cfg.served_name, "object": "model", "created": created, "owned_by": "fastdecode",
                "root": model.name, "parent": None, "max_model_len": model.max_positions}

    def check_model(name: str | None) -> None:
        if name is not None and name != cfg.served_name:
            raise ServeError(404, f"The model {name!r} is not served here: this server serves "
                             f"{cfg.served_name!r} (GET /v1/models).", param="model", code="model_not_found")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model_info(name: str) -> dict[str, Any]:
        check_model(name)
        return model_card()

    @app.get("/version")
    async def version() -> dict[str, Any]:
        from .. import __version__

        return {"version": __version__}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await _body(request, TokenizeRequest)
        check_model(body.model)
        ids = _tokenize(model, body)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": model.max_positions, "tokens": ids,
                               "token_strs": None}
        if body.return_token_strs:
            out["token_strs"] = [token_text(model, t) for t in ids]
        return out

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await _body(request, DetokenizeRequest)
        check_model(body.model)
        check_ids(model, body.tokens, "tokens")
        return {"prompt": model.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info_route() -> dict[str, Any]:
        return tokenizer_info(model)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _body(request, CompletionRequest)
        prompts = await asyncio.to_thread(_completion_prompts, model, body.prompt)  # off the event loop
        return await _serve(request, "completion", body, prompts, default_max=16)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _body(request, ChatRequest)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        prompt = await asyncio.to_thread(chat_prompt, model, body)  # tokenising a long prompt: off the event loop
        return await _serve(request, "chat", body, [prompt], default_max=None)

    async def _serve(request: Request, kind: str, body: Any, prompts: list[list[int]], default_max: int | None):
        check_model(body.model)
        body.unsupported()
        top = _logprobs_asked(kind, body)
        echo = bool(getattr(body, "echo", False))
        score_only = _check_max(body, echo)  # max_tokens=0 with echo: the prompt scored, nothing generated
        prompt_lps = getattr(body, "prompt_logprobs", None)
        if top is not None and body.stream:  # the output's are scored once a row has finished, not per chunk
            raise ServeError(400, "logprobs are not streamed: send stream=false to get them (with echo=true the "
                             "prompt's come first); a stream takes echo and prompt_logprobs, in its first chunk.",
                             param="logprobs")
        if (top is not None or prompt_lps is not None) and model.kind != "causal":
            raise ServeError(400, "logprobs need a causal (left-to-right) model; a diffusion model has no "
                             "per-token log-probabilities of its output.", param="logprobs")
        method, params, config = _method(model, draft, cfg.method, body, default_max, prompts)
        constraint = _constraint(model, method, body)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple] = asyncio.Queue()

        def sink(event: tuple) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the event loop is gone (server stopped): nobody is listening
                pass

        sampled = bool(config.get("temperature", 0)) and body.seed is not None
        scored = echo and (top is not None or prompt_lps is not None)
        asked = None if top is None and prompt_lps is None else max(top or 0, prompt_lps or 0)
        req = EngineRequest(prompts, body.n, method, params, config, sink, stops=body.stops(), logprobs=asked,
                            echo=scored or prompt_lps is not None, timeout_s=cfg.timeout_s,
                            prompt_first=body.stream and prompt_lps is not None,
                            sampled_with_seed=sampled, constraint=constraint)
        request.app.state.scheduler.submit(req)
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        shape = _Shape(kind, prompts, body.n, top, echo, prompt_lps, score_only)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(shape, rid, cfg.served_name, req, queue, include_usage, model),
                                     media_type="text/event-stream")
        return await _collect(request, shape, rid, cfg.served_name, req, queue, model)

    return app


# -- request reading -------------------------------------------------------------------------------

async def _body(request: Request, cls: Any) -> Any:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ServeError(400, f"The body is not valid JSON ({e}): send a JSON object.") from None
    if not isinstance(data, dict):
        raise ServeError(400, f"The body must be a JSON object, not {type(data).__name__}.")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ServeError(400, f"Invalid request: {where}: {first['msg']} ({e.error_count()} error(s) in all).",
                         param=where or None) from None


def _check_max(body: Any, echo: bool) -> bool:
    """max_tokens=0 is lm-eval's way to score a prompt (with echo and logprobs); elsewhere a budget is at least 1.
    A scoring request generates one token that the response leaves out: True when that is the case."""
    if body.max_tokens != 0:
        return False
    if not echo:
        raise ServeError(400, "max_tokens must be at least 1 (0 is taken only with echo=true, to score the "
                         "prompt).", param="max_tokens")
    body.max_tokens = 1
    return True


def _tokenize(model: ModelAdapter, body: TokenizeRequest) -> list[int]:
    """vLLM's /tokenize: the ids a completion (text prompt) or a chat request (messages) would run on."""
    if (body.prompt is None) == (body.messages is None):
        raise ServeError(400, "Send exactly one of prompt (text) and messages (chat).", param="prompt")
    if body.messages is not None:
        return chat_prompt(model, ChatRequest(model="", messages=body.messages))
    tok = model.tokenizer
    if tok is None:
        raise ServeError(400, f"Model {model.name!r} has no tokenizer: send token ids.", param="prompt")
    assert body.prompt is not None
    return list(tok(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"])


def _completion_prompts(model: ModelAdapter, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise ServeError(400, "prompt is empty: pass text, token ids or a list of those.", param="prompt")
    return [_encode(model, p) for p in items]


def _encode(model: ModelAdapter, prompt: Any) -> list[int]:
    """Token ids, checked against the vocabulary; the context is checked later by `_fit_context` (with the
    request's max_tokens and OpenAI's `context_length_exceeded`), so no budget is counted here."""
    try:
        return encode_batch(model, prompt, None).row(0)
    except FastDecodeError as e:
        raise ServeError(400, str(e), param="prompt") from None


def chat_prompt(model: ModelAdapter, body: ChatRequest) -> list[int]:
    """The tokenizer's chat template where it has one; else the zoo's `Q: ...\\nA: ` format, earlier turns first."""
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    tok = model.tokenizer
    if tok is not None and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        return _encode(model, ids)
    if messages[-1]["role"] != "user":
        raise ServeError(400, "The last message must be the user's: the model answers it.", param="messages")
    parts = []
    for m in messages:
        if m["role"] in ("system", "developer"):
            parts.append(m["content"] + "\n")
        elif m["role"] == "user":
            parts.append(format_prompt(m["content"]))
        else:
            parts.append(m["content"] + "\n")
    return _encode(model, "".join(parts))


def _logprobs_asked(kind: str, body: Any) -> int | None:
    if kind == "completion":
        return body.logprobs
    if body.logprobs:
        return body.top_logprobs or 0
    if body.top_logprobs:
        raise ServeError(400, "top_logprobs needs logprobs=true.", param="top_logprobs")
    return None


def _constraint(model: ModelAdapter, method: str, body: Any) -> Any:
    """`response_format` as a constraint, compiled once here so that a bad schema or a method that cannot take one
    is a 400 before the request is queued (the engine compiles it again for its batch: milliseconds)."""
    constraint = body.constraint()
    if constraint is None:
        return None
    try:
        resolve(model, method, constraint)
        compile_constraint(model, constraint)
    except FastDecodeError as e:
        raise ServeError(400, str(e), param=_constraint_field(body)) from None
    return constraint


def _constraint_field(body: Any) -> str:
    names = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar")
    return next((n for n in names if getattr(body, n, None) is not None), "response_format")


def _method(model: ModelAdapter, draft: ModelAdapter | None, default: str, body: Any, default_max: int | None,
            prompts: list[list[int]]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The request's method and its parameters: `fastdecode.method` or the server's default, the method's own
    parameters from the `fastdecode` object, and OpenAI's fields mapped onto them (max_tokens -> max_new_tokens)."""
    extra = dict(body.fastdecode or {})
    method = extra.pop("method", None)
    if method is not None and not isinstance(method, str):
        raise ServeError(400, "fastdecode.method must be a method name such as 'spec.suffix'.", param="fastdecode")
    try:
        spec = resolve(model, method or default)
        fields = {f.name for f in dataclasses.fields(spec.config)}
        if method is None and body.temperature and "temperature" not in fields and model.kind == "causal":
            spec = resolve(model, "ar.sample")  # a temperature without a method: OpenAI's sampling
            fields = {f.name for f in dataclasses.fields(spec.config)}
        check_draft(spec, model, draft)
    except FastDecodeError as e:
        raise ServeError(400, str(e), param="fastdecode.method") from None
    params = dict(extra)
    top_k = 0 if body.top_k == -1 else body.top_k  # vLLM's -1: every token
    for name, value, neutral in (("temperature", body.temperature, 0.0), ("top_p", body.top_p, 1.0),
                                 ("top_k", top_k, 0), ("min_p", body.min_p, 0.0),
                                 ("repetition_penalty", body.repetition_penalty, 1.0), ("seed", body.seed, None)):
        if value is None:
            continue
        if name in params and params[name] != value:
            raise ServeError(400, f"{name} is given twice with different values ({value} and fastdecode.{name}="
                             f"{params[name]}): give it once.", param=name)
        if name in fields:
            params[name] = value
        elif value != neutral and name != "seed":  # a seed means nothing to a greedy method
            raise ServeError(400, f"{name}={value} needs a method that has it, but {spec.name} has no {name}: "
                             "leave it out, or set fastdecode.method to ar.sample or a spec.* method.", param=name)
    longest = max(len(p) for p in prompts)
    if body.max_tokens is not None:
        params["max_new_tokens"] = body.max_tokens
    elif default_max is not None and "max_new_tokens" not in params:
        params["max_new_tokens"] = default_max
    try:
        config = dataclasses.asdict(build_config(spec.config, params, spec.name))
        spec.check_attention(config.get("attention"))
    except (FastDecodeError, TypeError, ValueError) as e:
        raise ServeError(400, str(e), param="fastdecode") from None
    _fit_context(model, body, longest, params, config)
    return spec.name, params, config


def _fit_context(model: ModelAdapter, body: Any, longest: int, params: dict[str, Any], config: dict[str, Any]) -> None:
    """Prompt + max_tokens must fit the model's positions: the default budget shrinks to fit; otherwise a 400 with
    OpenAI's `context_length_exceeded` and a fix the caller can make."""
    limit = model.max_positions
    if limit is None or longest + config["max_new_tokens"] <= limit:
        return
    if longest >= limit:  # no budget fits: only a shorter prompt (or a longer context) does
        param = "messages" if hasattr(body, "messages") else "prompt"
        raise ServeError(400, f"The prompt has {longest} tokens, but the model has {limit} positions and needs room "
                         f"for at least one new token: shorten the prompt to at most {limit - 1} tokens, or serve a "
                         "model with a longer context.", param=param, code="context_length_exceeded")
    if body.max_tokens is None:  # the default budget, not the caller's: fit it
        params["max_new_tokens"] = config["max_new_tokens"] = limit - longest
        return
    raise ServeError(400, f"The prompt has {longest} tokens; with max_tokens={config['max_new_tokens']} that is more "
                     f"than the model's {limit} positions: lower max_tokens to at most {limit - longest}, or shorten "
                     "the prompt.", param="max_tokens", code="context_length_exceeded")


# -- responses -------------------------------------------------------------------------------------

_DISCONNECT_CHECK_S = 0.25  # how often a non-streaming handler asks whether its client is still there


def _event_error(event: tuple) -> ServeError | None:
    return event[1] if event[0] == "error" else None


@dataclasses.dataclass
class _Shape:
    """What a non-streaming response carries besides the text: which logprobs, and the echoed prompts."""

    kind: str
    prompts: list[list[int]]
    n: int
    top: int | None  # logprobs asked for the output (top alternatives), None: none
    echo: bool = False  # completions: the prompt's text (and logprobs) before the output
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs
    score_only: bool = False  # max_tokens=0: the one token generated is left out

    def prompt(self, index: int) -> list[int]:
        return self.prompts[index // self.n]


async def _collect(request: Request, shape: _Shape, rid: str, name: str, req: EngineRequest,
                   queue: asyncio.Queue[tuple], model: ModelAdapter) -> JSONResponse:
    choices: dict[int, dict[str, Any]] = {}
    check_at = time.monotonic() + _DISCONNECT_CHECK_S
    try:
        while True:
            try:
                event: tuple | None = await asyncio.wait_for(queue.get(), timeout=_DISCONNECT_CHECK_S)
            except asyncio.TimeoutError:
                event = None
            if event is None or time.monotonic() >= check_at:  # also while events flow: a client gone mid-run
                check_at = time.monotonic() + _DISCONNECT_CHECK_S
                if await request.is_disconnected():
                    req.cancel()  # its rows leave the batch at the next step
                    return JSONResponse(error_body("client disconnected"), status_code=499)
            if event is None:
                continue
            err = _event_error(event)
            if err is not None:
                return JSONResponse(err.body(), status_code=err.status)
            if event[0] == "finish":
                _, index, reason, _delta, text, tokens, lps = event
                choices[index] = _choice(shape, index, text, reason, tokens, lps, model)
            elif event[0] == "end":
                counts = list(event[1:])
                if shape.score_only:
                    counts[1] = 0  # completion tokens: none is returned
                kind = shape.kind
                body = {"id": rid, "object": "text_completion" if kind == "completion" else "chat.completion",
                        "created": int(time.time()), "model": name,
                        "choices": [choices[i] for i in sorted(choices)], "usage": usage(*counts)}
                return JSONResponse(body)
    finally:
        req.cancel()  # a no-op once the request has ended; drops its rows if the handler was cancelled


def _choice(shape: _Shape, index: int, text: str, reason: str, tokens: list[int], lps: Any,
            model: ModelAdapter) -> dict[str, Any]:
    prompt: list[Any] = []
    if lps is not None and (shape.echo or shape.prompt_logprobs is not None):
        prompt, lps = lps[: len(shape.prompt(index))], lps[len(shape.prompt(index)):]
    if shape.score_only:
        text, reason, lps = "", "length", [] if lps is not None else None
    if shape.kind == "chat":
        return {"index": index, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                "logprobs": {"content": _chat_logprobs(lps, model)} if shape.top is not None else None}
    out: dict[str, Any] = {"index": index, "text": text, "finish_reason": reason, "logprobs": None}
    if shape.echo:
        out["text"] = model.decode(shape.prompt(index)) + text
    if shape.top is not None:
        scored = (prompt if shape.echo else []) + list(lps or [])
        out["logprobs"] = _completion_logprobs(scored, model, shape.top)
    if shape.prompt_logprobs is not None:
        out["prompt_logprobs"] = vllm_prompt_logprobs(prompt, model, shape.prompt_logprobs)
    return out


def _completion_logprobs(lps: list, model: ModelAdapter, k: int) -> dict[str, Any]:
    """OpenAI's legacy shape; an echoed first prompt token has a null logprob and null top_logprobs, as vLLM's."""
    tokens = [token_text(model, t) for t, _, _, _ in lps]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [c for _, c, _, _ in lps],
            "top_logprobs": [{token_text(model, i): v for i, v in top[:k]} if c is not None else None
                             for _, c, top, _ in lps],
            "text_offset": offsets}


def _chat_logprobs(lps: list, model: ModelAdapter) -> list[dict[str, Any]]:
    def entry(token: int, lp: float) -> dict[str, Any]:
        text = token_text(model, token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    return [{**entry(t, c), "top_logprobs": [entry(i, v) for i, v in top]} for t, c, top, _ in lps]


async def _sse(shape: _Shape, rid: str, name: str, req: EngineRequest, queue: asyncio.Queue[tuple],
               include_usage: bool, model: ModelAdapter) -> AsyncIterator[str]:
    """Server-sent events. As vLLM streams them, a choice's first chunk carries the echoed prompt's text before
    its output's, and its `prompt_logprobs` (the engine's "prompt" event comes just before that chunk); with
    max_tokens=0 (score only) the one token generated is left out, as in a response."""
    kind = shape.kind
    created = int(time.time())
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
    started: set[int] = set()
    prompt_lps: dict[int, list] = {}  # the prompt's logprobs of a choice, until its first chunk carries them

    def chunk(index: int, text: str, reason: str | None) -> str:
        if kind == "completion":
            if shape.score_only:
                text = ""
            if shape.echo and index not in started:
                text = model.decode(shape.prompt(index)) + text
            choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
            if index in prompt_lps:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt_lps.pop(index), model,
                                                                 shape.prompt_logprobs or 0)
            started.add(index)
        else:
            delta: dict[str, Any] = {} if index in started and not text else {"content": text}
            if index not in started:
                delta["role"] = "assistant"
                started.add(index)
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        return _data({"id": rid, "object": obj, "created": created, "model": name, "choices": [choice]})

    try:
        while True:
            event = await queue.get()
            err = _event_error(event)
            if err is not None:
                yield _data(err.body())
                break
            if event[0] == "prompt":
                prompt_lps[event[1]] = event[2]
            elif event[0] == "delta" and not shape.score_only:
                yield chunk(event[1], event[2], None)
            elif event[0] == "finish":
                yield chunk(event[1], event[3], "length" if shape.score_only else event[2])
            elif event[0] == "end":
                if include_usage:
                    counts = list(event[1:])
                    if shape.score_only:
                        counts[1] = 0  # completion tokens: none is returned
                    yield _data({"id": rid, "object": obj, "created": created, "model": name, "choices": [],
                                 "usage": usage(*counts)})
                break
        yield "data: [DONE]\n\n"
    finally:
        req.cancel()  # the client went away (or the stream ended): the engine drops its rows


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"
