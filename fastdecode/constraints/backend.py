"""The matcher interface every constraint backend implements, and the llguidance backend.

A backend compiles a grammar once per request (`Backend.compile`) into a `Grammar`; a `Grammar` starts any number
of `Matcher`s, one cursor over one token sequence each:

    m = grammar.start()
    m.allowed()            # [V] bool: the tokens the grammar allows next (EOS when the text may end here)
    m.advance(tokens)      # consume as many of `tokens` as the grammar allows; returns how many it took
    m.valid(tokens)        # how many of `tokens` the grammar allows in a row, consuming nothing
    m.rollback(n)          # forget the last n consumed tokens
    m.accepting            # the consumed text is a complete sentence of the grammar (EOS allowed next)

An EOS token counts as allowed where the text may end (the matcher then allows nothing more). A matcher that
fails (its engine enters an error state: a lexer over its size limits, no token that can continue the text) raises
`MatcherError` from whichever call saw it: a token it refuses means "off the grammar" upstream (a rejected draft,
left unmasked), so a failure read the same way would let the request decode free text.

Drivers never talk to a backend: they see the logits pipeline's `GrammarMask` (constraints/processor.py) and the
diffusion commit filters (constraints/diffusion.py). Another backend (xgrammar) implements `Backend` and `Matcher`.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import ParameterError


class ConstraintError(ParameterError):
    """A JSON schema, regular expression or grammar that cannot be compiled (raised before generation starts), or a
    matcher that failed during generation (`MatcherError`)."""


class MatcherError(ConstraintError):
    """The matcher failed mid-request: the request stops, since no mask could keep its text in the grammar."""

    def __init__(self, reason: str, consumed: int, advice: str, dead_end: bool = False) -> None:
        self.reason, self.consumed, self.dead_end = reason, consumed, dead_end  # dead_end: no token can continue
        super().__init__(f"The constraint's matcher failed at generated token {consumed + 1}: llguidance reports "
                         f"{reason!r}. The request was stopped rather than return text that breaks the constraint. "
                         f"To fix: {advice}.")


class Matcher(Protocol):
    @property
    def consumed(self) -> int: ...

    @property
    def accepting(self) -> bool: ...

    def allowed(self) -> torch.Tensor: ...

    def advance(self, tokens: list[int]) -> int: ...

    def valid(self, tokens: list[int]) -> int: ...

    def rollback(self, n: int) -> None: ...


class Grammar(Protocol):
    vocab_size: int
    compile_s: float

    @property
    def eos(self) -> list[int]: ...

    def start(self) -> Matcher: ...


class Backend(Protocol):
    name: str

    def compile(self, kind: str, text: Any, model: Any) -> Grammar: ...


# JSON as Python's json.dumps writes it (and the zoo's list answers read): ", " and ": ", no other whitespace
_JSON_STYLE: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_KINDS = {"json_schema": "JSON schema", "regex": "regular expression", "grammar": "grammar (Lark / EBNF)"}
_FIX = {
    "json_schema": "pass a valid JSON schema (a dict, or its JSON text)",
    "regex": "fix the regular expression (Rust regex syntax: https://docs.rs/regex)",
    "grammar": "fix the grammar (Lark syntax, with a `start` rule; GBNF is converted)",
}


# llguidance's stop reasons that mean "the grammar has no text left here", not a resource limit
_DEAD_END = ("NoExtensionBias", "NoExtension")


def _failure(inner: Any) -> tuple[str, str, bool] | None:
    """(reason, advice, dead end) when an LLMatcher is in its error state, else None."""
    if not inner.is_error():
        return None
    reason = (inner.get_error() or "").strip().splitlines()
    stop = str(inner.stop_reason() or "")
    text = reason[0] if reason else stop
    if stop in _DEAD_END or text in _DEAD_END:
        return ("no token can continue the text (NoExtensionBias)",
                "the constraint asks for text the model's tokenizer cannot write; change the constraint", True)
    if "lexer" in text.lower() or "too complex" in text.lower():
        return (text, "simplify the constraint: a bounded repeat as large as (a{1000}){1000} exceeds llguidance's "
                      "lexer limits; use smaller counts or + / *", False)
    return (text, "simplify the constraint, or generate without it", False)


class _LLMatcher:
    """One llguidance LLMatcher as a `Matcher`; every call checks llguidance's error state (`MatcherError`)."""

    def __init__(self, inner: Any, vocab_size: int, eos: list[int]) -> None:
        self.inner, self.vocab_size, self._n, self.eos = inner, vocab_size, 0, eos
        self._ended = False  # an EOS was taken: llguidance is not fed it (its rollback would not count it)

    @property
    def consumed(self) -> int:
        return self._n

    @property
    def accepting(self) -> bool:
        return bool(self.inner.is_accepting())

    def allowed(self) -> torch.Tensor:
        if self._ended:
            return torch.zeros(self.vocab_size, dtype=torch.bool)
        bits = np.frombuffer(self.inner.compute_bitmask(), dtype=np.uint8)
        self._check()  # in its error state llguidance allows EOS alone: an empty or cut text, not the grammar's
        mask = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        out = torch.from_numpy(mask)
        if out.numel() < self.vocab_size:  # the model has more rows than the tokenizer has tokens
            out = torch.cat([out, torch.zeros(self.vocab_size - out.numel(), dtype=torch.bool)])
        return out

    def advance(self, tokens: list[int]) -> int:
        if not tokens:
            return 0
        if self._ended:
            return 0
        tokens = [int(t) for t in tokens]
        stop = next((i for i, t in enumerate(tokens) if t in self.eos), len(tokens))
        n = int(self.inner.try_consume_tokens(tokens[:stop])) if stop else 0
        self._check()  # an error consumes nothing, which would read as a forbidden token
        if n == stop < len(tokens) and self.inner.is_accepting():
            self._ended = True  # EOS is kept here, never fed to llguidance (whose rollback would not count it)
            n += 1
        self._n += n
        return n

    def valid(self, tokens: list[int]) -> int:
        if not tokens or self._ended:
            return 0
        tokens = [int(t) for t in tokens]
        stop = next((i for i, t in enumerate(tokens) if t in self.eos), len(tokens))
        n = int(self.inner.validate_tokens(tokens[:stop])) if stop else 0
        self._check()
        if n == stop < len(tokens):  # EOS next: allowed where the text may end
            probe = self.inner.try_consume_tokens(tokens[:stop]) if stop else 0
            self._check()
            if probe == stop and self.inner.is_accepting():
                n += 1
            if probe:
                self.inner.rollback(probe)
        return n

    def rollback(self, n: int) -> None:
        if n > 0:
            assert n <= self._n, f"rollback of {n} tokens after only {self._n}"
            self._n -= n
            if self._ended:
                self._ended, n = False, n - 1
            ok = self.inner.rollback(n) if n else True
            self._check()
            assert ok, f"llguidance could not roll back {n} tokens: {self.inner.get_error()}"

    def _check(self) -> None:
        failed = _failure(self.inner)
        if failed is not None:
            reason, advice, dead_end = failed
            raise MatcherError(reason, self._n, advice, dead_end)


