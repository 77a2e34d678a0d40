"""`fastdecode generate --out PNG` on an image model, and the PNG writer it uses."""

from __future__ import annotations

import numpy as np
import pytest

import fastdecode
from fastdecode.image.png import png_bytes, read_png, write_png


def test_png_round_trip(tmp_path) -> None:
    image = np.random.default_rng(0).integers(0, 256, (5, 7), dtype=np.uint8)
    back = read_png(write_png(tmp_path / "x.png", image, scale=3))
    assert back.shape == (15, 21) and np.array_equal(back[::3, ::3], image)
    with pytest.raises(ValueError, match="uint8"):
        png_bytes(image.astype(np.float32))


def test_generate_writes_the_picture_as_png(tiny_image_dir, tiny_image_model, tmp_path, cli_main,
                                            capsys) -> None:
    out = tmp_path / "seven.png"
    code = cli_main("generate", "--model", str(tiny_image_dir), "--prompt", "7", "--cfg-scale", "2",
               "--out", str(out))
    assert code == 0, capsys.readouterr().err
    expected = fastdecode.generate(tiny_image_model, "7", cfg_scale=2).image
    assert np.array_equal(read_png(out)[::4, ::4], expected)


def test_out_on_a_text_model_says_how_to_fix(causal_dir, tmp_path, cli_main, capsys) -> None:
    code = cli_main("generate", "--model", str(causal_dir), "--prompt", "hi", "--out", str(tmp_path / "x.png"))
    assert code != 0 and "text model" in capsys.readouterr().err
