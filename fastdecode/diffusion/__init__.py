"""Masked-diffusion decoding (LLaDA-style canvases). Importing registers `dlm.*`."""

from . import policies  # noqa: F401
