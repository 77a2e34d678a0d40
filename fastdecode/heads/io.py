"""Heads on disk: `model.safetensors` plus a `config.json`, loaded by folder or by zoo name, never by unpickling.

config.json holds `{"fastdecode_head": 1, "kind": ..., "config": {fields}, "target": {Target}, "dtype": ...}`.
A shipped head lives beside the zoo model it was trained against, `fastdecode/zoo/<model>/heads/<name>/`, and is
named `zoo:<model>/<name>` (e.g. `zoo:ar-small/eagle3`), so a model's heads travel with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import weakref
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import ModelLoadError, close_names
from ..models.loading import DTYPES, UNSAFE_WEIGHTS, pick_device
from .base import Head, Target, config_fields, config_from, head_class

UNTRAINED = "FASTDECODE_UNTRAINED_HEADS"  # "1": a model without a head of the kind asked decodes with a random one
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
HELD = 4  # heads held per model (`held`), the least recently asked for dropped first

H = TypeVar("H", bound=Head)


def _zoo() -> Path:
    return Path(str(resources.files("fastdecode") / "zoo"))


def head_names() -> list[str]:
    """The shipped heads, as `zoo:` names without the prefix: `<model>/<name>`."""
    root = _zoo()
    if not root.is_dir():
        return []
    return sorted(f"{p.parent.parent.name}/{p.name}" for p in root.glob("*/heads/*") if (p / CONFIG).is_file())


def resolve_head(source: str | Path) -> Path:
    """`zoo:<model>/<name>` or a path to an existing head folder (one holding config.json)."""
    text = str(source)
    if text.startswith("zoo:"):
        model, _, name = text[4:].partition("/")
        folder = _zoo() / model / "heads" / name
        if not name or not (folder / CONFIG).is_file():
            raise ModelLoadError(f"No shipped head named {text!r} (zoo:<model>/<head>). "
                                 f"{close_names(text[4:], head_names())}")
        return folder
    folder = Path(text).expanduser()
    if not folder.is_dir():
        what = "is a file, not a head folder" if folder.exists() else "does not exist"
        raise ModelLoadError(f"Head folder {text!r} {what}. Pass a folder written by save_head (config.json and "
                             f"{WEIGHTS}) or zoo:<model>/<head> ({', '.join(head_names()) or 'no heads shipped'}).")
    if not (folder / CONFIG).is_file():
        raise ModelLoadError(f"{text!r} has no {CONFIG}: it is not a head folder written by save_head.")
    return folder


def save_head(head: Head, folder: str | Path, dtype: str | torch.dtype | None = None) -> Path:
    """Write `head`'s tensors (floating ones cast to `dtype`, default: as they are) and its config.json."""
    kind = head.kind
    if not kind or head_class(kind) is not type(head):
        raise ValueError(f"{type(head).__name__} is not a registered head kind: decorate it with @register_head")
    cast = _dtype(dtype) if dtype is not None else None
    tensors = {k: v.detach().to(device="cpu", dtype=cast if cast is not None and v.is_floating_point() else v.dtype,
                                copy=True).contiguous()
               for k, v in head.state_dict().items()}
    floating = {str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()}
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt", "kind": kind})
    record = {
        "fastdecode_head": FORMAT_VERSION,
        "kind": kind,
        "config": config_fields(head.config),
        "target": dataclasses.asdict(head.target) if head.target is not None else None,
        "dtype": floating.pop() if len(floating) == 1 else sorted(floating) or None,
    }
    (out / CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    return out


def load_head(source: str | Path, device: str | torch.device | None = None,
              dtype: str | torch.dtype | None = None) -> Head:
    """The head saved in `source` (a folder or `zoo:<model>/<name>`), in eval mode on `device` (default: CUDA when
    present), its floating tensors in `dtype` (default: as saved). Any mismatch between the kind's module and the
    saved tensors is refused, naming the tensors."""
    folder = resolve_head(source)
    record = _read(folder)
    kind = record.get("kind")
    if not isinstance(kind, str):
        raise ModelLoadError(f"{folder / CONFIG} names no head kind; it was not written by save_head.")
    config = config_from(kind, record.get("config") or {})
    target = record.get("target")
    try:
        head = head_class(kind)(config, Target(**target) if target else None)
    except TypeError as e:
        raise ModelLoadError(f"{folder / CONFIG} has a malformed target record ({e}).") from None
    _load_tensors(head, folder)
    head = head.to(device=pick_device(device))
    if dtype is not None:
        head = head.to(dtype=_dtype(dtype))
    return head.eval()


def _read(folder: Path) -> dict[str, Any]:
    try:
        record = json.loads((folder / CONFIG).read_text())
    except ValueError as e:
        raise ModelLoadError(f"{folder / CONFIG} is not valid JSON ({e}).") from None
    if not isinstance(record, dict) or "fastdecode_head" not in record:
        raise ModelLoadError(f"{folder / CONFIG} is not a head config (no 'fastdecode_head' entry): pass a folder "
                             "written by save_head; a whole model loads with fastdecode.load.")
    if record["fastdecode_head"] != FORMAT_VERSION:
        raise ModelLoadError(f"{folder / CONFIG} has head format {record['fastdecode_head']!r}; this fastdecode "
                             f"reads format {FORMAT_VERSION}.")
    return record


def _load_tensors(head: Head, folder: Path) -> None:
    """Copy the folder's tensors into `head`, refusing missing, unexpected or wrongly shaped ones."""
    path = folder / WEIGHTS
    saved = read_weights(path, "Head weights", "Save the head (again) with save_head.")
    fit_tensors(head, saved, path, f"a {head.kind!r} head with this config")  # the saved tensors, in their dtypes


def read_weights(path: Path, what: str, fix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file `path`, never a pickle: a missing file is refused with a pickle beside it
    named (fastdecode never loads one), a corrupt one with safetensors' reason; `what` names the file in the message
    ("Head weights", "EAGLE-3 head weights") and `fix`, a sentence, ends it."""
    more = f" {fix}" if fix else ""
    if not path.is_file():
        pickled = [u for u in UNSAFE_WEIGHTS if (path.parent / u).exists()]
        hint = (f" The folder has {pickled[0]}, a pickle fastdecode never loads: convert it to safetensors where you "
                "trust it." if pickled else "")
        raise ModelLoadError(f"{what} {path} are missing.{hint}{more}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ModelLoadError(f"{what} {path} are corrupt or truncated ({e}).{more}") from None


def fit_tensors(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: Path, what: str,
                note: str = "") -> None:
    """`module.load_state_dict(tensors, strict=True, assign=True)` (the tensors themselves, in their dtypes), after
    refusing missing, unexpected or wrongly shaped ones, a few of each named: `where` the file they came from, `what`
    the module they were meant for ("a 'medusa' head with this config"), `note` a sentence more."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    more = f" {note}" if note else ""
    if missing or unexpected:
        raise ModelLoadError(f"{where} does not fit {what}: missing tensors {_few(missing)}, unexpected tensors "
                             f"{_few(unexpected)}.{more}")
    wrong = [f"{k} {tuple(tensors[k].shape)} (the config gives {tuple(v.shape)})"
             for k, v in expected.items() if tensors[k].shape != v.shape]
    if wrong:
        raise ModelLoadError(f"{where} has tensors of the wrong shape for {what}: {_few(wrong)}.{more}")
    module.load_state_dict(tensors, strict=True, assign=True)


def _few(names: list[str], n: int = 5) -> str:
    if not names:
        return "none"
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}.")
    return DTYPES[dtype]


# the heads loaded for each model (`held`): a method runs once per generation, and reading a head's folder and moving
# it to the device every generation cost a real head (an EAGLE-3 layer of an 8B target, about 1 GB) more than the
# generation; a head also carries what outlives a generation (EAGLE-3's graphs over its draft cache, cache/pool.py's
# role for the model's). Weak in the model: a model's heads go with it.
_HELD: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()
_HELD_LOCK = threading.Lock()


def held(model: Any, what: tuple[Any, ...], folder: Path | None, load: Callable[[], H]) -> H:
    """`load()`, once per `model`, `what` (the kind and source asked for) and the state of `folder`'s files (a head
    written again is loaded again): the same head object while the model lives. At most `HELD` heads a model. A
    model that cannot be referenced weakly loads every time."""
    files = () if folder is None else tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                                                   for p in folder.iterdir() if p.is_file()))
    key = (*what, str(getattr(model, "device", "")), str(getattr(model, "dtype", "")), files)
    try:
        with _HELD_LOCK:
            heads = _HELD.setdefault(model, {})
            found = heads.pop(key, None)
    except TypeError:  # (no weak reference or no hash: nothing is held)
        return load()
    if found is None:
        found = load()
    with _HELD_LOCK:
        heads[key] = found  # (last: the most recently asked for)
        while len(heads) > HELD:
            heads.pop(next(iter(heads)))
    return found


