"""Training objectives as plug-ins: one file each, one table here. Add an objective: write its file (an
`Objective` subclass, see base.py) and list it in `OBJECTIVES`."""

from __future__ import annotations

from ...errors import ParameterError, close_names
from .ar import AR
from .base import Batch, Objective
from .mdlm import MDLM

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (AR(), MDLM())}


def objective(name: str) -> Objective:
    """The objective a recipe names; an unknown name is refused with the known ones."""
    found = OBJECTIVES.get(name)
    if found is None:
        raise ParameterError(f"Unknown training objective {name!r}. {close_names(name, OBJECTIVES)}")
    return found


__all__ = ["OBJECTIVES", "Batch", "Objective", "objective"]
