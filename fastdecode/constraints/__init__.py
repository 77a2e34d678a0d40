"""Constrained decoding: JSON schemas, regular expressions and grammars on every method (docs/constraints.md)."""

from .backend import ConstraintError, LLGuidanceBackend, MatcherError
from .constraint import (
    Compiled,
    Constraint,
    as_constraint,
    check_sampling,
    from_file,
    grammar,
    json_schema,
    regex,
)

__all__ = ["Compiled", "Constraint", "ConstraintError", "LLGuidanceBackend", "MatcherError", "as_constraint",
           "check_sampling", "from_file", "grammar", "json_schema", "regex"]