@dataclass
class LLGrammar:
    """A grammar compiled by llguidance for one tokenizer."""

    text: str  # llguidance's grammar definition
    tokenizer: Any  # LLTokenizer
    vocab_size: int
    compile_s: float  # schema / regex / grammar -> checked grammar, seconds

    @property
    def eos(self) -> list[int]:
        return list(self.tokenizer.eos_tokens)

    def start(self) -> Matcher:
        import llguidance

        inner = llguidance.LLMatcher(self.tokenizer, self.text, log_level=0)
        if inner.is_error():  # validated at compile time, so only resource limits end here
            raise ConstraintError(f"The constraint could not be started: {inner.get_error()}")
        return _LLMatcher(inner, self.vocab_size, list(self.tokenizer.eos_tokens))


# LLTokenizer per model tokenizer (building one reads the whole vocabulary: tens of ms for the zoo, ~1 s for 150k)
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _import() -> Any:
    try:
        import llguidance
    except ImportError:
        raise ConstraintError(
            "Constrained decoding needs the llguidance package: pip install 'fastdecode[constrain]' "
            "(or pip install 'llguidance>=1.9')."
        ) from None
    return llguidance


def lltokenizer(model: Any) -> Any:
    """The LLTokenizer of a model's tokenizer (a Hugging Face fast tokenizer, the zoo's included; other tokenizers
    through their decoded token bytes), with the model's vocabulary size and EOS ids."""
    llguidance = _import()
    tok = model.tokenizer
    if tok is None:
        raise ConstraintError(f"{model.name!r} has no tokenizer, which a constraint needs to know what each token "
                              "spells: load a model folder that has tokenizer files.")
    key = tok
    try:
        cached = _TOKENIZERS.get(key)
    except TypeError:
        cached = None
    if cached is not None and cached.vocab_size == model.vocab_size:
        return cached
    eos = sorted(model.eos_token_ids)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        from copy import copy

        inner = copy(backend)
        inner.no_padding()
        inner.no_truncation()
        made = llguidance.LLTokenizer(inner.to_str(), n_vocab=model.vocab_size, eos_token=eos)
    else:
        made = llguidance.LLTokenizer(_BytesTokenizer(model, eos[0]), n_vocab=model.vocab_size, eos_token=eos)
    try:
        _TOKENIZERS[key] = made
    except TypeError:
        pass
    return made


