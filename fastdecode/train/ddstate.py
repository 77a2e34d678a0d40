"""What DD1's and DD2's training share: resumable checkpoints (safetensors + JSON), the teacher, the pair data.

A checkpoint holds every trained module's float32 tensors and its AdamW moments in one safetensors file and the step,
the settings and the log in JSON, written then renamed, so an interrupted run resumes where it stopped. The teacher's
(noise, codes) pairs are made in seeded chunks (`image/dd.py`'s `teacher_map`) and cached under
`~/.cache/fastdecode/dd-pairs/`, each chunk's noise drawn again from its seed rather than stored.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import ParameterError
from ..image.dd import noise, teacher_map
from .checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint

Report = Callable[[str, int, int, dict[str, float]], None]  # (phase, done, total, metrics)


def save_state(folder: Path, modules: dict[str, nn.Module], opts: dict[str, torch.optim.Optimizer],
               record: dict[str, Any]) -> None:
    save_checkpoint(folder, modules, {f"opt-{name}": opt for name, opt in opts.items()}, record)


def load_state(folder: Path, modules: dict[str, nn.Module], opts: dict[str, torch.optim.Optimizer],
               identity: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's record (modules and optimisers loaded), None when there is none; another run's is refused."""
    return load_checkpoint(folder, modules, {f"opt-{name}": opt for name, opt in opts.items()}, {"identity": identity})


clear_state = clear_checkpoint


def cache_root() -> Path:
    return Path(os.environ.get("FASTDECODE_CACHE", Path.home() / ".cache" / "fastdecode")) / "dd-pairs"


def _weights_digest(model: Any) -> str:
    """A short digest of the teacher's weights: the pair cache is keyed by the model, not its name."""
    h = hashlib.sha256()
    for k, v in sorted(model.model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().numpy().tobytes()[:4096])
    return h.hexdigest()[:12]


def teacher_pairs(model: Any, count: int, seed: int, map_steps: int, chunk: int = 500,
                  report: Report | None = None, cache: Path | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor]:
    """`count` (labels [N], noise [N, n, d], codes [N, n]) pairs of the guided teacher `model`, classes uniform.

    Chunk c draws its labels and noise from generator seed (seed, c), so a chunk is the same whether it is made now
    or read from the cache (`cache`, default under ~/.cache/fastdecode/dd-pairs/)."""
    image = model.image
    folder = (cache or cache_root()) / f"{_weights_digest(model)}-cfg{model.scale:g}-map{map_steps}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    labels, eps, codes = [], [], []
    chunks = (count + chunk - 1) // chunk
    for c in range(chunks):
        size = min(chunk, count - c * chunk)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + c)
        lab = image.K + torch.randint(image.C, (size,), generator=gen)  # [c] class tokens
        e = noise(size, image.tokens, image.d, gen)  # [c, n, d]
        path = folder / f"chunk{c:04d}-{size}.safetensors"
        if path.is_file():
            q = load_file(str(path))["codes"]
        else:
            q = teacher_map(model, lab, e, map_steps)
            save_file({"codes": q.contiguous()}, str(path))
        labels.append(lab)
        eps.append(e)
        codes.append(q)
        if report is not None:
            report("data", c + 1, chunks, {})
    return torch.cat(labels), torch.cat(eps), torch.cat(codes)


def check_positive(**values: float) -> None:
    bad = [f"{k}={v}" for k, v in values.items() if not v > 0]
    if bad:
        raise ParameterError(f"{', '.join(bad)}: these settings must be positive.")
