"""Training objectives as plug-ins: one file each, found here. Add an objective: write its file in this folder, an
`Objective` subclass with its `name` (see base.py); it is in `OBJECTIVES` by existing."""

from __future__ import annotations

import importlib
import pkgutil

from ...errors import ParameterError, close_names
from .base import Batch, HeadObjective, Objective, TargetBatch

for _module in pkgutil.iter_modules(__path__, prefix=__name__ + "."):
    importlib.import_module(_module.name)


def _table(cls: type[Objective]) -> dict[str, Objective]:
    found: dict[str, Objective] = {}
    for sub in cls.__subclasses__():
        if "name" in vars(sub):
            found[sub.name] = sub()
        found.update(_table(sub))
    return found


OBJECTIVES: dict[str, Objective] = _table(Objective)


def _heads(cls: type[HeadObjective]) -> dict[str, HeadObjective]:
    found: dict[str, HeadObjective] = {}
    for sub in cls.__subclasses__():
        if "kind" in vars(sub):
            found[sub.kind] = sub()
        found.update(_heads(sub))
    return found


HEAD_OBJECTIVES: dict[str, HeadObjective] = _heads(HeadObjective)  # by the head kind each trains


def head_objective(kind: str) -> HeadObjective:
    """How head kind `kind` is trained; an unknown kind is refused with the trainable ones."""
    found = HEAD_OBJECTIVES.get(kind)
    if found is None:
        raise ParameterError(f"No training objective for head kind {kind!r}. {close_names(kind, HEAD_OBJECTIVES)}")
    return found


def objective(name: str) -> Objective:
    """The objective a recipe names; an unknown name is refused with the known ones."""
    found = OBJECTIVES.get(name)
    if found is None:
        raise ParameterError(f"Unknown training objective {name!r}. {close_names(name, OBJECTIVES)}")
    return found


__all__ = ["HEAD_OBJECTIVES", "OBJECTIVES", "Batch", "HeadObjective", "Objective", "TargetBatch", "head_objective",
           "objective"]
