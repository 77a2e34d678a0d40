"""The attention backend of CUDA forwards is chosen on purpose (attention.sdpa_backends), with one switch."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from fastdecode import attention
from fastdecode.errors import ParameterError


@pytest.fixture(autouse=True)
def _restore():
    yield
    attention.use_sdpa_backends(attention.DEFAULT_SDPA)


def test_cuda_forwards_use_flash_then_efficient_then_math_and_never_cudnn():
    chosen = attention.sdpa_backends(torch.device("cuda", 0))
    assert chosen == [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    assert SDPBackend.CUDNN_ATTENTION not in chosen


def test_cpu_forwards_leave_the_choice_to_torch():
    assert attention.sdpa_backends(torch.device("cpu")) is None


def test_the_switch_sets_or_clears_the_choice():
    attention.use_sdpa_backends("efficient,math")
    assert attention.sdpa_backends(torch.device("cuda")) == [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    attention.use_sdpa_backends("torch")
    assert attention.sdpa_backends(torch.device("cuda")) is None
    with pytest.raises(ParameterError, match="flash"):
        attention.use_sdpa_backends("flsh")


def test_the_chosen_call_equals_torchs_own():
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    mask = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5)
    assert torch.equal(attention.sdpa(q, k, v, mask, 0.5), expected)
