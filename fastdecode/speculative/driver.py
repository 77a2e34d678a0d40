"""The one speculative driver: propose -> verify in one target forward -> accept -> roll the cache back -> observe.

Every drafter, chain or tree, runs through `speculative()`. Rows of a batch advance in lock step, one target
forward per row and step, each row with its own KV cache and drafter, so no row ever sees another row's
padding and a batched run equals the one-by-one runs token for token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from ..sampling.samplers import make_generator
from ..cache import KVCache
from ..sampling.config import SamplingConfig
from ..errors import IncompatibleMethodError
from ..models.capabilities import sliding_windows, state_layer_types, uses_alibi
from ..models.causal import CausalLM
from ..registry import RunContext
from ..types import PromptBatch, StepEvent
from .tree import ancestor_mask, depths, verify_tree_greedy, verify_tree_rsd, verify_tree_sampling
from .verify import Verdict, target_distribution, verify_greedy, verify_sampling


@dataclass(frozen=True)
class SpecConfig(SamplingConfig):
    """Parameters every speculative method takes. temperature 0 is greedy and lossless (equals ar.greedy);
    above 0 the output has exactly ar.sample's distribution with the same temperature / top-k / top-p."""

    temperature: float = 0.0


@dataclass(frozen=True)
class Side:
    """Tokens a drafter rides on the verification forward for its own use (Lookahead's Jacobi window). They see
    the context and each other as `mask` says; the draft never sees them; their logits go to `observe`."""

    tokens: torch.Tensor  # [S] long
    offsets: torch.Tensor  # [S] position = last context position + offset (>= 1)
    mask: torch.Tensor  # [S, S] bool, side token i may attend to side token j


@dataclass(frozen=True)
class Draft:
    """Proposed continuation of one row: a chain, or a tree when `parents` is given (see `tree.py`).

    `probs=None` marks a deterministic drafter (verified with q one-hot). A tree with `probs` has the siblings
    under each node drawn in listed order without replacement from their row of `probs` (RSD, `verify_tree_rsd`).
    """

    tokens: torch.Tensor  # [k] long
    probs: torch.Tensor | None = None  # [k, V] q_i, the distribution each token was drawn from
    parents: list[int] | None = None  # [k] tree parent of each node, -1 = root; None = chain
    side: Side | None = None

    @staticmethod
    def empty() -> Draft:
        return Draft(torch.empty(0, dtype=torch.long))

    def as_chain(self) -> Draft:
        """A deterministic tree without branches is the chain it spells: verified the same way, and its accepted
        prefix keeps its cache entries instead of being fed again."""
        if self.parents is None or self.probs is not None or self.side is not None:
            return self
        return Draft(self.tokens) if self.parents == list(range(-1, len(self.parents) - 1)) else self

    @property
    def depth(self) -> int:
        """The most draft tokens that can be accepted."""
        return max(depths(self.parents), default=0) if self.parents is not None else self.tokens.numel()


class Drafter(Protocol):
    """Proposes tokens for one row. Drafters that run a model count their forwards in `forwards`; drafters that may
    propose trees or side tokens (verified under a custom attention mask) set `tree_drafts`."""

    forwards: int
    tree_drafts: bool

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        """Draft a chain of at most k tokens, or a tree at most k deep, to follow `context` (`[N]` long, on the CPU)."""
        ...

    def observe(self, accepted: int, logits: torch.Tensor | None = None) -> None:
        """The first `accepted` tokens of the last draft were accepted, then the target emitted one more.

        `logits` are the target's logits of that step, for drafters that learn from the target: `[1 + k + S, V]`
        for the root (last context token), the k draft tokens and the S side tokens.
        """
        ...

    def finish(self, context: torch.Tensor) -> None:
        """The row ended with this `[N]` context (prompt + output); drafters that learn across requests keep it."""
        ...


class BaseDrafter:
    """Defaults for the Drafter protocol: no model forwards, nothing learnt from verification."""

    forwards = 0
    tree_drafts = False

    def observe(self, accepted: int, logits: torch.Tensor | None = None) -> None:
        pass

    def finish(self, context: torch.Tensor) -> None:
        pass


# makes the drafter of one row from the run's generator (drafters that sample share it); rows never share a drafter
DrafterFactory = Callable[[torch.Generator | None], Drafter]


