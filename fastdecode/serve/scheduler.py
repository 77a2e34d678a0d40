"""The engine thread: one thread owns the model and runs every generation; HTTP handlers only queue requests.

Batching: requests wait in one bounded queue. When the engine is free it waits a short window (`window_s`) for
more, then takes the oldest request and every queued request with the same method and parameters (up to
`max_batch` rows).

- A method that declares a session (`register(..., session=...)`: ar.greedy, ar.sample and the spec.* methods whose
  rows all verify over one preallocated cache), unseeded, on a model with fastdecode's preallocated KV cache, runs as
  **continuous batching** through the `session.Session` its factory makes: one forward per step for every running
  row, and between steps requests with the same method and parameters that arrived meanwhile JOIN the running batch
  (their prompts prefilled in a forward of their own, their keys and values copied into free slots), as long as
  slots are free (`max_batch` rows) and the oldest waiting request is one of them (an incompatible request at the
  head of the queue stops further joins, so it runs as soon as the batch drains). A row LEAVES at once when it
  finishes (EOS, max_tokens, a stop string), is cancelled (client gone) or times out: its slot is freed and is
  padding in later forwards.
- Every other method (`hf.*`, diffusion, a spec.* drafter on the target's own cache), a request with a sparse
  attention rule, seeded sampling, and models on transformers' own cache run as one batch to completion through
  `fastdecode.stream()` (`spec.*` with every row verified in the same target forward); a request that arrives
  meanwhile waits for the next batch. A row that left still rides along in the batched forward until every row has
  left (the drivers have no API to drop a row mid-run), which costs compute but never changes another row's output.
  A method that runs its own loop to completion is stopped at its next model forward once every request of its
  batch has been cancelled or timed out, instead of after its last token: `hf.*` by a forward pre-hook on the torch
  model, `llamacpp.*` (whose loop never enters torch) by `stream(..., should_stop=)`.

A row's tokens never depend on its batch companions, so greedy outputs equal `fastdecode.generate()` for the same
prompt and method; seeded sampling requests run as a batch of their own (their `n` rows), so a seed repeats
whatever else the server is doing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..attention import is_dense
from ..config import build_config
from ..engine import encode_batch, resolve, stream
from ..errors import FastDecodeError
from ..models.base import ModelAdapter
from ..models.causal import CausalLM
from ..registry import RunContext, get_method
from ..session import Session
from ..types import Finished
from .metrics import Metrics
from .protocol import ServeError
from .scoring import Entry, token_logprobs

Sink = Callable[[tuple], None]  # receives the request's events; must be thread-safe


class _Abandoned(Exception):
    """Raised from a forward hook when every request of a batch was cancelled or timed out: it stops a method that
    runs its own loop to completion (`hf.*` calls transformers' generate(), whose steps come back only at its end)."""


def _gone(req: Request) -> str:
    """Why a request that is no longer wanted ended: "cancelled" (its client left) or "timeout"."""
    return "cancelled" if req.cancelled else "timeout"


@dataclass
class Request:
    """A validated request: token-id prompts, the method and its parameters (already checked by `build_config`)."""

    prompts: list[list[int]]
    n: int
    method: str
    params: dict[str, Any]
    config: dict[str, Any]  # the method's full config (for grouping requests that can share a batch)
    sink: Sink
    stops: list[str] = field(default_factory=list)
    logprobs: int | None = None  # top-k alternatives to report with each token's log-probability; None: none
    echo: bool = False  # score the prompt's tokens too (logprobs of prompt + output)
    # a stream asking for prompt_logprobs: they are sent with each row's first chunk (a "prompt" event), not at its end
    prompt_first: bool = False
    timeout_s: float | None = None
    sampled_with_seed: bool = False
    constraint: Any = None  # a fastdecode.constraints.Constraint (response_format), or None
    created: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    answered_first: bool = False  # a row of it has delivered its first token (time to first token: per request)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    def key(self) -> Any:
        if self.sampled_with_seed:  # a seeded draw must not depend on which other rows share its generator
            return ("seeded", id(self))
        return (self.method, json.dumps(self.config, sort_keys=True, default=str), _constraint_key(self.constraint))

    def cancel(self) -> None:
        self.cancelled = True


class _Row:
    def __init__(self, req: Request, index: int, prompt: list[int]) -> None:
        self.req, self.index, self.prompt = req, index, prompt
        self.out: dict[int, int] = {}
        self.tokens: list[int] = []
        self.sent = ""  # text already delivered
        self.done = False
        self.reason = ""  # stop, length, cancelled or timeout
        self.proposed = self.accepted = 0
        self.last: float | None = None  # when this row last delivered tokens
        self.started = False  # it has sent an event (the prompt's logprobs go before the first)


class Scheduler:
    """Owns the model; `submit()` is called from any thread, events reach each request's sink."""

    def __init__(self, model: ModelAdapter, draft: ModelAdapter | None = None, *, metrics: Metrics | None = None,
                 max_queue: int = 256, max_batch: int = 16, window_s: float = 0.005) -> None:
        self.model, self.draft = model, draft
        self.metrics = metrics or Metrics()
        self.max_queue, self.max_batch, self.window_s = max_queue, max_batch, window_s
        self._waiting: deque[Request] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._live: set[int] = set()  # ids of requests accepted and not yet ended (for tests and /health)
        self.joined = 0  # requests that joined a batch already running (continuous batching), for tests
        self._thread = threading.Thread(target=self._loop, name="fastdecode-engine", daemon=True)
        self._thread.start()

    # -- the HTTP side ---------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self._cv:
            if self._stopping:
                self.metrics.refused("shutting_down")
                raise ServeError(503, "The server is shutting down: retry on another instance or later.",
                                 type_="service_unavailable", code="shutting_down")
            if len(self._waiting) >= self.max_queue:
                self.metrics.refused("queue_full")
                raise ServeError(429, f"The server's queue is full ({self.max_queue} requests waiting): "
                                 "retry after a short wait.", type_="rate_limit_error", code="queue_full")
            self._waiting.append(req)
            self._live.add(id(req))
            self.metrics.waiting = len(self._waiting)
            self._cv.notify()

    @property
    def live(self) -> int:
        """Requests accepted and not yet ended (waiting or running)."""
        with self._cv:
            return len(self._live)

    @property
    def waiting(self) -> int:
        with self._cv:
            return len(self._waiting)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Refuse new requests (503); the engine finishes every accepted request, then its thread ends."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if wait:
            self._thread.join(timeout)

    # -- the engine thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if not self._waiting:
                    return  # stopping and drained
            if self.window_s > 0:
                time.sleep(self.window_s)  # let requests that arrive together share the batch
            batch = self._take()
            if batch and self._continuous(batch[0]):
                self._run_continuous(batch)
            elif batch:
                self._run(batch)

    def _take(self) -> list[Request]:
        with self._cv:
            picked: list[Request] = []
            rows = 0
            key = None
            for req in list(self._waiting):
                if req.cancelled or self._expired(req):
                    self._waiting.remove(req)
                    self._end(req, _gone(req))
                    continue
                if key is None:
                    key = self._key(req)
                elif self._key(req) != key or rows + req.rows > self.max_batch:
                    continue
                self._waiting.remove(req)
                picked.append(req)
                rows += req.rows
            self.metrics.waiting = len(self._waiting)
            return picked

    @staticmethod
    def _expired(req: Request) -> bool:
        return req.timeout_s is not None and time.monotonic() - req.created > req.timeout_s

    def _end(self, req: Request, early: str | None = None) -> None:
        """The request's last event; it is forgotten after this. `early`: it ended cancelled or on its timeout
        (counted in the metrics; a timeout is answered with 504)."""
        if early == "timeout":
            req.sink(("error", ServeError(504, f"The request took longer than its timeout ({req.timeout_s} s): "
                                          "what it generated is dropped; ask for fewer tokens or raise --timeout.",
                                          type_="timeout", code="timeout")))
        if early is not None:
            self.metrics.ended_early(early, time.monotonic() - req.created)
        with self._cv:
            self._live.discard(id(req))

    def _run(self, batch: list[Request]) -> None:
        rows = [_Row(req, p * req.n + j, prompt) for req in batch for p, prompt in enumerate(req.prompts)
                for j in range(req.n)]
        first = batch[0]
        drafts = get_method(first.method).drafts  # its events' proposed / accepted are drafted tokens
        with self.metrics.lock:
            self.metrics.running = len(batch)
        try:
            constraint = {"constraint": first.constraint} if first.constraint is not None else {}
            events = stream(self.model, [r.prompt for r in rows], first.method, draft=self.draft, **first.params,
                            should_stop=lambda: self._all_gone(batch), **constraint)
        except FastDecodeError as e:  # validated before queueing, so only what depends on the batch gets here
            for req in batch:
                req.sink(("error", ServeError(400, str(e))))
                self._end(req)
            return
        ended: set[int] = set()
        try:
            with self._abandon_when_gone(batch):
                for ev in events:
                    if isinstance(ev, Finished):  # a loop its should_stop ended may finish with no event after
                        self._drop_gone(rows)
                        break
                    now = time.monotonic()
                    for b, row in enumerate(rows):
                        if row.done:
                            continue
                        req = row.req
                        if req.cancelled or self._expired(req):
                            row.done, row.reason = True, _gone(req)
                            continue
                        for offset, token in ev.tokens[b]:
                            row.out[offset] = token
                        if ev.proposed and drafts:
                            row.proposed += ev.proposed[b]
                            row.accepted += ev.accepted[b]
                            if ev.proposed[b]:
                                self.metrics.drafts(ev.proposed[b], ev.accepted[b])
                        self._advance(row, bool(ev.finished and ev.finished[b]), now)
                    for req in batch:
                        if id(req) not in ended and self._settled(req, rows):
                            ended.add(id(req))
                            self._close(req, rows)
                    if all(r.done for r in rows):
                        break
        except _Abandoned:  # every request left while the method ran its own loop: its rows end here
            self._drop_gone(rows)
        except Exception as e:  # a bug must not kill the engine thread: the batch's requests get a 500
            for req in batch:  # ...and a request the library stops (a constraint's matcher that failed) a 400
                if id(req) not in ended:
                    ended.add(id(req))
                    req.sink(("error", ServeError(400, str(e)) if isinstance(e, FastDecodeError) else ServeError(
                        500, f"Generation failed: {type(e).__name__}: {e}", type_="server_error")))
                    self._end(req)
        finally:
            close = getattr(events, "close", None)  # stops the driver (a generator) at once
            if close is not None:
                close()
            for req in batch:  # whatever is still open (cancelled or timed out mid-run)
                if id(req) not in ended:
                    self._close(req, rows)
            with self.metrics.lock:
                self.metrics.running = 0

    def _all_gone(self, batch: list[Request]) -> bool:
        """Whether no request of the batch is wanted any more (cancelled or timed out): a method that runs its own
        loop may stop (`hf.*` through the forward hook below, `llamacpp.*` through stream's `should_stop`)."""
        return all(req.cancelled or self._expired(req) for req in batch)

    def _drop_gone(self, rows: list[_Row]) -> None:
        """End the open rows of requests that are no longer wanted, with the reason they are not."""
        for row in rows:
            if not row.done and (row.req.cancelled or self._expired(row.req)):
                row.done, row.reason = True, _gone(row.req)

    @contextmanager
    def _abandon_when_gone(self, batch: list[Request]) -> Iterator[None]:
        """Check, before every forward of the model, whether any request of the batch is still wanted: a method
        that yields its steps only at the end (hf.*) is otherwise cut by a timeout or a disconnect only after it
        has run to completion. Never changes a row that is still wanted."""
        module = getattr(self.model, "model", None)
        if not isinstance(module, torch.nn.Module):
            yield
            return

        owner = threading.get_ident()

        def check(*_: Any) -> None:
            # the model is shared: a forward another thread runs on it (a test, a caller of the library) is not ours
            if threading.get_ident() == owner and self._all_gone(batch):
                raise _Abandoned

        handle = module.register_forward_pre_hook(check)
        try:
            yield
        finally:
            handle.remove()

    def _continuous(self, req: Request) -> bool:
        """Whether the request runs in a session (its method declares one), asked without making one: a sparse
        attention rule keeps summaries of the cache that adopted rows would not be in, so such a request (which the
        method's session factory declines) runs as a batch of its own, through generate()."""
        return (get_method(req.method).session is not None and is_dense(req.config.get("attention"))
                and not req.sampled_with_seed and req.constraint is None and isinstance(self.model, CausalLM)
                and self.model.preallocated)

    def _key(self, req: Request) -> Any:
        """Requests with equal keys share a batch; in a continuous batch each row has its own token budget, so
        `max_tokens` does not split them."""
        if not self._continuous(req):
            return req.key()
        config = {k: v for k, v in req.config.items() if k != "max_new_tokens"}
        return ("continuous", req.method, json.dumps(config, sort_keys=True, default=str))

    @staticmethod
    def _budget(req: Request) -> int | None:
        value = req.config.get("max_new_tokens", req.params.get("max_new_tokens"))
        return None if value is None else int(value)

    def _joiners(self, key: Any, free: int) -> list[Request]:
        """Waiting requests that join the running batch: from the head of the queue, while they share its method
        and parameters and fit in the free slots (a request that does not stops the joins: first come, first run)."""
        with self._cv:
            picked: list[Request] = []
            for req in list(self._waiting):
                if req.cancelled or self._expired(req):
                    self._waiting.remove(req)
                    self._end(req, _gone(req))
                    continue
                if self._key(req) != key or req.rows > free:
                    break
                self._waiting.remove(req)
                picked.append(req)
                free -= req.rows
            self.metrics.waiting = len(self._waiting)
            return picked

    def _session(self, first: Request, slots: int) -> Session | None:
        """The session the method's factory makes for the first request's parameters, with room for `slots` rows
        and none yet; None where it declines them."""
        spec = resolve(self.model, first.method)
        cfg = build_config(spec.config, first.params, first.method)
        assert spec.session is not None  # _continuous
        return spec.session(self.model, cfg, RunContext(draft=self.draft), slots)

    def _run_continuous(self, batch: list[Request]) -> None:
        """Continuous batching through the method's session: rows join between steps and leave as soon as they are
        done."""
        first = batch[0]
        key = self._key(first)
        model = self.model
        try:
            session = self._session(first, max(self.max_batch, sum(r.rows for r in batch)))
        except Exception as e:  # validated before queueing; whatever still fails answers the batch, never the engine
            known = isinstance(e, (FastDecodeError, ValueError))
            for req in batch:
                req.sink(("error", ServeError(400, str(e)) if known else ServeError(
                    500, f"Generation failed: {type(e).__name__}: {e}", type_="server_error")))
                self._end(req)
            return
        if session is None:  # the method declined these parameters: each set of them runs as a batch to completion
            for key in dict.fromkeys(req.key() for req in batch):
                self._run([req for req in batch if req.key() == key])
            return
        rows_of: dict[int, list[_Row]] = {}
        running: list[Request] = []
        by_slot: dict[int, _Row] = {}

        def admit(reqs: list[Request]) -> None:
            for req in reqs:
                rows = [_Row(req, p * req.n + j, prompt) for p, prompt in enumerate(req.prompts) for j in range(req.n)]
                try:
                    budget = self._budget(req)
                    padded = encode_batch(model, [r.prompt for r in rows], budget or 1)  # left-padded, checked
                    slots = session.join(padded.input_ids, padded.attention_mask, max_new_tokens=budget)
                except (FastDecodeError, ValueError) as e:
                    req.sink(("error", ServeError(400, str(e))))
                    self._end(req)
                    continue
                except Exception as e:  # a bug must not leave the request unanswered
                    req.sink(("error", ServeError(500, f"Generation failed: {type(e).__name__}: {e}",
                                                  type_="server_error")))
                    self._end(req)
                    continue
                for slot, row in zip(slots, rows, strict=True):
                    by_slot[slot] = row
                rows_of[id(req)] = rows
                running.append(req)

        try:
            admit(batch)
            while running:
                with self.metrics.lock:
                    self.metrics.running = len(running)
                picked = session.step()
                now = time.monotonic()
                for slot, (proposed, accepted) in session.counts.items():  # drafts of methods that draft
                    if slot in by_slot:
                        by_slot[slot].proposed += proposed
                        by_slot[slot].accepted += accepted
                        if proposed:
                            self.metrics.drafts(proposed, accepted)
                last = {slot: i for i, (slot, *_) in enumerate(picked)}  # a row's step ends at its last token
                for i, (slot, index, token, finished) in enumerate(picked):
                    row = by_slot.get(slot)
                    if row is None:  # left at an earlier token of this step (a stop string)
                        continue
                    row.out[index] = token
                    self._advance(row, finished, now, deliver=last[slot] == i)  # one chunk per row and step
                    if row.done:  # finished (the session let it go) or a stop string
                        session.leave(slot)
                        del by_slot[slot]
                for slot, row in list(by_slot.items()):
                    if row.req.cancelled or self._expired(row.req):
                        row.done, row.reason = True, _gone(row.req)
                        session.leave(slot)
                        del by_slot[slot]
                for req in list(running):
                    if all(r.done for r in rows_of[id(req)]):
                        running.remove(req)
                        self._close(req, rows_of[id(req)])
                joiners = self._joiners(key, session.room)
                if joiners and running:
                    self.joined += len(joiners)
                admit(joiners)
        except Exception as e:  # a bug must not kill the engine thread: the running requests get a 500
            for req in running:
                if all(r.done for r in rows_of[id(req)]):  # answered already
                    self._close(req, rows_of[id(req)])
                    continue
                req.sink(("error", ServeError(500, f"Generation failed: {type(e).__name__}: {e}",
                                              type_="server_error")))
                self._end(req)
        finally:
            with self.metrics.lock:
                self.metrics.running = 0

    def _settled(self, req: Request, rows: list[_Row]) -> bool:
        return all(r.done for r in rows if r.req is req)

    def _close(self, req: Request, rows: list[_Row]) -> None:
        mine = [r for r in rows if r.req is req]
        if req.cancelled:
            self._end(req, "cancelled")
            return
        if any(r.reason == "timeout" for r in mine):  # timed out while running
            self._end(req, "timeout")
            return
        prompt_tokens = sum(len(p) for p in req.prompts)
        completion = sum(len(r.tokens) for r in mine)
        accepted = sum(r.accepted for r in mine)
        rejected = sum(r.proposed - r.accepted for r in mine)
        req.sink(("end", prompt_tokens, completion, accepted, rejected))
        reason = "length" if any(r.reason == "length" for r in mine) else "stop"
        self.metrics.finished(reason, time.monotonic() - req.created, prompt_tokens)
        self._end(req)

    def _advance(self, row: _Row, finished: bool, now: float, deliver: bool = True) -> None:
        """Deliver what the row's new tokens add to its text; finish it on EOS, max_tokens or a stop string.

        `deliver=False`: more tokens of the same engine step follow (a session's step that accepted several drafted
        tokens), so the text is checked for EOS and stop strings but sent, as one chunk, with the step's last token.
        """
        model = self.model
        eos = model.eos_token_ids
        if model.kind == "causal":
            k = len(row.tokens)
            while k in row.out:
                k += 1
            new = [row.out[i] for i in range(len(row.tokens), k)]
        else:  # a diffusion row may fill any position and revise it: its text is known only when it finishes
            new = [row.out[i] for i in sorted(row.out)] if finished else []
        if not new and not finished:
            return
        if new:
            before = len(row.tokens)
            row.tokens += new
            cut = next((i + 1 for i, t in enumerate(row.tokens) if t in eos), None)
            if cut is not None:
                row.tokens = row.tokens[:cut]
                finished = True
            self.metrics.tokens(len(row.tokens) - before)  # kept tokens (a diffusion row: up to EOS, not its canvas)
        text = model.decode([t for t in row.tokens if t not in eos]) if model.tokenizer is not None else ""
        stops = row.req.stops
        reason = "stop" if row.tokens and row.tokens[-1] in eos else "length"
        hit = min((i for i in (text.find(s, max(0, len(row.sent) - len(s) + 1)) for s in stops) if i >= 0),
                  default=-1)
        if hit >= 0:
            text, finished, reason = text[:hit], True, "stop"
        if new and (deliver or finished):
            self._timing(row, now)
        if finished:
            row.done, row.reason = True, reason
            delta = text[len(row.sent):] if text.startswith(row.sent) else ""
            self._send(row, ("finish", row.index, reason, delta, text, list(row.tokens), self._logprobs(row)))
            row.sent = text
            return
        if not deliver:
            return
        hold = max((len(s) for s in stops), default=1) - 1  # a stop string may be arriving: keep its start back
        safe = text[: len(text) - hold] if hold else text
        safe = safe.rstrip("\ufffd")  # a character whose bytes are still arriving
        if len(safe) > len(row.sent) and safe.startswith(row.sent):
            self._send(row, ("delta", row.index, safe[len(row.sent):]))
            row.sent = safe

    def _send(self, row: _Row, event: tuple) -> None:
        """A row's event; before its first one, a stream that asked for prompt_logprobs gets them (one forward over
        the prompt, `scoring.py`), so that they arrive with the first chunk as vLLM sends them."""
        if row.req.prompt_first and not row.started:
            assert isinstance(self.model, CausalLM) and row.req.logprobs is not None  # checked at the door
            row.req.sink(("prompt", row.index, token_logprobs(self.model, row.prompt, [], row.req.logprobs, True)))
        row.started = True
        row.req.sink(event)

    def _timing(self, row: _Row, now: float) -> None:
        """Time to first token once per request (its first row to deliver), inter-token latency per row and step."""
        if not row.req.answered_first:
            row.req.answered_first = True
            self.metrics.observe(ttft=now - row.req.created)
        elif row.last is not None:
            self.metrics.observe(itl=now - row.last)
        row.last = now

    def _logprobs(self, row: _Row) -> list[Entry] | None:
        """(token, log-probability, top alternatives, rank) of each output token (prompt tokens first with `echo`)
        under the target model's own distribution, from one more forward over prompt + output (`scoring.py`)."""
        k = row.req.logprobs
        if row.req.prompt_first:  # a stream: the prompt's were sent with its first chunk; output logprobs are not
            return None
        if k is None or not (row.tokens or row.req.echo):
            return None if k is None else []
        assert isinstance(self.model, CausalLM)  # refused for diffusion models at the door
        return token_logprobs(self.model, row.prompt, row.tokens, k, row.req.echo)


def _constraint_key(constraint: Any) -> Any:
    """Requests share a batch only under the same constraint (kind, text and options), or none."""
    if constraint is None:
        return None
    text = constraint.text if isinstance(constraint.text, str) else json.dumps(constraint.text, sort_keys=True)
    return (constraint.kind, text, constraint.sampling, constraint.diffusion, constraint.lookahead)
