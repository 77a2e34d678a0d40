"""The small VQ image tokenizer: 28x28 grey images <-> 7x7 codes of an L2-normalised codebook (LlamaGen's shape).

Encoder: two stride-2 convolutions (28 -> 14 -> 7) and a 1x1 projection to d dimensions; the codes are the
codebook entries of highest cosine similarity to the (normalised) encoder output, which is LlamaGen's guard against
codebook collapse. Decoder: the mirror image, from the (unit-length) code vectors back to pixels in [0, 1].
Saved as `model.safetensors` + `config.json` in a folder (`vq/` beside an image model); trained by
`fastdecode train img-vq` (`fastdecode/image/vq_train.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import ModelLoadError


class VQNet(nn.Module):
    """Conv encoder/decoder around a [K, d] codebook; `width` channels at 14x14, 2*width at 7x7."""

    def __init__(self, codes: int = 64, dim: int = 8, width: int = 32, size: int = 28) -> None:
        super().__init__()
        if size % 4:
            raise ValueError(f"the image side must be divisible by 4 (two stride-2 steps), not {size}")
        self.codes, self.dim, self.width, self.size = codes, dim, width, size
        w = width
        self.encoder = nn.Sequential(
            nn.Conv2d(1, w, 4, 2, 1), nn.SiLU(),
            nn.Conv2d(w, 2 * w, 4, 2, 1), nn.SiLU(),
            nn.Conv2d(2 * w, 2 * w, 3, 1, 1), nn.SiLU(),
            nn.Conv2d(2 * w, dim, 1),
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(dim, 2 * w, 3, 1, 1), nn.SiLU(),
            nn.Conv2d(2 * w, 2 * w, 3, 1, 1), nn.SiLU(),
            nn.ConvTranspose2d(2 * w, w, 4, 2, 1), nn.SiLU(),
            nn.ConvTranspose2d(w, 1, 4, 2, 1),
        )
        self.codebook = nn.Parameter(F.normalize(torch.randn(codes, dim), dim=-1))  # [K, d]

    @property
    def grid(self) -> tuple[int, int]:
        return (self.size // 4, self.size // 4)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-length encoder outputs `[B, h*w, d]` of images `[B, H, W]` in [0, 1]."""
        z = self.encoder(x[:, None])  # [B, d, h, w]
        return F.normalize(z.flatten(2).transpose(1, 2), dim=-1)  # [B, h*w, d]

    def unit_codebook(self) -> torch.Tensor:
        return F.normalize(self.codebook, dim=-1)  # [K, d]

    def lookup(self, z: torch.Tensor) -> torch.Tensor:
        """Codes `[B, n]` of unit vectors `[B, n, d]`: the nearest codebook entry by cosine similarity."""
        return (z @ self.unit_codebook().T).argmax(-1)

    def reconstruct(self, vectors: torch.Tensor) -> torch.Tensor:
        """Pixels `[B, H, W]` in [0, 1] from code vectors `[B, h*w, d]`."""
        B, n, d = vectors.shape
        h, w = self.grid
        z = vectors.transpose(1, 2).reshape(B, d, h, w)
        return torch.sigmoid(self.decoder(z))[:, 0]  # [B, H, W]


class VQCodec:
    """A trained `VQNet` as an image model's codec (`models/image.Codec`)."""

    def __init__(self, net: VQNet) -> None:
        self.net = net.eval()
        self.grid = net.grid
        self.size = (net.size, net.size)

    @property
    def codebook(self) -> torch.Tensor:
        return self.net.unit_codebook().detach().float()  # [K, d]

    def encode(self, images: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(images), dtype=torch.float32) / 255.0  # [B, H, W]
        with torch.inference_mode():
            return self.net.lookup(self.net.features(x))  # [B, h*w]

    def decode_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.net.reconstruct(vectors.float())

    def config(self) -> dict[str, Any]:
        return {"tokenizer": "vq", "vq": "vq", "image_size": list(self.size)}


def vq_config(net: VQNet) -> dict[str, Any]:
    return {"kind": "vq", "codes": net.codes, "dim": net.dim, "width": net.width, "size": net.size}


def save_vq(net: VQNet, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    cfg = {**vq_config(net), "dtype": str(dtype).removeprefix("torch.")}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_vq(folder: Path) -> VQCodec:
    """The VQ codec saved in `folder` (config.json + model.safetensors), in float32 on the CPU."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
        net = VQNet(int(cfg["codes"]), int(cfg["dim"]), int(cfg["width"]), int(cfg["size"]))
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"The VQ tokenizer in {folder} has no valid config.json ({e!r}); train it with "
                             "`fastdecode train img-vq` or restore the folder.") from None
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ModelLoadError(f"The VQ tokenizer in {folder} lacks model.safetensors; train it with "
                             "`fastdecode train img-vq` or restore the folder.")
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise ModelLoadError(f"The VQ weights in {folder} do not match its config.json ({e}).") from None
    return VQCodec(net)
