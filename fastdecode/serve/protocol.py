"""Request and response bodies in the shapes of OpenAI's API (the subset the server takes), as pydantic models.

Fields the server reads are declared, OpenAI's and the extras vLLM and llama.cpp clients send (`top_k`, `min_p`,
`repetition_penalty`, `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, `json_schema`, `grammar`).
Fields it cannot honour (`presence_penalty`, `logit_bias`, `ignore_eos`, `best_of`, tools...) are accepted only at
their neutral value and refused (400, naming the field) otherwise; any other field is refused (400, naming it), as
vLLM's `extra="forbid"` does: a field the server does not know is never ignored silently (`unsupported()`).
"""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ServeError(Exception):
    """A request the server refuses: HTTP status, OpenAI error type, message (and the offending parameter)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's chat bound)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


# fields the server cannot honour: refused unless they hold their neutral value (None always counts as neutral;
# a tuple lists several neutral values)
_NEUTRAL: dict[str, Any] = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "best_of": 1,
                            "suffix": "", "tools": [], "functions": [], "tool_choice": ("none", "auto"),
                            "function_call": ("none", "auto"), "ignore_eos": False,
                            "n_probs": 0, "store": False, "modalities": ["text"], "echo": False, "prediction": {},
                            "audio": {}, "web_search_options": {},
                            "reasoning_effort": "", "skip_special_tokens": True, "spaces_between_special_tokens": True,
                            "add_special_tokens": True, "min_tokens": 0, "stop_token_ids": [],
                            "include_stop_str_in_output": False}
# bookkeeping fields (and one that means nothing without tools), taken at any value and not used
_HARMLESS = ("user", "metadata", "service_tier", "parallel_tool_calls")
MAX_STOPS = 16  # lm-eval sends 5; vLLM sets no bound; each stop is searched after every delivered token
# the constraint fields vLLM and llama.cpp take besides OpenAI's response_format: at most one per request
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "json_schema", "grammar")
_INTS = ("max_tokens", "max_completion_tokens", "n", "seed", "top_k", "top_logprobs", "prompt_logprobs")
_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty")


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # extras are refused by `unsupported()`, naming them

    model: str
    max_tokens: int | None = Field(default=None, ge=0)  # 0 only with echo (lm-eval's scoring): see app._check_max
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's: -1 (or 0) keeps every token
    min_p: float | None = Field(default=None, ge=0, lt=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    fastdecode: dict[str, Any] | None = None  # {"method": "spec.suffix", ...that method's parameters}
    response_format: dict[str, Any] | None = None  # OpenAI's structured outputs -> a fastdecode constraint
    guided_json: Union[dict[str, Any], str, None] = None  # vLLM's: a JSON schema (object or its text)
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None  # Lark or GBNF
    json_schema: dict[str, Any] | None = None  # llama.cpp's
    grammar: str | None = None  # llama.cpp's GBNF

    @field_validator(*_INTS, *_FLOATS, mode="before", check_fields=False)
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        """JSON's true is not 1 here, as in OpenAI's API (pydantic would read it as 1)."""
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean")
        return value

    def constraint(self) -> Any:
        """The `fastdecode.constraints.Constraint` that `response_format` or one of vLLM's / llama.cpp's guided
        fields asks for, or None for free text; more than one of them is refused (which would win is a guess)."""
        guided = [name for name in _GUIDED if getattr(self, name) is not None]
        fmt = self.response_format
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            guided.insert(0, "response_format")
        if len(guided) > 1:
            raise ServeError(400, f"Ask for one constraint at a time: {', '.join(guided)} were all given.",
                             param=guided[1])
        if not guided or guided[0] == "response_format":
            return self._response_format()
        return self._guided(guided[0])

    def _guided(self, name: str) -> Any:
        import re

        from ..constraints import ConstraintError, grammar, json_schema, regex

        value = getattr(self, name)
        try:
            if name in ("guided_json", "json_schema"):
                if isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except ValueError as e:
                        raise ServeError(400, f"{name} is not valid JSON ({e}).", param=name) from None
                if not isinstance(value, dict):
                    raise ServeError(400, f"{name} must be a JSON schema (an object).", param=name)
                return json_schema(value)
            if name == "guided_choice":
                if not value or not all(isinstance(c, str) and c for c in value):
                    raise ServeError(400, "guided_choice must be a list of non-empty strings.", param=name)
                return regex("|".join(re.escape(c) for c in value))
            if name == "guided_regex":
                return regex(value)
            return grammar(value)
        except ConstraintError as e:
            raise ServeError(400, str(e), param=name) from None

    def _response_format(self) -> Any:
        """The `fastdecode.constraints.Constraint` that `response_format` asks for, or None for free text.

        OpenAI's shapes: `{"type": "text"}`, `{"type": "json_object"}` (any JSON object) and
        `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`; and two of fastdecode's own:
        `{"type": "regex", "regex": "..."}` and `{"type": "grammar", "grammar": "..."}` (Lark or GBNF)."""
        fmt = self.response_format
        if fmt is None:
            return None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        from ..constraints import ConstraintError, grammar, json_schema, regex

        try:
            if kind == "text":
                return None
            if kind == "json_object":
                return json_schema({"type": "object"})
            if kind == "json_schema":
                spec = fmt.get("json_schema")
                if not isinstance(spec, dict) or "schema" not in spec:
                    raise ServeError(400, 'response_format json_schema needs {"json_schema": {"name": ..., '
                                     '"schema": {...}}}.', param="response_format")
                return json_schema(spec["schema"])
            if kind == "regex" and isinstance(fmt.get("regex"), str):
                return regex(fmt["regex"])
            if kind == "grammar" and isinstance(fmt.get("grammar"), str):
                return grammar(fmt["grammar"])
        except ConstraintError as e:
            raise ServeError(400, str(e), param="response_format") from None
        raise ServeError(400, "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"}, "
                         "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}, or fastdecode's "
                         "{\"type\": \"regex\", \"regex\": ...} / {\"type\": \"grammar\", \"grammar\": ...}.",
                         param="response_format")

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise ServeError(400, f"stop takes at most {MAX_STOPS} sequences; {len(stops)} were given.", param="stop")
        if any(not s for s in stops):
            raise ServeError(400, "stop sequences must not be empty.", param="stop")
        return stops

    def unsupported(self) -> None:
        """Refuse fields that ask for something the server does not do, and fields it does not know."""
        extra = self.model_extra or {}
        for name, value in extra.items():
            if name in _HARMLESS:
                continue
            if name not in _NEUTRAL:
                raise ServeError(400, f"Unknown field {name!r}: fastdecode serve does not take it (a method's own "
                                 "parameters go in the \"fastdecode\" object; see docs/serve.md).", param=name)
            neutral = _NEUTRAL[name] if isinstance(_NEUTRAL[name], tuple) else (_NEUTRAL[name],)
            if value is not None and value not in neutral:
                raise ServeError(400, f"{name}={value!r} is not supported by fastdecode serve; leave it out "
                                 f"(or send {neutral[0]!r}).", param=name)


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt's text (and with logprobs its tokens' log-probabilities) before the output
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # vLLM's, in vLLM's shape

    @field_validator("logprobs", mode="before")
    @classmethod
    def _no_bool_logprobs(cls, value: Any) -> Any:  # chat's logprobs is a bool; completions' a count
        if isinstance(value, bool):
            raise ValueError("must be a number (how many alternatives), not a boolean")
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[dict[str, Any]], None] = None

    def text(self) -> str:
        if isinstance(self.content, str) or self.content is None:
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ServeError(400, "Only text content parts ({'type': 'text', 'text': ...}) are supported.",
                                 param="messages")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


class TokenizeRequest(BaseModel):
    """vLLM's `/tokenize`: a text prompt, or chat messages formatted as /v1/chat/completions would."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # the BOS token where the tokenizer adds one (text prompts)
    add_generation_prompt: bool = True  # accepted for vLLM's shape; the chat prompt always ends with it
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[int]


def usage(prompt_tokens: int, completion_tokens: int, accepted: int, rejected: int) -> dict[str, Any]:
    """OpenAI's usage object; accepted/rejected prediction tokens count the speculative drafts' tokens."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"accepted_prediction_tokens": accepted,
                                      "rejected_prediction_tokens": rejected,
                                      "reasoning_tokens": 0},
    }
