"""One registration per rule: a rule file registers its rule once in the core's table (`attention.register_rule`),
and the `sparse.*` methods are made from that table; `attention=<rule>` validates for ar.* and spec.* methods."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import fastdecode
from fastdecode import attention, registry
from fastdecode.attention import RULES, register_rule, rules
from fastdecode.config import build_config
from fastdecode.errors import ParameterError
from fastdecode.sparse.streaming import StreamingLLMConfig, StreamingLLMSelector

SPARSE = Path(fastdecode.__file__).parent / "sparse"


def test_every_sparse_method_is_made_from_its_rule():
    names = rules()
    assert names == sorted(["double", "duo", "lychee", "oracle", "quest", "snapkv", "streaming", "tidal"])
    methods = {m.name for m in fastdecode.methods() if m.name.startswith("sparse.")}
    assert methods == {f"sparse.{n}" for n in names}
    for name in names:
        rule, method = RULES[name], fastdecode.get_method(f"sparse.{name}")
        assert method.config is rule.config and method.description == rule.description != ""
        assert method.kind == "causal" and not method.lossless and not method.needs_draft
        # the method index (docs/methods.md) names the rule's file as the method's
        assert inspect.getsourcefile(method.driver) == inspect.getsourcefile(rule.selector)


def test_a_rule_file_registers_its_rule_once_and_no_method():
    for path in SPARSE.glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "@register(" not in source, path.name
        assert source.count("register_rule(\n") + source.count("register_rule(\"") <= 1, path.name
    with pytest.raises(ValueError, match="registered twice"):
        register_rule("quest", StreamingLLMSelector, StreamingLLMConfig, description="a second quest")


@dataclass(frozen=True)
class WindowConfig(StreamingLLMConfig):
    pass


@contextlib.contextmanager
def registered_rule(name: str) -> Iterator[str]:
    """A rule registered for one test (StreamingLLM under another name), removed again afterwards."""
    rules()  # the built-in rules first, so that this one is not loaded twice
    register_rule(name, StreamingLLMSelector, WindowConfig, description="A test rule: sinks and a window.")
    try:
        yield name
    finally:
        RULES.pop(name, None)
        registry._METHODS.pop(f"sparse.{name}", None)


def test_registering_a_rule_makes_its_method(causal):
    with registered_rule("test_window") as rule:
        method = fastdecode.get_method(f"sparse.{rule}")
        assert method.config is WindowConfig and method.description == "A test rule: sinks and a window."
        kw = dict(max_new_tokens=6, budget=8, sinks=2)
        ours = fastdecode.generate(causal, "the quick brown fox jumps over", f"sparse.{rule}", **kw)
        same = fastdecode.generate(causal, "the quick brown fox jumps over", "sparse.streaming", **kw)
        assert ours.token_ids == same.token_ids and ours.method == f"sparse.{rule}"
        # and the rule is an `attention=` value of every method that takes one
        build_config(fastdecode.get_method("ar.greedy").config, {"attention": f"{rule}:budget=8"})
    assert "test_window" not in RULES
    with pytest.raises(fastdecode.UnknownMethodError):
        fastdecode.get_method("sparse.test_window")


@pytest.mark.parametrize("method", ["ar.greedy", "ar.sample", "spec.pld", "spec.suffix", "spec.draft_model"])
def test_attention_parameter_validates_rules_and_their_parameters(method):
    config = fastdecode.get_method(method).config
    for ok in ("dense", "quest", "quest:budget=128,page=16", "streaming:budget=64"):
        assert build_config(config, {"attention": ok}).attention == ok
    for bad, why in [("nope", "Unknown attention rule 'nope'"), ("quest:page", "name=value"),
                     ("quest:pages=4", "Unknown parameter 'pages'"), ("dense:budget=4", "takes no parameters"),
                     ("quest:budget=0", "budget")]:
        with pytest.raises(ParameterError, match=why):
            build_config(config, {"attention": bad})


def test_a_lossless_method_takes_only_dense_attention():
    assert attention.parse_attention(" quest : budget=4 ") == ("quest", {"budget": "4"})
    fastdecode.get_method("spec.pld").check_attention(attention.DENSE)
    fastdecode.get_method("ar.sample").check_attention("tidal")  # not registered lossless: a sparse rule is its own
    with pytest.raises(ParameterError, match=r"use the method sparse\.tidal"):
        fastdecode.get_method("ar.greedy").check_attention("tidal:budget=64")
