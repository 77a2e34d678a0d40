"""`Constraint`: what `generate(..., constraint=...)` takes, and its per-request compiled form.

    from fastdecode import constraints
    c = constraints.json_schema({"type": "object", ...})     # or constraints.regex(r"..."), constraints.grammar(lark)
    fastdecode.generate(model, prompt, "spec.pld", constraint=c)

The constraint is compiled once per request against the model's tokenizer (`Constraint.compile`), before the first
step, so a bad schema, regex or grammar fails at once with a `ConstraintError` that says how to fix it.
`sampling="gad"` turns on Grammar-Aligned Decoding (ASAp, Park et al. 2024): the sampled distribution converges,
over repeated calls with the same `Constraint` object, to the model's distribution conditioned on the grammar,
instead of the biased one plain masking gives (see docs/constraints.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from .backend import Backend, ConstraintError, Grammar, LLGuidanceBackend

Kind = Literal["json_schema", "regex", "grammar"]
Sampling = Literal["mask", "gad"]
DiffusionRule = Literal["lave", "prefix"]
LaveSearch = Literal["sample", "beam"]


@dataclass(eq=False)
class Constraint:
    """A JSON schema, a regular expression or a grammar (Lark, or GBNF/EBNF) the output must match."""

    kind: Kind
    text: Any  # the schema (dict or JSON text), the regex, or the grammar text
    sampling: Sampling = "mask"  # "gad": Grammar-Aligned Decoding (ASAp) for sampled methods
    diffusion: DiffusionRule = "lave"  # dlm.*: lookahead-then-verify, or the left-to-right prefix rule
    lookahead: int = 10  # LAVE: sampled completions checked per proposed token
    retries: int = 5  # LAVE: tries a proposal gets (a rejected token is banned and the next likeliest tried),
    #   after which the step recovers from the cached witness (the authors' max_retry_num_total)
    lave_search: LaveSearch = "sample"  # LAVE's lookahead: `lookahead` sampled fillings, or the authors' beam
    beam_top_k: int = 5  # lave_search="beam": candidate tokens per mask (top_k_per_mask)
    beam_width: int = 3  # lave_search="beam": best-scoring fillings kept per mask (top_n_beam)
    beam_random: int = 3  # lave_search="beam": other fillings kept at random per mask (random_n_beam)
    backend: Backend = field(default_factory=LLGuidanceBackend)
    # GAD's tries of expected future grammaticality, one per model (they persist across calls: ASAp learns)
    _gad: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in ("json_schema", "regex", "grammar"):
            raise ConstraintError(f"Constraint kind {self.kind!r} is unknown: use 'json_schema', 'regex' or 'grammar'.")
        if self.sampling not in ("mask", "gad"):
            raise ConstraintError(f"constraint sampling={self.sampling!r} is unknown: use 'mask' (plain masking) or "
                                  "'gad' (Grammar-Aligned Decoding).")
        if self.diffusion not in ("lave", "prefix"):
            raise ConstraintError(f"constraint diffusion={self.diffusion!r} is unknown: use 'lave' "
                                  "(lookahead-then-verify) or 'prefix' (left-to-right prefix rule).")
        if not isinstance(self.lookahead, int) or self.lookahead < 1:
            raise ConstraintError(f"constraint lookahead={self.lookahead!r} is invalid: use an int >= 1.")
        if not isinstance(self.retries, int) or self.retries < 1:
            raise ConstraintError(f"constraint retries={self.retries!r} is invalid: use an int >= 1 (tries a LAVE "
                                  "proposal gets before the step recovers from its witness).")
        if self.lave_search not in ("sample", "beam"):
            raise ConstraintError(f"constraint lave_search={self.lave_search!r} is unknown: use 'sample' (sampled "
                                  "fillings) or 'beam' (the LAVE authors' beam lookahead).")
        for name in ("beam_top_k", "beam_width"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConstraintError(f"constraint {name}={getattr(self, name)!r} is invalid: use an int >= 1.")
        if not isinstance(self.beam_random, int) or self.beam_random < 0:
            raise ConstraintError(f"constraint beam_random={self.beam_random!r} is invalid: use an int >= 0.")
        if self.kind == "json_schema":
            if isinstance(self.text, str):
                try:
                    self.text = json.loads(self.text)
                except json.JSONDecodeError as e:
                    raise ConstraintError(f"The JSON schema is not valid JSON ({e}): pass a dict or JSON text."
                                          ) from None
            if not isinstance(self.text, (dict, bool)):
                raise ConstraintError(f"A JSON schema is a dict (or JSON text of one), not {type(self.text).__name__}.")
        elif not isinstance(self.text, str) or not self.text:
            raise ConstraintError(f"A {self.kind} constraint is a non-empty string, not {self.text!r}.")

    @property
    def gad(self) -> bool:
        return self.sampling == "gad"

    def compile(self, model: Any) -> Compiled:
        """Compile against `model`'s tokenizer (raises ConstraintError on a bad schema / regex / grammar)."""
        grammar = self.backend.compile(self.kind, self.text, model)
        key = (getattr(model, "name", ""), model.vocab_size, id(model))
        trie = self._gad.setdefault(key, {}) if self.gad else None
        return Compiled(self, grammar, trie)


