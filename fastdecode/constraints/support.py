"""Which methods take `constraint=`: `engine.resolve` checks it before a request compiles its constraint.

Each method declares what it honours where it registers (`registry.ConstraintSupport`: `register(...,
constraints=...)`); this module only reads that declaration and words the refusal.
"""

from __future__ import annotations

from typing import Any

from ..errors import IncompatibleMethodError
from ..registry import Method

# how each constraint sampling mode is named when a method refuses it
_MODES = {
    "mask": "The grammar mask (sampling='mask')",
    "gad": "Grammar-Aligned Decoding (sampling='gad')",
}


def check(spec: Method, constraint: Any) -> None:
    """Refuse, with the fix, a method that cannot honour the constraint."""
    support = spec.constraints
    if support.refused:
        raise IncompatibleMethodError(f"Method {spec.name!r} cannot apply constraint=: it {support.refused}.")
    mode = constraint.sampling
    if mode not in support.sampling:
        what = _MODES.get(mode, f"sampling={mode!r}")
        raise IncompatibleMethodError(f"{what} cannot apply with {spec.name!r}: {support.why}.")
