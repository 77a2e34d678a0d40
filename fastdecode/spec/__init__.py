"""Speculative decoding: drafters propose, the target verifies in one forward. Importing registers `spec.*`."""

from .drafters import draft_model, jacobi, lookahead, ngram, pld, recycling, suffix  # noqa: F401
