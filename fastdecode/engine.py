"""generate() / stream(): resolve the method, run its driver, collect step events into Results."""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from os import PathLike
from typing import Any, Union, overload

import torch

from .config import build_config
from .errors import ArgumentError, IncompatibleMethodError, MissingDependencyError, PromptError
from .models.base import ModelAdapter
from .models.guided import check_image_prompts, guide, image_params
from .registry import Method, RunContext, get_method, list_methods
from .speculative.memory import DrafterMemory
from .stats import Stats, peak_rss_mb
from .types import Event, Finished, PromptBatch, Result, StepEvent

Prompt = Union[str, Sequence[int]]


def stream(
    model: ModelAdapter,
    prompts: Prompt | Sequence[Prompt],
    method: str = "ar.greedy",
    *,
    generator: torch.Generator | None = None,
    draft: ModelAdapter | None = None,
    memory: DrafterMemory | None = None,
    trace: bool = False,
    constraint: Any = None,
    should_stop: Callable[[], bool] | None = None,
    **params: Any,
) -> Iterator[Event]:
    """Yield one `StepEvent` per driver step, then a `Finished` event holding one `Result` per prompt.

    Validation (method, parameters, prompts) happens before the first event, so errors surface at once.
    `memory` is what drafters that learn across requests (spec.suffix, spec.recycling) read and extend; by default
    the model's own, shared by every call on it (`fastdecode.speculative.memory`). `constraint` (a
    `fastdecode.constraints` JSON schema / regex / grammar) is compiled here, before the first step. `should_stop`
is for a caller that may stop wanting the rows mid-run (the server): a method that runs another runtime's loop to
completion (`llamacpp.*`) asks it before each forward and ends its rows there when it says True.
    """
    _check_model(model, "model")
    if draft is not None:
        _check_model(draft, "draft=")
    if not isinstance(method, str):
        raise ArgumentError("method must be a method name such as 'ar.greedy' (see fastdecode.methods()), "
                            f"not {type(method).__name__}.")
    spec = resolve(model, method, constraint)
    check_draft(spec, model, draft)
    # classifier-free guidance lives in the image model's forward, below every driver (models/guided.py); on a text
    # model `cfg_scale` is the method's own where it has one (dlm.baseline: LLaDA's guidance of a masked canvas)
    if getattr(model, "image", None) is not None or "cfg_scale" not in {f.name for f in fields(spec.config)}:
        model = guide(model, params.pop("cfg_scale", None))
    params = image_params(model, params)
    cfg = build_config(spec.config, params, method)
    spec.check_attention(getattr(cfg, "attention", None))  # a lossless method stays lossless
    if constraint is not None:
        from .constraints import check_sampling

        check_sampling(constraint, spec.name, cfg)
    image = getattr(model, "image", None)  # an image model's prompt is one class token, checked before the length
    batch = encode_batch(model, prompts, None if image is not None else cfg.max_new_tokens)
    check_image_prompts(model, batch)
    compiled = compile_constraint(model, constraint)
    ctx = RunContext(generator=generator, draft=draft, memory=memory, constraint=compiled,
                     should_stop=should_stop)
    return _run(model, spec, cfg, batch, ctx, trace)


@overload
def generate(model: ModelAdapter, prompts: Prompt, method: str = ..., **kwargs: Any) -> Result: ...


@overload
def generate(model: ModelAdapter, prompts: Sequence[Prompt], method: str = ..., **kwargs: Any) -> list[Result]: ...


def generate(
    model: ModelAdapter,
    prompts: Prompt | Sequence[Prompt],
    method: str = "ar.greedy",
    **kwargs: Any,
) -> Result | list[Result]:
    """Run `method` on one prompt (returns a Result) or a list of prompts (returns a list of Results).

    Prompts are text or token-id lists; keyword arguments are the method's parameters (see
    `fastdecode methods`) plus `generator=`, `draft=`, `memory=`, `trace=` and `constraint=`. For an image model
    (docs/image.md) the prompt is a class label ("7"), `cfg_scale=` sets classifier-free guidance (default: the
    model's image.json) and each Result's `image` holds the picture.
    """
    results: list[Result] = []
    for event in stream(model, prompts, method, **kwargs):
        if isinstance(event, Finished):
            results = event.results
    return results if _is_batch(_plain(prompts)) else results[0]