def head_for(model: Any, kind: str, head: str | Path | None = None) -> Head:
    """The head a method decodes `model` with: `head` (a folder or `zoo:<model>/<name>`) when given, else the head of
    kind `kind` shipped beside a zoo model (`zoo:ar-small` finds `zoo:ar-small/<kind>`). It is loaded on the model's
    device and dtype, and refused when it is of another kind or was trained against another model."""
    if head is None:
        name = str(getattr(model, "name", ""))
        shipped = f"{name}/{kind}" if name.startswith("zoo:") else None
        if shipped is None or not (_zoo() / name[4:] / "heads" / kind / CONFIG).is_file():
            if untrained_heads_allowed():
                return held(model, (kind, "untrained"), None, lambda: _untrained(model, kind))
            raise ModelLoadError(
                f"No {kind!r} head ships for {name or 'this model'!r}: pass head=FOLDER (a head trained for this "
                f"model: fastdecode train drafter --target MODEL --kind {kind}) "
                f"(shipped: {', '.join(head_names()) or 'none'})."
            )
        head = shipped
    device = getattr(model, "device", None)
    dtype = getattr(model, "dtype", None)
    source = head
    found = held(model, (kind, str(head)), resolve_head(head),
                 lambda: load_head(source, device=device, dtype=dtype if isinstance(dtype, torch.dtype) else None))
    if found.kind != kind:
        raise ModelLoadError(f"{head} holds a {found.kind!r} head, not a {kind!r} one: pass a {kind} head folder.")
    if found.target is not None:
        found.target.check(model, f"the {kind} head {head}")
    return found


def untrained_heads_allowed() -> bool:
    """Whether a model with no head of a kind decodes with a seeded random one (environment variable
    FASTDECODE_UNTRAINED_HEADS=1). The test suite sets it: its tiny random models have no trained heads, and a
    lossless method must still be lossless with any head. Never the default: a random head only slows decoding."""
    return os.environ.get(UNTRAINED, "") == "1"


def _untrained(model: Any, kind: str) -> Head:
    head = head_class(kind).untrained(model)
    dtype = getattr(model, "dtype", None)
    return head.to(device=getattr(model, "device", None) or "cpu",
                   dtype=dtype if isinstance(dtype, torch.dtype) else None).eval()
