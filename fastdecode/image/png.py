"""A minimal PNG writer (8-bit greyscale, zlib from the standard library): no imaging package needed to save a digit."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(image: np.ndarray, scale: int = 1) -> bytes:
    """uint8 greyscale `[H, W]` as PNG bytes, each pixel repeated `scale` x `scale` times (small digits stay
    visible)."""
    image = np.asarray(image)
    if image.ndim != 2 or image.dtype != np.uint8:
        raise ValueError(f"a greyscale PNG needs a uint8 [H, W] array, not {image.dtype} {list(image.shape)}")
    if scale < 1:
        raise ValueError(f"scale must be at least 1, not {scale}")
    big = np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)
    H, W = big.shape
    raw = b"".join(b"\x00" + big[y].tobytes() for y in range(H))  # filter type 0 per row
    header = struct.pack(">IIBBBBB", W, H, 8, 0, 0, 0, 0)  # 8-bit, greyscale, deflate, no filter, no interlace
    body = _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def write_png(path: str | Path, image: np.ndarray, scale: int = 1) -> Path:
    path = Path(path)
    path.write_bytes(png_bytes(image, scale))
    return path


def read_png(path: str | Path) -> np.ndarray:
    """The uint8 `[H, W]` pixels of a PNG this module wrote (8-bit greyscale, filter 0): for tests and round trips."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG file")
    pos, idat, W, H = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            W, H, depth, colour = struct.unpack(">IIBB", body[:10])
            if (depth, colour) != (8, 0):
                raise ValueError(f"{path}: only 8-bit greyscale PNGs are read here")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(H, W + 1)
    if rows[:, 0].any():
        raise ValueError(f"{path}: only unfiltered PNG rows are read here")
    return rows[:, 1:].copy()
