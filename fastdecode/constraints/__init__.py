"""Constrained decoding: JSON schemas, regular expressions and grammars on every method (docs/constraints.md)."""

from .backend import ConstraintError, LLGuidanceBackend
from .constraint import Compiled, Constraint, as_constraint, from_file, grammar, json_schema, regex

__all__ = ["Compiled", "Constraint", "ConstraintError", "LLGuidanceBackend", "as_constraint", "from_file",
           "grammar", "json_schema", "regex"]