def compile_constraint(model: ModelAdapter, constraint: Any) -> Any:
    """The request's constraint compiled against the model's tokenizer (None without one). Whether the method can
    apply it is `resolve`'s check, made before this."""
    from .constraints import Compiled, as_constraint

    given = as_constraint(constraint)
    if given is None or isinstance(given, Compiled):
        return given
    return given.compile(model)


def _check_model(model: Any, what: str) -> None:
    """A loaded model, or an object that acts as one (an adapter of one's own: a `kind` and a `forward`)."""
    if isinstance(model, ModelAdapter):
        return
    if getattr(model, "kind", None) in ("causal", "diffusion") and callable(getattr(model, "forward", None)):
        return
    hint = (f"call fastdecode.load({str(model)!r}) and pass what it returns" if isinstance(model, (str, PathLike))
            else "load one with fastdecode.load(path or 'zoo:NAME')")
    raise ArgumentError(f"{what} must be a model from fastdecode.load(), not {type(model).__name__}: {hint}.")


def resolve(model: ModelAdapter, name: str, constraint: Any = None) -> Method:
    """The registered method `name`, refused (with the fix) if it does not fit the model, cannot apply the given
    constraint, or needs an optional package that is missing, in that order: a user is never told to install a
    package for a method that would then refuse the request anyway."""
    spec = get_method(name)
    if spec.kind != model.kind:
        fitting = ", ".join(m.name for m in list_methods(model.kind))
        raise IncompatibleMethodError(
            f"Method {name!r} needs a {spec.kind} model, but {model.name!r} is a {model.kind} model. "
            f"Methods that fit it: {fitting}."
        )
    if spec.images_only and getattr(model, "image", None) is None:
        fitting = ", ".join(m.name for m in list_methods(model.kind) if not m.images_only)
        raise IncompatibleMethodError(
            f"Method {name!r} works on image models only (it reads the image's code grid or codebook), but "
            f"{model.name!r} is a text model. Methods that fit it: {fitting}."
        )
    if constraint is not None:
        from .constraints import Compiled, as_constraint, support

        given = as_constraint(constraint)
        if given is not None:
            support.check(spec, given.constraint if isinstance(given, Compiled) else given)
    missing = spec.missing()
    if missing:
        raise MissingDependencyError(
            f"Method {name!r} needs {', '.join(missing)}, which is not installed: pip install "
            + " ".join(f"'{m}'" for m in missing) + " (an optional extra, never required by the rest of fastdecode)."
        )
    return spec


# the kind of draft model a method names (Method.draft_kind): what it is, and a zoo example for the zoo:ar-small target
_DRAFT_KINDS = {"causal": ("a causal LM", "zoo:ar-tiny"), "diffusion": ("a masked-diffusion LM", "zoo:dlm-small")}


def check_draft(spec: Method, model: ModelAdapter, draft: ModelAdapter | None) -> None:
    """A method that takes a draft needs one: of the kind it drafts with, with the target's vocabulary, on its
    device."""
    if not spec.needs_draft:
        return
    kind, example = _DRAFT_KINDS[spec.draft_kind]
    if draft is None:
        raise IncompatibleMethodError(
            f"Method {spec.name!r} needs a draft model: pass draft=fastdecode.load(...) (CLI: --draft PATH), "
            f"{kind} trained with the target's tokenizer, e.g. --draft {example} for zoo:ar-small."
        )
    if draft.kind != spec.draft_kind:
        raise IncompatibleMethodError(
            f"The draft model of {spec.name!r} must be {kind}, not a {draft.kind} model: pass one trained with the "
            f"target's tokenizer, e.g. --draft {example} for zoo:ar-small."
        )
    if draft.vocab_size != model.vocab_size or not _same_tokens(model, draft):
        differs = (f"vocabulary ({draft.vocab_size} tokens) differs from the target's ({model.vocab_size})"
                   if draft.vocab_size != model.vocab_size else "tokenizer gives some of the target's tokens other ids")
        raise IncompatibleMethodError(
            f"The draft's {differs}; {spec.name!r} needs the same tokenizer: "
            "pick a draft trained with the target's tokenizer."
        )
    if draft.device != model.device:
        raise IncompatibleMethodError(
            f"The draft model is on {draft.device} but the target is on {model.device}: load both on the same device."
        )


