"""Fixtures of the constraint tests (shared values live in constraint_cases.py: conftest names collide)."""

from __future__ import annotations

import pytest
from constraint_cases import valid

pytest.importorskip("llguidance")


@pytest.fixture(scope="session")
def check_valid():
    return valid