@dataclass(eq=False)
class Compiled:
    """A constraint compiled for one request, and what it cost: compile time, mask time and mask count."""

    constraint: Constraint
    grammar: Grammar
    gad_trie: dict[Any, Any] | None = None
    mask_s: float = 0.0  # seconds computing masks (and LAVE / prefix checks on diffusion canvases)
    masks: int = 0  # masks computed
    calls: int = 0  # logits batches (forwards) the mask was applied to

    @property
    def eos(self) -> list[int]:
        return list(getattr(self.grammar, "eos", []))

    @property
    def compile_s(self) -> float:
        return self.grammar.compile_s

    def processor(self) -> Any:
        from .processor import GrammarMask

        return GrammarMask(self)

    def complete(self, ids: Sequence[int]) -> bool:
        """Whether `ids` (through EOS) is a whole sentence of the grammar, not a prefix that max_new_tokens cut
        (`Result.constraint_complete`)."""
        matcher = self.grammar.start()
        return matcher.advance([int(t) for t in ids]) == len(ids) and matcher.accepting


def check_sampling(constraint: Any, method: str, config: Any) -> None:
    """Refuse GAD where nothing is sampled: ASAp corrects the law of sampled outputs, and a greedy method
    (temperature 0, or none to set) has no law to correct, only an argmax that the reweighting would move."""
    given = as_constraint(constraint)
    plain = given.constraint if isinstance(given, Compiled) else given
    if plain is not None and plain.gad and not float(getattr(config, "temperature", 0.0)) > 0:
        raise ConstraintError(
            f"Grammar-Aligned Decoding (sampling='gad', --constraint-sampling gad) corrects the distribution a "
            f"sampled method draws from, but {method!r} decodes greedily here (temperature 0): use sampling='mask' "
            "(the default), or sample: ar.sample, or a spec.* / sparse.* method with temperature > 0."
        )


def json_schema(schema: dict[str, Any] | str | bool, **options: Any) -> Constraint:
    """Output must be JSON matching `schema` (a dict or its JSON text)."""
    return Constraint("json_schema", schema, **options)


def regex(pattern: str, **options: Any) -> Constraint:
    """Output must match the regular expression as a whole (Rust regex syntax)."""
    return Constraint("regex", pattern, **options)


def grammar(text: str, **options: Any) -> Constraint:
    """Output must be a sentence of the grammar (Lark syntax with a `start` rule, or GBNF)."""
    return Constraint("grammar", text, **options)


def from_file(kind: Kind, path: str | PathLike[str], **options: Any) -> Constraint:
    """A schema or grammar read from a file (the CLI's --constraint-json-schema / --constraint-grammar)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConstraintError(f"Cannot read the {kind.replace('_', ' ')} file {str(path)!r}: {e.strerror}.") from None
    return Constraint(kind, text, **options)


def as_constraint(value: Any) -> Constraint | Compiled | None:
    """What `constraint=` accepts: None, a Constraint, a Compiled one, or {"json_schema"|"regex"|"grammar": ...}."""
    if value is None or isinstance(value, (Constraint, Compiled)):
        return value
    if isinstance(value, dict) and len(value) >= 1:
        kinds: list[Kind] = [k for k in ("json_schema", "regex", "grammar") if k in value]
        if len(kinds) == 1:
            options = {k: v for k, v in value.items() if k != kinds[0]}
            return Constraint(kinds[0], value[kinds[0]], **options)
    raise ConstraintError(
        "constraint= takes fastdecode.constraints.json_schema(schema) / regex(pattern) / grammar(text), or a dict "
        f"{{'json_schema': ...}} / {{'regex': ...}} / {{'grammar': ...}}, not {type(value).__name__}."
    )
