"""A seeded sampled request repeats with the drafters that learn across requests (issue #29): spec.suffix and
spec.recycling draft from a memory of earlier requests, and at a temperature the drafts decide which random numbers
the accept rule draws, so a seeded request must not read that memory. Greedy requests keep using it (their tokens
never depend on the drafts)."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.speculative.memory import DrafterMemory, forget, learns_across_requests, memory_of

PROMPT = "def fib(n):\n"  # zoo:ar-small drew another text here each time before the fix


@pytest.fixture(scope="module")
def small():
    return fastdecode.load("zoo:ar-small", device="cpu")


@pytest.mark.parametrize("method", ["spec.suffix", "spec.recycling", "spec.suffix:tree"])
def test_the_same_seed_twice_gives_the_same_text_with_the_models_shared_memory(small, method):
    method, _, tree = method.partition(":")
    extra = {"tree": True} if tree else {}
    forget(small)
    fastdecode.generate(small, "Q: Sort this list: [Q, R, S, T]\nA: ", method, max_new_tokens=24, **extra)
    runs = [fastdecode.generate(small, PROMPT, method, max_new_tokens=48, temperature=0.8, seed=1, **extra)
            for _ in range(3)]  # each run's output goes into the memory the next one would draft from
    assert runs[0].token_ids == runs[1].token_ids == runs[2].token_ids
    alone = fastdecode.generate(small, PROMPT, method, max_new_tokens=48, temperature=0.8, seed=1,
                                memory=DrafterMemory(), **extra)
    assert alone.token_ids == runs[0].token_ids  # what ran before on the model does not matter
    forget(small)


def test_a_seeded_request_leaves_the_memory_alone_and_greedy_ones_keep_learning(small):
    memory = DrafterMemory()
    fastdecode.generate(small, PROMPT, "spec.suffix", max_new_tokens=8, temperature=1.0, seed=1, memory=memory)
    assert len(memory) == 0
    fastdecode.generate(small, PROMPT, "spec.suffix", max_new_tokens=8, memory=memory)
    assert len(memory) == 1
    assert memory_of(small) is not memory


def test_which_runs_learn_across_requests():
    from fastdecode.speculative.drafters.suffix import SuffixConfig

    assert learns_across_requests(SuffixConfig())  # greedy
    assert learns_across_requests(SuffixConfig(temperature=0.8))  # unseeded sampling: torch's global RNG anyway
    assert learns_across_requests(SuffixConfig(seed=3))  # a seed means nothing at temperature 0
    assert not learns_across_requests(SuffixConfig(temperature=0.8, seed=3))
    assert not learns_across_requests(SuffixConfig(temperature=0.8), generator=torch.Generator().manual_seed(3))
