"""One file per `dlm.*` method: its config (a frozen dataclass with the paper's defaults) and its policy."""

from . import adablock, baseline, ccd, credit, dcd, entropy_bound, ete, factor, freedave, localleap, prophet, r2, threshold  # noqa: F401
