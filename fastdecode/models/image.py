"""What makes a causal LM an image model: its token layout, its image tokenizer (codec) and how codes become pixels.

A class-conditional image model writes an image as `h*w` codebook tokens in raster order after one class token:

    ids 0 .. K-1          codebook codes (the only ids ever generated)
    ids K .. K+C-1        class labels ("0" .. "9" for digits)
    id  K+C               the null class (the unconditional row of classifier-free guidance)

The codec turns codes into pixels and back. Two codecs exist: `PixelCodec` (quantised grey levels, nothing trained,
d = 1: the test tokenizer) and the VQ tokenizer (`models/vq.py`: a small conv encoder/decoder over an L2-normalised
codebook). Both expose the codebook as float32 vectors `[K, d]`, which methods that work in code space (DD1, DD2,
LANTERN, GSD) read. A model folder declares all this in `image.json` (`read_image_spec`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import ModelLoadError, PromptError

IMAGE_CONFIG = "image.json"


class Codec(Protocol):
    """An image tokenizer: images `[B, H, W]` uint8 <-> codes `[B, h*w]`, and code vectors -> pixels."""

    grid: tuple[int, int]  # (h, w) codes
    size: tuple[int, int]  # (H, W) pixels

    @property
    def codebook(self) -> torch.Tensor:  # [K, d] float32
        ...

    def encode(self, images: np.ndarray) -> torch.Tensor: ...  # [B, H, W] uint8 -> [B, h*w] long

    def decode_vectors(self, vectors: torch.Tensor) -> torch.Tensor: ...  # [B, h*w, d] -> [B, H, W] float in [0, 1]


class PixelCodec:
    """Quantised pixels: each pixel is one code, its grey level out of `levels` (no training; d = 1).

    The codebook is the levels themselves, 0 .. 1, so methods that read code vectors see a 1-D geometry.
    """

    def __init__(self, levels: int, size: tuple[int, int]) -> None:
        if levels < 2:
            raise ValueError(f"a pixel codec needs at least 2 grey levels, not {levels}")
        self.levels = levels
        self.size = (int(size[0]), int(size[1]))
        self.grid = self.size

    @property
    def codebook(self) -> torch.Tensor:
        return torch.linspace(0.0, 1.0, self.levels)[:, None]  # [K, 1]

    def encode(self, images: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(images), dtype=torch.float32) / 255.0  # [B, H, W]
        codes = torch.round(x * (self.levels - 1)).long()
        return codes.reshape(codes.shape[0], -1)  # [B, H*W]

    def decode_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        B = vectors.shape[0]
        return vectors.float().reshape(B, *self.size).clamp(0.0, 1.0)  # [B, H, W]

    def config(self) -> dict[str, Any]:
        return {"tokenizer": "pixels", "levels": self.levels, "image_size": list(self.size)}


@dataclass
class ImageSpec:
    """The image side of a class-conditional image model: layout, labels, codec and default guidance.

    `labels[i]` is the text of class i (prompt "7" -> token K + labels.index("7")); `cfg_scale` is the guidance a
    generation uses when none is asked (1 = none), from the folder's image.json.
    """

    codec: Codec
    labels: tuple[str, ...]
    cfg_scale: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.codebook = self.codec.codebook.float()  # [K, d]

    @property
    def grid(self) -> tuple[int, int]:
        return self.codec.grid

    @property
    def h(self) -> int:
        return self.grid[0]

    @property
    def w(self) -> int:
        return self.grid[1]

    @property
    def tokens(self) -> int:
        """Tokens one image takes: h*w."""
        return self.h * self.w

    @property
    def size(self) -> tuple[int, int]:
        return self.codec.size

    @property
    def K(self) -> int:
        return int(self.codebook.shape[0])

    @property
    def C(self) -> int:
        return len(self.labels)

    @property
    def d(self) -> int:
        return int(self.codebook.shape[1])

    @property
    def null_token(self) -> int:
        return self.K + self.C

    @property
    def vocab_size(self) -> int:
        return self.K + self.C + 1

    def class_token(self, index: int) -> int:
        if not 0 <= index < self.C:
            raise PromptError(f"class index {index} is out of range: this model has classes 0 to {self.C - 1}.")
        return self.K + index

    def label_token(self, text: str) -> int:
        """The token of a class label ("7"), or the null class for "null" (unconditional generation)."""
        label = text.strip()
        if label in self.labels:
            return self.K + self.labels.index(label)
        if label.lower() in ("null", "none", "uncond"):
            return self.null_token
        raise PromptError(f"{text!r} is not a class of this image model: the prompt is one label, one of "
                          f"{', '.join(self.labels)} (or 'null' for an unconditional image).")

    def label_of(self, token: int) -> str:
        if token == self.null_token:
            return "null"
        if self.K <= token < self.null_token:
            return self.labels[token - self.K]
        raise ValueError(f"token {token} is not a class token (classes are {self.K} to {self.null_token})")

    def check_codes(self, codes: torch.Tensor) -> torch.Tensor:
        codes = torch.as_tensor(codes).long()
        if codes.dim() == 1:
            codes = codes[None]
        if codes.shape[-1] != self.tokens:
            raise ValueError(f"an image is {self.tokens} codes ({self.h}x{self.w}), not {codes.shape[-1]}")
        if bool(((codes < 0) | (codes >= self.K)).any()):
            raise ValueError(f"codes must lie in 0 .. {self.K - 1} (class and null tokens are not pixels)")
        return codes  # [B, h*w]

    def vectors(self, codes: torch.Tensor) -> torch.Tensor:
        """Codebook vectors `[B, h*w, d]` of codes `[B, h*w]`."""
        codes = self.check_codes(codes)
        return self.codebook[codes.cpu()]

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """Codes `[B, h*w]` (or one image `[h*w]`) -> uint8 pixels `[B, H, W]`."""
        return self.decode_vectors(self.vectors(codes))

    def decode_vectors(self, vectors: torch.Tensor) -> np.ndarray:
        """Continuous code vectors `[B, h*w, d]` (DD's regressed tokens) -> uint8 pixels `[B, H, W]`."""
        with torch.inference_mode():
            x = self.codec.decode_vectors(vectors.float().cpu())  # [B, H, W] in [0, 1]
        return (x.clamp(0, 1) * 255.0).round().to(torch.uint8).numpy()

    def encode(self, images: np.ndarray) -> torch.Tensor:
        """uint8 images `[B, H, W]` -> codes `[B, h*w]`."""
        images = np.asarray(images)
        if images.ndim == 2:
            images = images[None]
        if tuple(images.shape[1:]) != self.size:
            raise ValueError(f"images must be {self.size[0]}x{self.size[1]}, not {images.shape[1]}x{images.shape[2]}")
        with torch.inference_mode():
            return self.codec.encode(images)

    def config(self) -> dict[str, Any]:
        """What image.json holds for this spec (the codec's own settings included)."""
        base: dict[str, Any] = getattr(self.codec, "config", dict)()
        return {**base, "grid": list(self.grid), "codes": self.K, "labels": list(self.labels),
                "cfg_scale": self.cfg_scale, **self.extra}


def write_image_spec(spec: ImageSpec, folder: Path) -> None:
    (Path(folder) / IMAGE_CONFIG).write_text(json.dumps(spec.config(), indent=2) + "\n")


def read_image_spec(folder: Path) -> ImageSpec | None:
    """The ImageSpec a model folder declares in image.json (None: a text model). The VQ codec loads from `vq/`."""
    path = Path(folder) / IMAGE_CONFIG
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
        kind = cfg["tokenizer"]
        labels = tuple(str(x) for x in cfg["labels"])
    except (ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{path} is invalid ({e!r}): it needs 'tokenizer' (pixels or vq) and 'labels'; "
                             "restore it from the original model folder.") from None
    codec: Codec
    if kind == "pixels":
        codec = PixelCodec(int(cfg["levels"]), tuple(cfg["image_size"]))
    elif kind == "vq":
        from .vq import load_vq  # the conv tokenizer: only image models with one need it

        codec = load_vq(Path(folder) / cfg.get("vq", "vq"))
    else:
        raise ModelLoadError(f"{path}: unknown tokenizer {kind!r}; use 'pixels' or 'vq'.")
    known = {"tokenizer", "levels", "image_size", "grid", "codes", "labels", "cfg_scale", "vq"}
    spec = ImageSpec(codec, labels, float(cfg.get("cfg_scale", 1.0)), {k: v for k, v in cfg.items() if k not in known})
    if "codes" in cfg and int(cfg["codes"]) != spec.K:
        raise ModelLoadError(f"{path} says {cfg['codes']} codes but the tokenizer has {spec.K}; the folder is mixed "
                             "up: restore image.json or the vq/ folder.")
    return spec
