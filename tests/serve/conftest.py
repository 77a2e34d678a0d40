"""A live server on 127.0.0.1 (a free port), in a thread of the test process, serving zoo:ar-tiny."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from serve_live import NAME, Live  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.serve import ServeConfig  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    return fastdecode.load("zoo:ar-tiny")


@pytest.fixture(scope="module")
def live(tiny):
    server = Live(tiny, ServeConfig(served_name=NAME))
    yield server
    server.stop()


@pytest.fixture()
def client(live):
    import openai

    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
