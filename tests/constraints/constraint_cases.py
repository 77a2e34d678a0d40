"""Shared by the constraint tests: the constraints every family is checked under, and a validity check."""

from __future__ import annotations

from fastdecode import constraints

# a regex the tiny tokenizer's words fit, and a bounded JSON schema (both force an end within 40 tokens)
REGEX = r"[a-z]{1,6}( [a-z]{1,6}){0,4}\."
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}
CONSTRAINTS = {"regex": constraints.regex(REGEX), "json_schema": constraints.json_schema(SCHEMA)}


def valid(model, compiled, ids: list[int]) -> bool:
    """`ids` (through EOS) is a text the grammar allows, complete if it ended with EOS."""
    matcher = compiled.grammar.start()
    if matcher.advance(list(ids)) != len(ids):
        return False
    return not ids or ids[-1] not in model.eos_token_ids or matcher.accepting
