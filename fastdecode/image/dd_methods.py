"""img.dd1 and img.dd2: an image in one or two forwards of a Distilled Decoding network (docs/image-dd.md).

Each row draws Gaussian noise [n, d] (from `seed`), the network maps it to n codes in one forward (`img.dd1`
steps=2: a second forward re-reads the same noise after the first `second` codes, which it keeps). The network is the
head shipped beside the zoo teacher (`zoo:img-ar/dd1`, `zoo:img-ar/dd2`) or `head=FOLDER`. It was distilled at one
guidance scale, which it records: another `cfg_scale` is refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..config import MethodConfig, check
from ..errors import IncompatibleMethodError, ModelLoadError
from ..heads import head_class
from ..heads.dd import DDNet
from ..heads.io import WEIGHTS, head_names, load_head, resolve_head, untrained_heads_allowed
from ..registry import ConstraintSupport, RunContext, register
from ..sampling.samplers import host_generator
from ..types import PromptBatch, StepEvent
from .dd import dd_steps, noise

NO_CONSTRAINTS = ConstraintSupport(refused="writes every code of an image at once from noise, so no grammar can "
                                           "steer it: use ar.sample for constrained output")


@dataclass(frozen=True)
class DDConfig(MethodConfig):
    """seed (None: the run's generator=, on any device, else torch's global RNG) and head ("" = the network shipped
    beside the zoo teacher)."""

    seed: int | None = None
    head: str = ""


@dataclass(frozen=True)
class DD1Config(DDConfig):
    steps: int = 1  # forwards per image: 1, or 2 (the second re-reads the noise after the first codes)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.steps in (1, 2), "steps", self.steps, "must be 1 or 2")


def dd_network(model: Any, name: str, head: str) -> DDNet:
    """The DD network for `model`: `head` (a folder or zoo:<model>/<name>), else the one shipped as `name` beside a
    zoo model, else (test suite only, FASTDECODE_UNTRAINED_HEADS=1) a seeded untrained copy of the teacher."""
    if getattr(model, "image", None) is None:
        raise IncompatibleMethodError(f"Distilled Decoding generates images: {getattr(model, 'name', 'this model')!r} "
                                      "is a text model (load an image model such as zoo:img-ar).")
    source: str | None = head or None
    zoo_name = str(getattr(model, "name", ""))
    if source is None and zoo_name.startswith("zoo:") and f"{zoo_name[4:]}/{name}" in head_names():
        source = f"{zoo_name}/{name}"
    if source is None:
        if not untrained_heads_allowed():
            raise ModelLoadError(f"No {name} network ships for {zoo_name or 'this model'!r}: train one "
                                 f"(fastdecode train {name} --teacher MODEL --out FOLDER) and pass head=FOLDER.")
        net = head_class("dd").untrained(model)
        assert isinstance(net, DDNet)
        return net.to(model.device).eval()
    found = _load(str(source), str(model.device))
    if not isinstance(found, DDNet):
        raise ModelLoadError(f"{source} holds a {found.kind!r} head, not a Distilled Decoding network.")
    if found.target is not None:
        found.target.check(model, f"the {name} network {source}")
    trained = found.config.cfg_scale
    if trained and abs(trained - float(getattr(model, "scale", 1.0))) > 1e-6:
        raise IncompatibleMethodError(f"{source} was distilled at cfg_scale={trained:g}; a Distilled Decoding "
                                      f"network samples only that guidance: pass cfg_scale={trained:g} (or leave it "
                                      "out when it is the model's default), or distil one at the scale you want.")
    return found


_LOADED: dict[tuple[str, str, float], DDNet] = {}


def _load(source: str, device: str) -> DDNet:
    """The network in `source`, loaded once per folder, device and file time: a generation of one image costs about
    one forward, which reading the weights from disk every time would dwarf."""
    folder = resolve_head(source)
    key = (str(folder.resolve()), device, (folder / WEIGHTS).stat().st_mtime if (folder / WEIGHTS).is_file() else 0.0)
    if key not in _LOADED:
        found = load_head(folder, device=device, dtype=torch.float32)
        if not isinstance(found, DDNet):
            raise ModelLoadError(f"{source} holds a {found.kind!r} head, not a Distilled Decoding network.")
        if len(_LOADED) >= 4:  # a few networks at a time are enough for a process that samples
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = found
    return _LOADED[key]


def _run(model: Any, batch: PromptBatch, cfg: DDConfig, name: str, steps: int, ctx: RunContext) -> Iterator[StepEvent]:
    net = dd_network(model, name, cfg.head)
    image = model.image
    gen = host_generator(ctx.generator)  # the noise is drawn on the host
    if gen is None and cfg.seed is not None:
        gen = torch.Generator().manual_seed(cfg.seed)
    labels = torch.tensor([batch.row(b)[0] for b in range(batch.size)])  # [B] class tokens
    eps = noise(batch.size, image.tokens, image.d, gen)  # [B, n, d]
    done = [False] * batch.size
    for index, (first, codes) in enumerate(dd_steps(net, labels, eps, steps)):
        last = index == steps - 1
        rows = tuple(tuple((i, int(c)) for i, c in enumerate(codes[b].tolist()) if i >= first)
                     for b in range(batch.size))
        yield StepEvent(index=index, tokens=rows, forwards=1, finished=tuple([last] * batch.size) if last else
                        tuple(done))


@register("img.dd1", kind="causal", config=DD1Config, constraints=NO_CONSTRAINTS, images_only=True)
def run_dd1(model: Any, batch: PromptBatch, cfg: DD1Config, ctx: RunContext) -> Iterator[StepEvent]:
    """Distilled Decoding 1: noise to image codes in 1 or 2 forwards of a network distilled from the teacher's map."""
    return _run(model, batch, cfg, "dd1", cfg.steps, ctx)


@register("img.dd2", kind="causal", config=DDConfig, constraints=NO_CONSTRAINTS, images_only=True)
def run_dd2(model: Any, batch: PromptBatch, cfg: DDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Distilled Decoding 2: noise to image codes in one forward of a generator trained by score distillation."""
    return _run(model, batch, cfg, "dd2", 1, ctx)
