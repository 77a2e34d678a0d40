"""The `structured` suite's constraints: the zoo tasks whose answers have a format, as a JSON schema, a regex or
a grammar, and JSON schemas covering JSONSchemaBench's feature classes.

The zoo models were never trained on JSON objects, so the schema tasks measure validity and speed only (there is
no reference answer); the zoo tasks measure validity, task accuracy and speed with and without the constraint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...constraints import Constraint, grammar, json_schema, regex
from .base import Item

NAME = "[A-Z][a-z]+ [A-Z][a-z]+"


def _names(n: int) -> Constraint:
    """A JSON array of exactly n "First Last" names (the lists.* answer format)."""
    return json_schema({"type": "array", "items": {"type": "string", "pattern": f"^{NAME}$"},
                        "minItems": n, "maxItems": n})


def _letters(n: int) -> Constraint:
    return regex(r"\[[A-Z](, [A-Z]){%d}\]" % (n - 1))


def _latin(symbols: list[str]) -> Constraint:
    sym = " | ".join(f'"{s}"' for s in symbols)
    return grammar(f'start: row "\\n" row "\\n" row "\\n" row\nrow: sym "," sym "," sym "," sym\nsym: {sym}\n')


# zoo task -> the answer's format for one item (built from what the prompt says: the list, its length)
TASK_CONSTRAINTS: dict[str, Callable[[Item], Constraint]] = {
    "lists.sort": lambda item: _names(len(item.data["input"])),
    "lists.insert_index": lambda item: _names(len(item.data["input"]) + 1),
    "letters.sort": lambda item: _letters(len(item.data["input"])),
    "puzzles.sudoku": lambda item: regex(r"([1-4]{4}\n){3}[1-4]{4}"),
    "puzzles.latin_square": lambda item: _latin(list(item.data["symbols"])),
}


@dataclass(frozen=True)
class SchemaTask:
    """A JSON-schema task without a reference: validity and speed only."""

    name: str  # the JSONSchemaBench feature class it covers
    prompt: str
    schema: dict[str, Any]

    def constraint(self) -> Constraint:
        return json_schema(self.schema)


SHORT = {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"}
SCHEMA_TASKS = (
    SchemaTask("schema.enum", "Pick a color and a size for the shirt as JSON.", {
        "type": "object", "additionalProperties": False, "required": ["color", "size"],
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", "XL"]}},
    }),
    SchemaTask("schema.nested", "Give the customer and their address as JSON.", {
        "type": "object", "additionalProperties": False, "required": ["name", "address"],
        "properties": {
            "name": SHORT,
            "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                        "properties": {"city": SHORT, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
        },
    }),
    SchemaTask("schema.array_bounds", "List two to four ages as a JSON array.", {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 120}, "minItems": 2, "maxItems": 4,
    }),
    SchemaTask("schema.string_formats", "Give the booking's date, id and server address as JSON.", {
        "type": "object", "additionalProperties": False, "required": ["date", "id", "server"],
        "properties": {"date": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"},
                       "server": {"type": "string", "format": "ipv4"}},
    }),
    SchemaTask("schema.anyof", "Give the count: a number, a word, or a list of flags, as JSON.", {
        "anyOf": [{"type": "integer", "minimum": 0, "maximum": 1000},
                  {"enum": ["none", "many"]},
                  {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}],
    }),
)
