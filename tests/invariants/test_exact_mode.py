"""Exact mode (models/exact.py): in bfloat16 every lossless method equals ar.greedy token for token, because every
cached forward runs one shape; and the mode changes no float32 output."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.errors import ParameterError
from fastdecode.models.exact import Exact, chunk_past, exact_mode, pad_block

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
LOSSLESS = [("spec.pld", {}), ("spec.ngram", {}), ("spec.suffix", {}), ("spec.suffix", {"tree": True}),
            ("spec.draft_model", {"num_draft_tokens": 5}), ("spec.lookahead", {}), ("spec.recycling", {}),
            ("spec.jacobi", {})]


@pytest.fixture(scope="module")
def bf16(causal_dir, load_model):
    # width 8: the verification blocks of these methods are longer, so chunking with tree masks runs too
    return load_model(causal_dir, dtype="bfloat16", exact=8)


@pytest.mark.parametrize(("method", "params"), LOSSLESS)
def test_lossless_methods_equal_ar_greedy_in_bfloat16(bf16, method, params):
    base = [r.token_ids for r in fastdecode.generate(bf16, PROMPTS, "ar.greedy", max_new_tokens=40)]
    kw = {"draft": bf16} if method == "spec.draft_model" else {}
    out = fastdecode.generate(bf16, PROMPTS, method, max_new_tokens=40, **params, **kw)
    assert [r.token_ids for r in out] == base
    for prompt, ids in zip(PROMPTS, base, strict=True):  # one row alone: the same tokens as in the batch
        assert fastdecode.generate(bf16, prompt, method, max_new_tokens=40, **params, **kw).token_ids == ids


def test_exact_mode_leaves_float32_outputs_alone(causal, causal_dir, load_model):
    exact = load_model(causal_dir, exact=4)
    for method in ("ar.greedy", "spec.pld", "spec.suffix"):
        a = [r.token_ids for r in fastdecode.generate(causal, PROMPTS, method, max_new_tokens=24)]
        assert [r.token_ids for r in fastdecode.generate(exact, PROMPTS, method, max_new_tokens=24)] == a


def test_default_is_on_for_cuda_low_precision_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert exact_mode(None, cuda, torch.bfloat16) == Exact()
    assert exact_mode(None, cuda, torch.float16) == Exact()
    assert exact_mode(None, cuda, torch.float32) is None
    assert exact_mode(None, cpu, torch.bfloat16) is None
    assert exact_mode(False, cuda, torch.bfloat16) is None
    assert exact_mode(16, cpu, torch.float32) == Exact(width=16)
    with pytest.raises(ParameterError, match="width"):
        exact_mode(0, cpu, torch.float32)


def test_capacity_is_a_whole_number_of_blocks_with_room_for_a_padded_block():
    e = Exact(width=32, block=512)
    assert [e.capacity(n) for n in (0, 479, 480, 481, 1000)] == [512, 512, 512, 1024, 1536]


def test_padding_is_unseen_and_chunks_see_earlier_chunks_as_the_block_said():
    e = Exact(width=4, block=16)
    ids, pos = torch.tensor([[5, 6]]), torch.tensor([[7, 8]])
    real, vis = torch.ones(1, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool).tril()[None]
    i, p, r, v, past = pad_block(e, ids, pos, real, vis, None, pad_id=0)
    assert i.tolist() == [[5, 6, 0, 0]] and p.tolist() == [[7, 8, 8, 8]] and r.tolist() == [[True, True, False, False]]
    assert not v[0, :, 2:].any() and not v[0, 2:].any() and past is None
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)[None]
    seen = chunk_past([3], 2, 4, tree, None)  # tokens 2, 3 after tokens 0, 1 stored at columns 3, 4
    assert seen is not None and seen.tolist() == [[[True] * 3 + [True, False], [True] * 3 + [False, False]]]
    assert chunk_past([3], 2, 4, torch.ones(4, 4, dtype=torch.bool).tril()[None], None) is None
