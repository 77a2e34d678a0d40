"""img.zipar on the tiny 8x8 image model: the forwards per image are (h - 1) * window + w exactly, a window as wide
as the grid is raster order (ar.sample's tokens, seeded), and every image is whole (64 codes)."""

from __future__ import annotations

import pytest

import fastdecode
from fastdecode.image.zipar import zipar_forwards

LABELS = ["1", "8"]


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8, 20])
def test_forwards_per_image_follow_the_schedule(tiny_image_model, window):
    results = fastdecode.generate(tiny_image_model, LABELS, "img.zipar", window=window, seed=1)
    want = (8 - 1) * min(window, 8) + 8
    assert zipar_forwards(8, 8, window) == want
    for r in results:
        assert r.stats.forwards == want
        assert len(r.token_ids) == 64 and max(r.token_ids) < 4 and r.image.shape == (8, 8)


def test_the_seven_wide_grid_of_the_research_note():
    assert zipar_forwards(7, 7, 3) == 25 and zipar_forwards(7, 7, 7) == 49


@pytest.mark.parametrize("guided", [False, True])
def test_a_full_row_window_is_ar_sample(tiny_image_model, tiny_image_guided, guided):
    model = tiny_image_guided if guided else tiny_image_model
    want = [r.token_ids for r in fastdecode.generate(model, LABELS, "ar.sample", seed=5)]
    got = [r.token_ids for r in fastdecode.generate(model, LABELS, "img.zipar", window=8, seed=5)]
    assert got == want


def test_a_narrow_window_changes_the_samples_but_stays_seeded(tiny_image_model):
    a = [r.token_ids for r in fastdecode.generate(tiny_image_model, LABELS, "img.zipar", window=2, seed=3)]
    b = [r.token_ids for r in fastdecode.generate(tiny_image_model, LABELS, "img.zipar", window=2, seed=3)]
    assert a == b


def test_repetition_penalty_is_refused(tiny_image_model):
    with pytest.raises(fastdecode.ParameterError, match="repetition_penalty"):
        fastdecode.generate(tiny_image_model, "1", "img.zipar", repetition_penalty=1.2)