def check_rollback(model: CausalLM) -> None:
    """Refuse a model whose cache cannot drop rejected draft positions, naming the layers that block it."""
    states = state_layer_types(model)
    if states:
        raise IncompatibleMethodError(
            f"Speculative methods roll the cache back after each verification, but {model.name!r} has recurrent "
            f"state-space layers ({', '.join(states)}) whose state cannot roll back to an earlier position. "
            "Use ar.greedy / ar.sample with this model."
        )
    cache = model.new_cache()
    if not cache.can_trim:
        windows = sliding_windows(model)
        sizes = ", ".join(sorted({str(w) for w in windows.values()}))
        why = (f"sliding-window attention layers (window {sizes} on layers {', '.join(map(str, windows))}), whose "
               f"cache ({type(cache.hf).__name__}) drops old positions and cannot roll back"
               if windows else f"a cache ({type(cache.hf).__name__}) that cannot roll back")
        raise IncompatibleMethodError(
            f"Speculative methods roll the KV cache back after each verification, but {model.name!r} has {why}. "
            "Use ar.greedy / ar.sample with this model, or a model with full attention."
        )


def check_tree_attention(model: CausalLM, role: str = "target") -> None:
    """Refuse tree drafts on a model that cannot take their positions: ALiBi (Bloom) counts key positions along a
    2D padding mask and has no position ids, so a tree node's depth cannot be given and a 4D tree mask is refused."""
    if uses_alibi(model):
        raise IncompatibleMethodError(
            f"This method verifies draft trees under a tree attention mask, but the {role} {model.name!r} "
            f"({type(model.model).__name__}) uses ALiBi attention, which takes its positions from a 2D padding mask "
            "and cannot place tree nodes by depth. Use a chain method (spec.pld, spec.ngram, spec.draft_model, "
            "spec.jacobi, spec.suffix without tree=True) with this model."
        )


def speculative(model: CausalLM, batch: PromptBatch, cfg: SpecConfig, ctx: RunContext, new_drafter: DrafterFactory) -> Iterator[StepEvent]:
    """Check the model, then return the generator of step events (errors surface before the first step)."""
    check_rollback(model)
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    rows = [_Row(model, batch.row(b), cfg, new_drafter(generator), generator) for b in range(batch.size)]
    if any(getattr(r.drafter, "tree_drafts", False) for r in rows):
        check_tree_attention(model)
        if isinstance(ctx.draft, CausalLM):  # a draft model that grows the tree itself runs tree masks too
            check_tree_attention(ctx.draft, "draft model")
    return _steps(rows)


def _steps(rows: list[_Row]) -> Iterator[StepEvent]:
    index = 0
    while not all(r.done for r in rows):
        outs = [r.step() if not r.done else _Out() for r in rows]
        yield StepEvent(
            index=index,
            tokens=tuple(o.tokens for o in outs),
            forwards=1,
            # a batched drafter would run until its longest row is drafted
            draft_forwards=max(o.draft_forwards for o in outs),
            proposed=tuple(o.proposed for o in outs),
            accepted=tuple(o.accepted for o in outs),
            finished=tuple(r.done for r in rows),
            draft_s=tuple(o.draft_s for o in outs),
            verify_s=tuple(o.verify_s for o in outs),
        )
        index += 1


@dataclass
class _Out:
    tokens: tuple[tuple[int, int], ...] = ()
    proposed: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0


