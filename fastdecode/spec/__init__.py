"""Speculative decoding: drafters propose, the target verifies in one forward. Importing registers `spec.*`."""

from .drafters import dlm_draft, draft_model, dyntree, jacobi, layerskip, lookahead, ngram, pld, recycling, rsd, suffix  # noqa: F401
