"""A constraint is never dropped silently (issue #29): a matcher that fails stops the request on every family
instead of decoding free text; an unsatisfiable regex is refused at compile time; output cut by max_new_tokens
before the constraint is complete says so (`Result.constraint_complete`); GAD on a greedy method is refused."""

from __future__ import annotations

import pytest
from constraint_cases import CONSTRAINTS, REGEX

import fastdecode
from fastdecode import constraints
from fastdecode.constraints import ConstraintError, MatcherError
from fastdecode.constraints.backend import _LLMatcher

HUGE = "(a{1000}){1000}"  # llguidance's lexer gives up at the first token: "too many expressions constructed"


class NoForward:
    """Fails the test if the model is ever run."""

    def __init__(self, model) -> None:
        self.model = model

    def __enter__(self):
        self.saved = self.model.forward
        self.model.forward = lambda *a, **k: pytest.fail("the model ran before the constraint was refused")

    def __exit__(self, *exc):
        self.model.forward = self.saved


# --- a matcher that fails stops the request

class _Failed:
    """An llguidance matcher in its error state: it consumes nothing and allows EOS alone, as the real one does."""

    def is_error(self) -> bool:
        return True

    def get_error(self) -> str:
        return "lexer error: too many expressions constructed\n<state>...</state>"

    def stop_reason(self) -> str:
        return "LexerTooComplex"

    def compute_bitmask(self) -> bytes:
        return b"\x02" + b"\x00" * 39

    def try_consume_tokens(self, tokens) -> int:
        return 0

    def validate_tokens(self, tokens) -> int:
        return 0

    def is_accepting(self) -> bool:
        return False

    def rollback(self, n: int) -> bool:
        return False


@pytest.mark.parametrize("call", ["allowed", "advance", "valid"])
def test_every_matcher_call_checks_the_error_state(call):
    m = _LLMatcher(_Failed(), 320, [1])
    args = {"allowed": (), "advance": ([5, 6],), "valid": ([5, 6],)}[call]
    with pytest.raises(MatcherError, match="too many expressions") as err:
        getattr(m, call)(*args)
    assert "To fix" in str(err.value) and "<state>" not in str(err.value)
    assert isinstance(err.value, ConstraintError) and err.value.consumed == 0


@pytest.fixture(scope="module")
def huge_causal(causal):
    return constraints.regex(HUGE).compile(causal)


@pytest.mark.parametrize("method, params", [
    ("ar.greedy", {}), ("ar.sample", {"seed": 0}), ("spec.pld", {}), ("hf.greedy", {}),
])
def test_a_failed_matcher_stops_causal_methods(causal, huge_causal, method, params):
    """Before: the failure read as 'off the grammar', the position was left unmasked and the text broke it."""
    with pytest.raises(MatcherError, match="too many expressions") as err:
        fastdecode.generate(causal, "the quick", method, max_new_tokens=8, constraint=huge_causal, **params)
    assert "stopped rather than return text that breaks the constraint" in str(err.value)


@pytest.mark.parametrize("rule", ["lave", "prefix"])
def test_a_failed_matcher_stops_dlm_methods(diffusion, rule):
    with pytest.raises(MatcherError, match="too many expressions"):
        fastdecode.generate(diffusion, "the quick", "dlm.threshold", max_new_tokens=8,
                            constraint=constraints.regex(HUGE, diffusion=rule))


# --- an unsatisfiable regex is refused like an unsatisfiable schema

@pytest.mark.parametrize("bad, words", [
    (constraints.regex(r"[^\s\S]"), "regular expression is not valid: it is unsatisfiable"),
    (constraints.json_schema({"type": "integer", "minimum": 5, "maximum": 1}), "JSON schema is not valid: Unsat"),
])
def test_unsatisfiable_constraints_fail_before_generation(causal, bad, words):
    with NoForward(causal), pytest.raises(ConstraintError, match=words) as err:
        fastdecode.generate(causal, "the quick", "ar.greedy", constraint=bad)
    assert "To fix" in str(err.value)


# --- output cut before the constraint is complete says so

def test_output_cut_before_the_constraint_is_complete_says_so(causal, diffusion):
    compiled = CONSTRAINTS["regex"].compile(causal)
    cut = fastdecode.generate(causal, "the quick", "ar.greedy", max_new_tokens=3, constraint=compiled)
    assert cut.constraint_complete is False and cut.stats.finish_reason == "length"
    whole = fastdecode.generate(causal, "the quick", "spec.pld", max_new_tokens=40, constraint=compiled)
    assert whole.constraint_complete is True and whole.stats.finish_reason == "eos"
    assert fastdecode.generate(causal, "the quick", "ar.greedy", max_new_tokens=3).constraint_complete is None
    # a text the grammar accepts is complete even when the budget, not EOS, ended it
    letters = fastdecode.generate(causal, "the quick", "ar.greedy", max_new_tokens=3,
                                  constraint=constraints.regex("[a-z]+"))
    assert letters.constraint_complete is True and letters.stats.finish_reason == "length"
    words = constraints.regex(REGEX.replace("{0,4}", "{4}"), diffusion="prefix")  # five words: never in 4 tokens
    dlm = fastdecode.generate(diffusion, "the quick", "dlm.threshold", max_new_tokens=4, constraint=words)
    assert dlm.constraint_complete is False


# --- GAD on a greedy method is refused before the first step

@pytest.mark.parametrize("method, params", [
    ("ar.greedy", {}), ("spec.pld", {}), ("ar.sample", {"temperature": 0.0}), ("hf.greedy", {}),
])
def test_gad_on_a_greedy_method_is_refused(causal, method, params):
    gad = constraints.regex(REGEX, sampling="gad")
    with NoForward(causal), pytest.raises(ConstraintError, match="Grammar-Aligned Decoding.*greedily"):
        fastdecode.generate(causal, "the quick", method, constraint=gad, **params)


def test_gad_on_a_sampled_spec_method_runs(causal, check_valid):
    compiled = constraints.regex(REGEX, sampling="gad").compile(causal)
    r = fastdecode.generate(causal, "the quick", "spec.pld", temperature=0.8, seed=1, max_new_tokens=40,
                            constraint=compiled)
    assert check_valid(causal, compiled, r.token_ids)
