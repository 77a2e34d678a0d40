"""Helpers of the serve tests: a live server on 127.0.0.1 (a free port) in a thread, serving a loaded model."""

from __future__ import annotations

import socket
import threading
import time

from fastdecode.bench.suites import get_suite
from fastdecode.bench.tasks import format_prompt
from fastdecode.serve import ServeConfig, create_app, make_server

NAME = "ar-tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Live:
    """A server running in a thread: its URL, app (scheduler, metrics, config) and a way to stop it."""

    def __init__(self, model, config: ServeConfig) -> None:
        self.app = create_app(model, None, config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(self.app, port=self.port)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            assert self.thread.is_alive(), "the server thread died while starting"
            time.sleep(0.02)

    @property
    def scheduler(self):
        return self.app.state.scheduler

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def questions(n: int) -> list[str]:
    """Task prompts (without the Q:/A: wrapper) from the quick suite's test items."""
    out: list[str] = []
    for task, seed, _ in get_suite("quick").plan(None, 4):
        out += [item.prompt for item in task.items(seed, 4)]
    return [out[i % len(out)] for i in range(n)]


def prompts(n: int) -> list[str]:
    return [format_prompt(q) for q in questions(n)]
