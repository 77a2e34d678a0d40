"""A seeded request repeats through the server with a drafter that learns across requests (issue #29): the server's
spec.suffix requests share the model's memory, which a seeded sampled request neither reads nor extends."""

from __future__ import annotations

from serve_live import NAME

import fastdecode
from fastdecode.speculative.memory import DrafterMemory

PROMPT = "def fib(n):\n"  # zoo:ar-tiny drew another text here on each call before the fix


def test_a_seeded_spec_suffix_request_repeats_and_equals_a_run_without_memory(client, tiny):
    method = {"fastdecode": {"method": "spec.suffix"}}
    client.completions.create(model=NAME, prompt="import os\n", max_tokens=16, extra_body=method)  # fills the memory
    texts = [client.completions.create(model=NAME, prompt=PROMPT, max_tokens=32, temperature=1.0, seed=7,
                                       extra_body=method).choices[0].text for _ in range(3)]
    alone = fastdecode.generate(tiny, PROMPT, "spec.suffix", max_new_tokens=32, temperature=1.0, seed=7,
                                memory=DrafterMemory())
    assert texts == [alone.text] * 3