def _same_tokens(model: ModelAdapter, draft: ModelAdapter) -> bool:
    """Every token of the target's tokenizer has the same id in the draft's (which may add some, e.g. a mask token)."""
    if model.tokenizer is None or draft.tokenizer is None:
        return True  # nothing to compare beyond the vocabulary size
    theirs = draft.tokenizer.get_vocab()
    return all(theirs.get(token) == i for token, i in model.tokenizer.get_vocab().items())


def _plain(prompts: Any) -> Any:
    """A tensor of token ids as (nested) lists, so that one set of rules reads every prompt."""
    return prompts.tolist() if isinstance(prompts, torch.Tensor) else prompts


def _is_batch(prompts: Any) -> bool:
    return isinstance(prompts, (list, tuple)) and len(prompts) > 0 and not isinstance(prompts[0], numbers.Integral)


def _token_ids(model: ModelAdapter, prompt: Any, where: str) -> list[int]:
    """A prompt (text or token ids) as token ids, refusing what is neither, with the fix in the message."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise PromptError(f"{where} is empty: pass some text to continue.")
        bad = next((i for i, c in enumerate(prompt) if 0xD800 <= ord(c) <= 0xDFFF), None)
        if bad is not None:  # lone surrogates: bytes that were not UTF-8 (argv, files read with surrogateescape)
            raw = ord(prompt[bad])
            byte = f"byte 0x{raw - 0xDC00:02x}" if 0xDC80 <= raw <= 0xDCFF else f"surrogate U+{raw:04X}"
            raise PromptError(f"{where} is not UTF-8 text ({byte} at character {bad}): convert it to UTF-8 first "
                              "(e.g. iconv -f latin1 -t utf-8), or pass token ids.")
        return model.encode(prompt)
    if isinstance(prompt, (bytes, bytearray)):
        raise PromptError(f"{where} is bytes: decode it to text first (prompt.decode('utf-8')), "
                          "or pass a list of token ids.")
    if not isinstance(prompt, (list, tuple)):
        raise PromptError(f"{where} is {type(prompt).__name__}, not text or a list of token ids: pass a string, "
                          "a list of ints, or a list of those for a batch.")
    if not prompt:
        raise PromptError(f"{where} has no tokens: pass at least one token id.")
    vocab = model.vocab_size
    for j, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise PromptError(f"{where}: the item at position {j} is {type(t).__name__}, not a token id; "
                              "a prompt is text or a list of ints.")
        if not 0 <= int(t) < vocab:
            raise PromptError(f"{where}: token id {int(t)} at position {j} is outside the vocabulary "
                              f"(0 to {vocab - 1}) of {model.name!r}: encode the prompt with this model's tokenizer.")
    return [int(t) for t in prompt]


def encode_batch(model: ModelAdapter, prompts: Prompt | Sequence[Prompt], max_new_tokens: int | None) -> PromptBatch:
    """Check, tokenise and left-pad the prompts; with a `max_new_tokens` budget, each prompt and the budget must fit
    the model's positions (None: the caller checks the context itself, as the server does)."""
    prompts = _plain(prompts)
    if isinstance(prompts, (list, tuple)) and not prompts:
        raise PromptError("No prompts given: pass a prompt (text or a list of token ids) "
                          "or a non-empty list of prompts.")
    items = list(prompts) if _is_batch(prompts) else [prompts]
    rows = []
    for i, p in enumerate(items):
        where = f"Prompt {i}" if len(items) > 1 else "The prompt"
        ids = _token_ids(model, p, where)
        limit = model.max_positions
        if limit is not None and max_new_tokens is not None and len(ids) + max_new_tokens > limit:
            fix = (f"Shorten the prompt or lower max_new_tokens to at most {limit - len(ids)}" if len(ids) < limit
                   else f"Shorten the prompt to at most {limit - 1} tokens, or use a model with a longer context")
            raise PromptError(
                f"{where} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} that makes "
                f"{len(ids) + max_new_tokens}, more than the model's {limit} positions. {fix}."
            )
        rows.append(ids)
    width = max(len(r) for r in rows)
    pad = model.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return PromptBatch(input_ids, mask, tuple(len(r) for r in rows))


