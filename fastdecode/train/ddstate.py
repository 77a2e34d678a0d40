"""What DD1's and DD2's training share: resumable checkpoints (safetensors + JSON), the teacher, the pair data.

A checkpoint holds every trained module's float32 tensors and its AdamW moments in one safetensors file and the step,
the settings and the log in JSON, written then renamed, so an interrupted run resumes where it stopped. The teacher's
(noise, codes) pairs are made in seeded chunks (`image/dd.py`'s `teacher_map`) and cached under
`~/.cache/fastdecode/dd-pairs/`, each chunk's noise drawn again from its seed rather than stored.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import ParameterError
from ..image.dd import noise, teacher_map

CHECKPOINT = "checkpoint"
Report = Callable[[str, int, int, dict[str, float]], None]  # (phase, done, total, metrics)


def save_state(folder: Path, modules: dict[str, nn.Module], opts: dict[str, torch.optim.Optimizer],
               record: dict[str, Any]) -> None:
    where = folder / CHECKPOINT
    where.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, module in modules.items():
        tensors.update({f"{name}.{k}": v.detach().cpu().contiguous() for k, v in module.state_dict().items()})
    for name, opt in opts.items():
        for i, p in enumerate(g for group in opt.param_groups for g in group["params"]):
            for key, value in opt.state.get(p, {}).items():
                tensors[f"opt-{name}.{i}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, str(where / "state.safetensors.tmp"))
    (where / "state.safetensors.tmp").replace(where / "state.safetensors")
    (where / "state.json.tmp").write_text(json.dumps(record))
    (where / "state.json.tmp").replace(where / "state.json")


def load_state(folder: Path, modules: dict[str, nn.Module], opts: dict[str, torch.optim.Optimizer],
               identity: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's record (modules and optimisers loaded), None when there is none; another run's is refused."""
    where = folder / CHECKPOINT
    if not (where / "state.json").is_file():
        return None
    record = json.loads((where / "state.json").read_text())
    if record.get("identity") != json.loads(json.dumps(identity)):
        raise ParameterError(f"{folder} holds a checkpoint of another run ({record.get('identity')}): pass the same "
                             f"settings to resume it, or another --out (or delete {where}).")
    tensors = load_file(str(where / "state.safetensors"))
    for name, module in modules.items():
        module.load_state_dict({k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")})
    for name, opt in opts.items():
        for i, p in enumerate(g for group in opt.param_groups for g in group["params"]):
            prefix = f"opt-{name}.{i}."
            moments = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
            if moments:
                opt.state[p] = {k: (v if k != "step" else v.float()) for k, v in moments.items()}
    return record


def clear_state(folder: Path) -> None:
    where = folder / CHECKPOINT
    for f in where.glob("*"):
        f.unlink()
    if where.is_dir():
        where.rmdir()


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