class _BytesTokenizer:
    """What llguidance's TokenizerWrapper reads, for a tokenizer without a Rust `tokenizers` backend."""

    def __init__(self, model: Any, eos: int) -> None:
        tok = model.tokenizer
        self.eos_token_id = eos
        self.bos_token_id = getattr(tok, "bos_token_id", None)
        specials = set(getattr(tok, "all_special_ids", []) or [])
        self.special_token_ids = sorted(specials)
        self.tokens = [b"" if i in specials else tok.decode([i]).encode("utf-8", "surrogatepass")
                       for i in range(min(len(tok), model.vocab_size))]
        self.is_tokenizer_wrapper = True
        self._tok = tok

    def __call__(self, s: str) -> list[int]:
        return list(self._tok.encode(s, add_special_tokens=False))


class LLGuidanceBackend:
    name = "llguidance"

    def compile(self, kind: str, text: Any, model: Any) -> LLGrammar:
        llguidance = _import()
        tokenizer = lltokenizer(model)
        t0 = time.perf_counter()
        try:
            if kind == "json_schema":
                # free whitespace lets a model that never saw JSON pad forever (a schema's x-guidance overrides)
                grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=_JSON_STYLE)
            elif kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(text)
            else:
                grammar = llguidance.grammar_from("grammar", text)
        except ValueError as e:
            raise ConstraintError(f"The {_KINDS[kind]} is not valid: {e}. To fix: {_FIX[kind]}.") from None
        bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if bad:
            msg = " ".join(messages).strip().replace("\n", " ")
            raise ConstraintError(f"The {_KINDS[kind]} is not valid: {msg} To fix: {_FIX[kind]}.")
        compiled = LLGrammar(grammar, tokenizer, model.vocab_size, 0.0)
        probe = compiled.start()  # the matcher's own construction compiles the lexer: part of the compile time
        try:
            first = probe.allowed()
        except MatcherError as e:  # e.g. the regex [^\s\S]: refused here as an unsatisfiable schema is
            what = (f"it is unsatisfiable (no text the tokenizer of {model.name!r} can write matches it)" if e.dead_end
                    else f"llguidance fails before its first token ({e.reason})")
            raise ConstraintError(f"The {_KINDS[kind]} is not valid: {what}. To fix: {_FIX[kind]}.") from None
        compiled.compile_s = time.perf_counter() - t0
        if not bool(first.any()):
            raise ConstraintError(f"The {_KINDS[kind]} allows no token at all for {model.name!r}'s tokenizer: "
                                  f"{_FIX[kind]}.")
        return compiled
