"""Masked-diffusion decoding (LLaDA-style canvases). Importing registers `dlm.*`."""

from . import baseline  # noqa: F401