class _Collector:
    """Accumulates step events into per-row outputs and counts."""

    def __init__(self, batch: PromptBatch) -> None:
        B = batch.size
        self.out: list[dict[int, int]] = [{} for _ in range(B)]
        self.stats = [Stats(prompt_tokens=n) for n in batch.lengths]
        self.done = [False] * B
        self.trace: list[list[StepEvent]] = [[] for _ in range(B)]

    def add(self, ev: StepEvent, trace: bool) -> None:
        for b, st in enumerate(self.stats):
            if self.done[b]:
                continue
            st.forwards += ev.forwards
            st.draft_forwards += ev.draft_forwards
            if ev.proposed:
                st.proposed += ev.proposed[b]
            if ev.draft_s:
                st.draft_s += ev.draft_s[b]
                st.verify_s += ev.verify_s[b]
            if ev.accepted:
                st.accepted += ev.accepted[b]
                per_pos = st.accepted_per_position
                per_pos.extend([0] * (ev.accepted[b] - len(per_pos)))
                for k in range(ev.accepted[b]):
                    per_pos[k] += 1
            for offset, token in ev.tokens[b]:
                self.out[b][offset] = token
            if trace:
                self.trace[b].append(ev)
            if ev.finished and ev.finished[b]:
                self.done[b] = True


def _run(
    model: ModelAdapter, spec: Method, cfg: Any, batch: PromptBatch, ctx: RunContext, trace: bool
) -> Iterator[Event]:
    collector = _Collector(batch)
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(model.device)
        torch.cuda.synchronize(model.device)
    start = time.perf_counter()
    for event in spec.driver(model, batch, cfg, ctx):
        collector.add(event, trace)
        yield event
    if cuda:
        torch.cuda.synchronize(model.device)
    wall = time.perf_counter() - start
    results = []
    eos = model.eos_token_ids
    for b, st in enumerate(collector.stats):
        ids = _until_eos([collector.out[b][k] for k in sorted(collector.out[b])], eos)
        st.new_tokens = len(ids)
        st.finish_reason = "eos" if ids and ids[-1] in eos else "length"
        st.wall_s = wall
        st.peak_rss_mb = peak_rss_mb()
        st.peak_device_mb = torch.cuda.max_memory_allocated(model.device) / 2**20 if cuda else 0.0
        text = model.decode([t for t in ids if t not in eos]) if model.tokenizer is not None else ""
        complete = ctx.constraint.complete(ids) if ctx.constraint is not None else None
        results.append(Result(ids, text, st, spec.name, batch.row(b), collector.trace[b] if trace else None,
                              complete, _picture(model, ids)))
    yield Finished(results)


def _picture(model: ModelAdapter, ids: list[int]) -> Any:
    """An image model's output decoded to pixels, uint8 [H, W] (None for a text model or an incomplete image)."""
    image = getattr(model, "image", None)
    if image is None or len(ids) != image.tokens:
        return None
    return image.decode(torch.tensor([ids]))[0]


def _until_eos(ids: list[int], eos: frozenset[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids
