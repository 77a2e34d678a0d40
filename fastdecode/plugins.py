"""Discovery of the method families: every module under their packages is imported once, by name.

A method file registers itself by existing (`@register("spec.suffix", ...)`, `register_rule("quest", ...)`), so
whatever enumerates the methods or the attention rules first calls `load()`. The families are named here as
strings and imported with importlib: the core modules that call `load()` (`registry`, `attention`) never import a
family statically, and a family may import the core freely.
"""

from __future__ import annotations

import importlib
import pkgutil

FAMILIES = (
    "fastdecode.ar", "fastdecode.diffusion", "fastdecode.hf", "fastdecode.image", "fastdecode.llamacpp",
    "fastdecode.sparse", "fastdecode.speculative",
)
_loaded = False


def load() -> None:
    """Import every module of every family (once): their methods and rules are registered afterwards."""
    global _loaded
    if _loaded:
        return
    for name in FAMILIES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, prefix=name + "."):
            importlib.import_module(module.name)
    _loaded = True
