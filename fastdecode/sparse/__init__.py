"""Long-context sparse decoding (`sparse.*`): each decode step reads a budget of cached key/value columns per head.

Every rule is one file with a `Selector` subclass (`base.py`: the hook, the always-kept sinks and recent window,
the budget, the read accounting) that registers itself once, in the core's rule table:
`register_rule("quest", QuestSelector, QuestConfig, description=...)` (`fastdecode.attention`). That makes it

- usable by any method with an `attention` parameter that is not registered lossless: `attention="quest"` or with
  the rule's parameters, `attention="quest:budget=128,page=16"` (ar.sample; ar.greedy and the lossless spec.* methods
  refuse a rule and name sparse.<rule> or spec.sparse_self instead);
- a method `sparse.<rule>` (`methods.py`, made from the table): ar.greedy (temperature 0, the default) or ar.sample
  (temperature > 0) whose forwards read the columns the rule selects.
"""

from __future__ import annotations

from ..attention import on_rule, register_rule
from .base import Selector, SparseConfig
from .methods import method_of, sparse_decode

on_rule(method_of)  # every rule registered, now or later, becomes the method sparse.<rule>

__all__ = ["Selector", "SparseConfig", "register_rule", "sparse_decode"]
