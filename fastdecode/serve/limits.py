"""A bound on the request body, checked before the body is read into memory or parsed: a client that sends more
than `--max-body-mb` gets 413 in OpenAI's error shape, whether it declares its length or streams it in chunks."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .protocol import ServeError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_MB = 4.0  # some 4 million characters of prompt: far above every model's context


class BodyLimit:
    """Pure ASGI middleware (no buffering of its own): refuses a declared `Content-Length` over the limit at once,
    and stops a chunked body as soon as the bytes received pass it (a ServeError the app answers)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._error()
            return message

        await self.app(scope, counted, send)

    def _error(self) -> ServeError:
        return ServeError(413, f"The request body is larger than this server's limit of {self.max_bytes / 1e6:g} MB: "
                          "send a shorter prompt, or start the server with a larger --max-body-mb.",
                          code="request_too_large")

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(self._error().body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
