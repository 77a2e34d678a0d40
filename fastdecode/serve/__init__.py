"""`fastdecode serve`: an OpenAI-compatible HTTP server over every method (needs the `serve` extra:
`pip install fastdecode[serve]`)."""

from __future__ import annotations

from typing import Any

from .app import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app", "make_server"]


def make_server(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> Any:
    """A uvicorn server whose shutdown (Ctrl-C, SIGTERM) first makes the engine refuse new requests (503), then waits
    for the open connections, so requests in flight finish."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            scheduler = getattr(app.state, "scheduler", None)
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            await super().shutdown(sockets)

    return _Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on"))
