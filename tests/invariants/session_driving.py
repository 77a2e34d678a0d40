"""The join-and-step loop the session tests share (`ARSession`, `SpecSession`): rows join between steps when the
test says so, and every token a step emits is appended to its prompt's list, checked to arrive in order."""

from __future__ import annotations

from collections.abc import Callable


def drive(session, owner: dict[int, int], waiting: list[int], due: Callable[[int, int], bool],
          join: Callable[[int], int]) -> dict[int, list[int]]:
    """Step `session` until no row runs and no prompt waits. Before a step, the next waiting prompt `i` joins (`join(i)`
    returns its slot) when `due(step, i)`; `owner` maps slots to prompts (the rows already in the session included)."""
    out: dict[int, list[int]] = {}
    step = 0
    while session.running or waiting:
        if waiting and due(step, waiting[0]):
            i = waiting.pop(0)
            owner[join(i)] = i
        for slot, index, token, _ in session.step():
            got = out.setdefault(owner[slot], [])
            assert index == len(got)
            got.append(token)
        step += 1
        assert step < 200
    return out
