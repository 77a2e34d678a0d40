"""Dystruct's structural inference (diffusion/structure.py) on hand-built inputs."""

from __future__ import annotations

import math

import torch

from fastdecode.diffusion import structure as st


def test_end_posterior_is_the_first_eos_distribution():
    p = torch.tensor([[0.0, 0.5, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    inview = torch.tensor([[True, True, True, True], [True, True, True, False]])
    post = st.end_posterior(p, inview)
    assert torch.allclose(post[0], torch.tensor([0.0, 0.5, 0.25, 0.25], dtype=torch.float64))
    assert post[1].sum() == 0  # no EOS anywhere: the answer runs past the window
    width = torch.tensor([4, 3])
    assert st.fits(post, width, margin=0).tolist() == [1.0, 0.0]
    assert math.isclose(float(st.fits(post, width, margin=1)[0]), 0.75)  # the EOS at the last column is too late


def test_expansion_grows_by_a_step_half_a_step_or_not_at_all():
    p_fit = torch.tensor([0.9, 0.3, 0.05])
    assert st.expansion(p_fit, 16, gamma=0.5).tolist() == [0, 16, 16]
    assert st.expansion(p_fit, 16, gamma=0.8).tolist() == [0, 8, 16]


def test_partition_splits_at_entropy_jumps_delimiters_and_the_longest_block():
    h = torch.tensor([[0.0, 0.1, 0.0, 3.0, 3.1, 0.0, 0.0, 0.0]], dtype=torch.float64)
    none = torch.zeros_like(h)
    inview = torch.ones_like(h, dtype=torch.bool)
    assert st.partition(h, none, inview, 0.5, 0.5, 16).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    delim = none.clone()
    delim[0, 1] = 1.0  # column 1 is a delimiter: a block starts after it
    assert st.partition(h, delim, inview, 0.5, 0.5, 16).tolist() == [[0, 0, 1, 2, 2, 3, 3, 3]]
    flat = torch.zeros(1, 8, dtype=torch.float64)
    assert st.partition(flat, none, inview, 0.5, 0.5, 3).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2]]
    inview[0, 6:] = False
    assert st.partition(flat, none, inview, 0.5, 0.5, 16).tolist() == [[0, 0, 0, 0, 0, 0, -1, -1]]


def test_schedule_prefers_stable_anchored_blocks():
    ids = torch.tensor([[0, 0, 1, 1, 2, 2]])
    inview = torch.ones(1, 6, dtype=torch.bool)
    masked = inview.clone()
    h = torch.tensor([[0.4, 0.4, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    # the answer's end unknown: the prompt-anchored block beats stabler ones that touch nothing decoded
    first = st.schedule(ids, h, masked, inview, torch.tensor([False]), beta=1.0, lam=1.0)
    assert first.tolist() == [[True, True, False, False, False, False]]
    # its end known: the tail block is anchored too and stabler
    tail = st.schedule(ids, h, masked, inview, torch.tensor([True]), beta=1.0, lam=1.0)
    assert tail.tolist() == [[False, False, False, False, True, True]]
    # a hole between decoded text is anchored on both sides: filled first
    masked[0, 0:2] = False
    masked[0, 4:] = False
    hole = st.schedule(ids, h.clone().fill_(0.3), masked, inview, torch.tensor([False]), beta=1.0, lam=1.0)
    assert hole.tolist() == [[False, False, True, True, False, False]]


def test_eos_mass_and_entropy():
    logits = torch.tensor([[[0.0, 0.0, -math.inf, -math.inf], [10.0, -10.0, -10.0, -10.0]]])
    assert torch.allclose(st.eos_mass(logits, torch.tensor([1, 2])), torch.tensor([[0.5, 0.0]], dtype=torch.float64),
                          atol=1e-8)
    h = st.entropy(logits)
    assert math.isclose(float(h[0, 0]), math.log(2)) and float(h[0, 1]) < 1e-6
