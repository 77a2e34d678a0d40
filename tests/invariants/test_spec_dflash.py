"""spec.dflash on the tiny fp32 model: greedy output equals ar.greedy token for token with a random head (any block
length, a batch, a head given as a folder), EOS and length cuts inside a block, seeded sampling repeats.
(The registry's lossless and architecture tests run it with its defaults too.)"""

from __future__ import annotations

import pytest

import fastdecode
from fastdecode.errors import ParameterError
from fastdecode.heads import save_head
from fastdecode.heads.dflash import build_for

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]


@pytest.mark.parametrize("params", [{}, {"num_draft_tokens": 1}, {"num_draft_tokens": 3}])
def test_greedy_equals_ar_greedy(causal, params):
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)
    out = fastdecode.generate(causal, PROMPTS, "spec.dflash", max_new_tokens=40, **params)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    for r in out:
        # the first step only verifies the prompt (no features yet), the last has no room to draft
        assert r.stats.proposed > 0 and 1 <= r.stats.draft_forwards <= r.stats.forwards - 1
        width = params.get("num_draft_tokens", 7)
        assert len(r.stats.accepted_per_position) <= width


def test_a_head_folder_with_another_block_size(causal, tmp_path):
    """A head of block size 4 drafts 3 tokens per forward; one row at a time and in a batch, always ar.greedy's."""
    folder = save_head(build_for(causal, seed=3, block_size=4, target_layers=(1,)), tmp_path / "b4", "float32")
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=30)
    out = fastdecode.generate(causal, PROMPTS, "spec.dflash", max_new_tokens=30, head=str(folder))
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    assert max(r.stats.proposed / max(1, r.stats.draft_forwards) for r in out) <= 3
    one = fastdecode.generate(causal, PROMPTS[1], "spec.dflash", max_new_tokens=30, head=str(folder))
    assert one.token_ids == base[1].token_ids


@pytest.mark.parametrize("n", [1, 2, 9])
def test_length_cuts_inside_a_block(causal, n):
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=n)
    out = fastdecode.generate(causal, PROMPTS, "spec.dflash", max_new_tokens=n)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]


def test_seeded_sampling_repeats(causal):
    a = fastdecode.generate(causal, PROMPTS, "spec.dflash", max_new_tokens=20, temperature=1.0, seed=5)
    b = fastdecode.generate(causal, PROMPTS, "spec.dflash", max_new_tokens=20, temperature=1.0, seed=5)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


def test_bad_parameters_are_refused(causal, tmp_path):
    with pytest.raises(ParameterError, match="num_draft_tokens"):
        fastdecode.generate(causal, "the", "spec.dflash", num_draft_tokens=-1)
    with pytest.raises(fastdecode.errors.ModelLoadError, match="does not exist"):
        fastdecode.generate(causal, "the", "spec.dflash", head=str(tmp_path / "nowhere"))
