"""Autoregressive baselines: one target forward per token. Importing registers `ar.*`."""

from . import greedy, sample  # noqa: F401
