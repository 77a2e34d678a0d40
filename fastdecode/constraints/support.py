"""Which methods take `constraint=`: `engine.resolve` checks it before a request compiles its constraint."""

from __future__ import annotations

from typing import Any

from ..errors import IncompatibleMethodError

# methods that run a loop of their own the grammar mask cannot reach
_REFUSED = {
    "llamacpp.": "runs llama.cpp's own decoding loop, which fastdecode's grammar mask does not reach; "
                 "use ar.greedy or a spec.* method (llama.cpp's own GBNF grammars are not wired in)",
    "dlm.freedave": "runs a draft-and-verify loop of its own over the canvas; "
                    "use dlm.threshold or another dlm.* method",
}


def check(spec: Any, constraint: Any) -> None:
    """Refuse, with the fix, a method that cannot honour the constraint."""
    for prefix, why in _REFUSED.items():
        if spec.name == prefix or (prefix.endswith(".") and spec.name.startswith(prefix)):
            raise IncompatibleMethodError(f"Method {spec.name!r} cannot apply constraint=: it {why}.")
    if constraint.gad and spec.kind == "diffusion":
        raise IncompatibleMethodError(
            f"Grammar-Aligned Decoding (sampling='gad') reweights a left-to-right distribution, which {spec.name!r} "
            "(a diffusion method) does not sample from: use sampling='mask' with dlm.*, or GAD with ar.sample / spec.*."
        )