class _Row:
    """One sequence: its context, its target KV cache and its drafter."""

    def __init__(self, model: CausalLM, prompt: list[int], cfg: SpecConfig, drafter: Drafter, generator: torch.Generator | None) -> None:
        self.model, self.cfg, self.drafter, self.generator = model, cfg, drafter, generator
        self.eos = model.eos_token_ids
        self.prompt_len = len(prompt)
        self.ids = torch.tensor(prompt + [0] * cfg.max_new_tokens, dtype=torch.long)  # [L + max_new] context buffer
        self.n = len(prompt)  # tokens in the context
        self.pending = len(prompt)  # context tokens the target cache has not seen yet
        self.cache: KVCache = model.new_cache()
        self.done = False

    def step(self) -> _Out:
        made = self.n - self.prompt_len
        room = self.cfg.max_new_tokens - made - 1  # drafts beyond this could never be emitted
        context = self.ids[: self.n]
        before = self.drafter.forwards
        t0 = self._clock()
        draft = self.drafter.propose(context, room).as_chain() if room > 0 else Draft.empty()
        t1 = self._clock()
        k = draft.tokens.numel()
        assert draft.depth <= max(room, 0), f"drafter proposed {draft.depth} tokens deep, more than the {room} asked for"

        # 1. one target forward over the unseen context, the draft (and side tokens) gives p for the root and each node
        logits = self._forward(context, draft)  # [1 + k + S, V]
        verdict = self._verify(draft, logits[: k + 1])
        t2 = self._clock()

        # 2. keep accepted tokens up to the first EOS
        tokens = verdict.tokens[: self.cfg.max_new_tokens - made]
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self.eos), len(tokens))
        tokens = tokens[:cut]
        start = self.n
        self.ids[start : start + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        self.n += len(tokens)
        self.done = tokens[-1] in self.eos or self.n - self.prompt_len >= self.cfg.max_new_tokens

        # 3. roll the cache back: a chain keeps its accepted prefix; a tree's (or side tokens') cache entries are
        #    all dropped and the accepted path is fed again with the next step
        if self.done:
            self.drafter.finish(self.ids[: self.n])
        else:
            plain = draft.parents is None and draft.side is None
            self.cache.crop(start + (verdict.accepted if plain else 0))
            self.pending = self.n - self.cache.length
            self.drafter.observe(verdict.accepted, logits)
        return _Out(
            tokens=tuple((made + i, t) for i, t in enumerate(tokens)),
            proposed=k,
            accepted=min(verdict.accepted, len(tokens)),
            draft_forwards=self.drafter.forwards - before,
            draft_s=t1 - t0,
            verify_s=t2 - t1,
        )

    def _clock(self) -> float:
        """Wall time after the device has finished the work queued so far (GPU kernels run asynchronously)."""
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        return time.perf_counter()

    def _forward(self, context: torch.Tensor, draft: Draft) -> torch.Tensor:
        P, k, n = self.pending, draft.tokens.numel(), self.n
        side = draft.side
        parts = [context[n - P :], draft.tokens.cpu()] + ([side.tokens.cpu()] if side else [])
        inp = torch.cat(parts)[None].to(self.model.device)  # [1, P + k + S]
        if draft.parents is None and side is None:  # a chain: plain causal attention
            pos, mask = torch.arange(n - P, n + k), None
        else:
            offsets = torch.tensor(depths(draft.parents), dtype=torch.long) if draft.parents is not None else torch.arange(1, k + 1)
            pos = torch.cat([torch.arange(n - P, n), n - 1 + offsets] + ([self._side_positions(side)] if side else []))
            mask = self._mask(P, draft)
        pos = pos[None].to(self.model.device)
        return self.model.forward(inp, pos, self.cache, mask, num_logits=1 + inp.shape[1] - P)[0]

    def _side_positions(self, side: Side) -> torch.Tensor:
        """Side tokens are guesses far ahead; near the model's last position they share it (only guesses suffer)."""
        pos = self.n - 1 + side.offsets.cpu()
        limit = self.model.max_positions
        return pos.clamp(max=limit - 1) if limit is not None else pos

    def _mask(self, P: int, draft: Draft) -> torch.Tensor:
        """`[1, 1, Q, C + Q]` additive mask: pending tokens causal, tree nodes see their ancestors, side tokens theirs."""
        k = draft.tokens.numel()
        S = draft.side.tokens.numel() if draft.side else 0
        C, Q = self.cache.length, P + k + S
        allow = torch.zeros(Q, C + Q, dtype=torch.bool)
        allow[:, : C + P] = True
        allow[:P, C : C + P] = torch.ones(P, P, dtype=torch.bool).tril()
        tree = ancestor_mask(draft.parents) if draft.parents is not None else torch.ones(k, k, dtype=torch.bool).tril()
        allow[P : P + k, C + P : C + P + k] = tree
        if S:
            allow[P + k :, C + P + k :] = draft.side.mask
        blocked = torch.finfo(self.model.dtype).min
        return torch.zeros(Q, C + Q, dtype=self.model.dtype).masked_fill(~allow, blocked)[None, None].to(self.model.device)

    def _verify(self, draft: Draft, logits: torch.Tensor) -> Verdict:
        tree = draft.parents
        if self.cfg.greedy:
            return verify_greedy(draft.tokens, logits) if tree is None else verify_tree_greedy(draft.tokens.tolist(), tree, logits)
        p = target_distribution(logits, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)  # [k + 1, V]
        if tree is None:
            return verify_sampling(draft.tokens, draft.probs, p, self.generator)
        if draft.probs is not None:  # siblings sampled without replacement
            return verify_tree_rsd(draft.tokens.tolist(), tree, p, draft.probs.to(p.device), self.generator)
        return verify_tree_sampling(draft.tokens.tolist(), tree, p, self.generator)
