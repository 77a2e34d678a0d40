"""Waiting-line tasks (`lists.*`): lists of 3-8 "First Last" names, after ParallelBench §1.2.

Differences from ParallelBench: our own name lists, sort labels really follow the last name the
prompt asks for, and index prompts say that positions count from 0.
"""

from __future__ import annotations

import random
from typing import Sequence

from ._lists import (
    CopyTask,
    InsertIndexTask,
    InsertRandomTask,
    ListSource,
    RemoveIndexTask,
    RemoveRandomTask,
    ReplaceIndexTask,
    ReplaceRandomTask,
    ReverseTask,
    ShuffleTask,
    SortTask,
)

FIRST_NAMES = (
    "Adam", "Alice", "Amy", "Andrew", "Anna", "Ben", "Beth", "Brian", "Carl", "Chloe",
    "Claire", "Dan", "David", "Diana", "Ed", "Ella", "Emma", "Eric", "Fiona", "Frank",
    "Grace", "Greg", "Hannah", "Helen", "Ian", "Jack", "Jane", "Jason", "Julia", "Karen",
    "Kate", "Kevin", "Laura", "Leo", "Lily", "Lucy", "Mark", "Mary", "Max", "Megan",
    "Mike", "Nancy", "Nick", "Olivia", "Paul", "Peter", "Rachel", "Rose", "Ryan", "Sam",
    "Sarah", "Sean", "Sophie", "Steve", "Susan", "Tom", "Tony", "Victor", "Wendy", "Zoe",
)  # fmt: skip
LAST_NAMES = (
    "Adams", "Allen", "Baker", "Bell", "Brooks", "Brown", "Butler", "Carter", "Clark", "Collins",
    "Cook", "Cooper", "Davis", "Evans", "Fisher", "Foster", "Gray", "Green", "Hall", "Harris",
    "Hill", "Hughes", "Hunt", "Jones", "Kelly", "King", "Knight", "Lee", "Lewis", "Long",
    "Marsh", "Martin", "Mason", "Miller", "Moore", "Morgan", "Murphy", "Nelson", "Owen", "Parker",
    "Perry", "Price", "Reed", "Rogers", "Ross", "Russell", "Scott", "Shaw", "Smith", "Stone",
    "Taylor", "Turner", "Walker", "Ward", "Watson", "White", "Wood", "Wright", "Young", "Fox",
)  # fmt: skip
MIN_PEOPLE, MAX_PEOPLE = 3, 8


def last_name(person: str) -> str:
    """The sort key of a waiting-line entry."""
    return person.rsplit(" ", 1)[-1]


def sample_people(rng: random.Random) -> list[str]:
    """3-8 people; first names and last names are each distinct within the line."""
    n = rng.randint(MIN_PEOPLE, MAX_PEOPLE)
    firsts, lasts = rng.sample(FIRST_NAMES, n), rng.sample(LAST_NAMES, n)
    return [f"{first} {last}" for first, last in zip(firsts, lasts, strict=True)]


def fresh_person(rng: random.Random, line: Sequence[str]) -> str:
    """A person whose first and last names both differ from everyone in `line`."""
    used = {part for person in line for part in person.split(" ")}
    first = rng.choice([name for name in FIRST_NAMES if name not in used])
    last = rng.choice([name for name in LAST_NAMES if name not in used])
    return f"{first} {last}"


PEOPLE = ListSource(
    family="lists",
    noun="waiting line",
    item_noun="person",
    quote=True,
    sort_phrase="alphabetically by last name",
    sort_key=last_name,
    sample=sample_people,
    fresh=fresh_person,
    max_len=MAX_PEOPLE,
    max_item_chars=max(map(len, FIRST_NAMES)) + 1 + max(map(len, LAST_NAMES)),
)

TASKS = tuple(
    cls(PEOPLE)
    for cls in (
        CopyTask,
        ReverseTask,
        SortTask,
        ShuffleTask,
        InsertIndexTask,
        RemoveIndexTask,
        ReplaceIndexTask,
        InsertRandomTask,
        RemoveRandomTask,
        ReplaceRandomTask,
    )
)
