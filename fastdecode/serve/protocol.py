"""Request and response bodies in the shapes of OpenAI's API (the subset the server takes), as pydantic models.

Fields the server reads are declared; other fields OpenAI defines are accepted and ignored when they are at their
neutral value and refused (400) when they ask for something the server cannot do (`unsupported()`).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


# fields OpenAI defines that the server cannot honour: refused unless they hold their neutral value
_NEUTRAL: dict[str, Any] = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "best_of": 1,
                            "echo": False, "suffix": None, "tools": None, "functions": None,
                            "tool_choice": None}


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    fastdecode: dict[str, Any] | None = None  # {"method": "spec.suffix", ...that method's parameters}
    response_format: dict[str, Any] | None = None  # OpenAI's structured outputs -> a fastdecode constraint

    def constraint(self) -> Any:
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
        if len(stops) > 4:
            raise ServeError(400, "stop takes at most 4 sequences.", param="stop")
        if any(not s for s in stops):
            raise ServeError(400, "stop sequences must not be empty.", param="stop")
        return stops

    def unsupported(self) -> None:
        """Refuse OpenAI fields that ask for something the server does not do."""
        extra = self.model_extra or {}
        for name, neutral in _NEUTRAL.items():
            value = extra.get(name, neutral)
            if value not in (neutral, None) and value != neutral:
                raise ServeError(400, f"{name}={value!r} is not supported by fastdecode serve; leave it out.",
                                 param=name)


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: int | None = Field(default=None, ge=0, le=5)


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
    top_logprobs: int | None = Field(default=None, ge=0, le=5)


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
