"""The drafter contract: what a `spec.*` method writes, and all the driver (`driver.py`) knows about it.

A method is a config (a `SpecConfig`) and a drafter. The driver asks the drafter for a `Draft` of at most k tokens
(`propose`), verifies it in one target forward, and tells it the outcome (`observe(Verification)`), or that the row
ended (`finish`). Everything else the driver needs to know about a drafter is a declared capability with a default
on `BaseDrafter`, never a probe for an attribute:

| capability | default | set it when the drafter ... |
|---|---|---|
| `forwards` | 0 | runs a model: count its forwards (Stats.draft_forwards) |
| `needs_hidden` | False | reads the target's last hidden states (`Verification.hidden`) |
| `hidden_layers` | () | reads intermediate decoder layers' outputs too (EAGLE-3 reads three) |
| `tree_drafts` | False | may propose trees or side tokens (verified under a tree attention mask) |
| `shares_target_cache` | False | runs the target on the target's own KV cache (spec.sparse_self) |
| `bind(cache)` | None | ... handed to it before the first step; may return a watcher of the target's forwards |
| `reads(logits, k, hidden)` | None | reads values of the verified rows in `observe` (they come with the verdict) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..attention import SparseSelector, check_attention
from ..cache import DynamicKVCache, KVCache
from ..registry import C, DriverOf, register
from ..sampling.config import SamplingConfig
from ..types import ModelKind
from .tree import DeviceTree, Parents, depths


@dataclass(frozen=True)
class SpecConfig(SamplingConfig):
    """Parameters every speculative method takes (each method's config derives from it): ar.sample's (temperature,
    top_k, top_p, min_p, repetition_penalty, seed), applied by the same `LogitsPipeline` at every verified position.
    temperature 0 is greedy and lossless (equals ar.greedy with the same repetition_penalty); above 0 the output has
    exactly ar.sample's distribution with the same parameters."""

    temperature: float = 0.0
    # the target's attention in verification forwards: "dense", or a sparse rule ("quest", "quest:budget=128") on a
    # method not registered lossless; a lossless method refuses a rule (`Method.check_attention`: a sparse target is
    # no longer the dense model) and names spec.sparse_self, which drafts sparsely and verifies densely
    attention: str = "dense"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_attention(self.attention)


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
    # [k] tree parent of each node, -1 = root; None = chain. A `DeviceTree` where the drafter left the tree's shape
    # unread on the device (a best-first tree on a GPU): the verdict reads it
    parents: Parents | None = None
    side: Side | None = None

    @staticmethod
    def empty() -> Draft:
        return Draft(torch.empty(0, dtype=torch.long))

    def as_chain(self) -> Draft:
        """A deterministic tree without branches is the chain it spells: verified the same way, and its accepted
        prefix keeps its cache entries instead of being fed again. (A `DeviceTree` is not looked at: that would
        read it.)"""
        if self.parents is None or isinstance(self.parents, DeviceTree):
            return self
        if self.probs is not None or self.side is not None:
            return self
        return Draft(self.tokens) if self.parents == list(range(-1, len(self.parents) - 1)) else self

    def on_host(self) -> Draft:
        """This draft with a `DeviceTree` read to the host, with its tokens, in one copy (where something must see
        the tree before its verdict: a grammar, or a processor that reads each node's history)."""
        if not isinstance(self.parents, DeviceTree):
            return self
        tree = self.parents
        assert tree.order is None, "read a tree before reordering it"
        values = torch.cat([self.tokens.to(tree.parents.device), tree.parents]).tolist()
        k = self.tokens.numel()
        return Draft(torch.tensor(values[:k], dtype=torch.long), self.probs, values[k:], self.side)

    @property
    def depth(self) -> int:
        """The most draft tokens that can be accepted (a bound, for a `DeviceTree`)."""
        if isinstance(self.parents, DeviceTree):
            return self.parents.depth
        return max(depths(self.parents), default=0) if self.parents is not None else self.tokens.numel()


@dataclass(frozen=True)
class Verification:
    """What one verification step tells a drafter (`Drafter.observe`): what was accepted and emitted, and what the
    target computed.

    The forward scored the root (the last context token), the k draft nodes (a chain or a tree, in draft order) and
    the S side tokens the drafter rode on it; drafters read those parts by name instead of slicing rows themselves.
    `hidden` is there only for a drafter that sets `needs_hidden = True` (drafters that read the target's features:
    EAGLE, Medusa, Hydra heads). It covers every token the forward fed: the P context tokens the target had not seen
    yet (the whole prompt at the first step; the root is the last of them), then the k draft nodes, then the S side
    tokens; transformers' `hidden_states[-1]`, after the final norm (see `CausalOutput`).
    """

    accepted: int  # draft tokens accepted: a chain's prefix, or the accepted root path of a tree
    tokens: tuple[int, ...]  # tokens emitted this step: the accepted draft tokens, then the target's own one
    logits: torch.Tensor  # [1 + k + S, V] float32: the root's, the k draft nodes', the S side tokens'
    num_draft: int  # k, the draft nodes verified (0 for an empty draft)
    hidden: torch.Tensor | None = None  # [P + k + S, H] in the target's dtype; None unless the drafter needs it
    # one [P + k + S, H] per index of the drafter's `hidden_layers`, in its order: each decoder layer's output
    # before the final norm (`CausalOutput.layers`); empty unless the drafter asks for layers
    layers: tuple[torch.Tensor, ...] = ()
    # what the drafter's `reads` asked of these logits, copied to the host with the verdict (one synchronisation a
    # step on a GPU); None where nothing was asked, or where the caller did not read it (`BaseDrafter.asked`)
    read: torch.Tensor | None = None
    # a tree's accepted nodes, root to leaf, in the drafter's order (None for a chain: its first `accepted`)
    nodes: tuple[int, ...] | None = None

    @property
    def root_logits(self) -> torch.Tensor:
        """`[V]`: the target's logits at the last context token (they gave the first emitted token)."""
        return self.logits[0]

    @property
    def draft_logits(self) -> torch.Tensor:
        """`[k, V]`: row i is the target's logits after draft node i (at node i's position on its tree path)."""
        return self.logits[1 : 1 + self.num_draft]

    @property
    def node_logits(self) -> torch.Tensor:
        """`[1 + k, V]`: the root's row, then the draft nodes' (one row per input token of the draft)."""
        return self.logits[: 1 + self.num_draft]

    @property
    def side_logits(self) -> torch.Tensor | None:
        """`[S, V]` the side tokens' logits, in the order the drafter listed them; None without side tokens."""
        return self.logits[1 + self.num_draft :] if self.logits.shape[0] > 1 + self.num_draft else None

    @property
    def context_hidden(self) -> torch.Tensor | None:
        """`[P, H]`: hidden states of the context tokens this forward fed (the root last)."""
        if self.hidden is None:
            return None
        return self.hidden[: self.hidden.shape[0] - (self.logits.shape[0] - 1)]

    @property
    def node_hidden(self) -> torch.Tensor | None:
        """`[1 + k, H]`: hidden states of the root and the draft nodes, row for row with `node_logits`."""
        if self.hidden is None:
            return None
        start = self.hidden.shape[0] - self.logits.shape[0]
        return self.hidden[start : start + 1 + self.num_draft]


@runtime_checkable
class Drafter(Protocol):
    """Proposes tokens for one row. Every capability the driver reads is declared here (defaults: `BaseDrafter`)."""

    needs_hidden: bool  # reads the target's last hidden states in `Verification.hidden`
    # intermediate decoder layers whose outputs the drafter reads (EAGLE-3: a low, a middle and a high one); () = none
    hidden_layers: tuple[int, ...]
    tree_drafts: bool  # may propose trees or side tokens, verified under a custom attention mask
    shares_target_cache: bool  # runs the target on the target's own cache of its row (handed over by `bind`)

    @property
    def forwards(self) -> int:
        """Model forwards run so far (read only: a plain attribute or a property both satisfy it)."""
        ...

    def bind(self, cache: KVCache | DynamicKVCache) -> SparseSelector | None:
        """The target's cache of this row; called before the first step on a drafter that `shares_target_cache`.
        May return a selector for the target's verification forwards on that cache that only watches them (it must
        select nothing: verification stays dense), for a draft rule that learns from them (SnapKV, the prefill)."""
        ...

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        """Draft a chain of at most k tokens, or a tree at most k deep, to follow `context` (`[N]` long, on the CPU)."""
        ...

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None) -> torch.Tensor | None:
        """What `observe` will read of a step's `[1 + k + S, V]` logits (rows in the drafter's order, k =
        `num_draft`), and of the root's and the draft nodes' `[1 + k, H]` hidden states for a drafter that
        `needs_hidden` (`Verification.node_hidden`; else None): integers computed where they are, e.g. the side
        tokens' argmax. The driver copies them to the host in the same read as the verdict (on a GPU each read is a
        synchronisation; issue #30 asks for one a step) and hands them over as `Verification.read`. None: nothing."""
        ...

    def observe(self, verification: Verification) -> None:
        """The last draft was verified and the row goes on: `verification.accepted` draft tokens were accepted,
        then the target emitted one more; it also holds the target's logits (and hidden states) of that step."""
        ...

    def finish(self, context: torch.Tensor) -> None:
        """The row ended with this `[N]` context (prompt + output); drafters that learn across requests keep it."""
        ...


class BaseDrafter:
    """Defaults for every capability of the Drafter protocol: no model forwards, no hidden states, chains only, a
    cache of its own, nothing learnt from verification. A drafter subclasses it and writes `propose`."""

    forwards = 0
    needs_hidden = False
    hidden_layers: tuple[int, ...] = ()
    tree_drafts = False
    shares_target_cache = False

    def bind(self, cache: KVCache | DynamicKVCache) -> SparseSelector | None:
        return None

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        raise NotImplementedError(f"{type(self).__name__} must implement propose(context, k)")

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None) -> torch.Tensor | None:
        return None

    def asked(self, verification: Verification) -> torch.Tensor:
        """On the host: what `reads` asks of `verification`'s logits, as the driver read it with the verdict, or read
        now where it was not (a caller that built the Verification itself)."""
        if verification.read is not None:
            return verification.read
        found = self.reads(verification.logits, verification.num_draft, verification.node_hidden)
        if found is None:
            raise ValueError(f"{type(self).__name__}.reads asks nothing of these logits")
        return found.cpu()

    def observe(self, verification: Verification) -> None:
        pass

    def finish(self, context: torch.Tensor) -> None:
        pass


# makes the drafter of one row from the run's generator (drafters that sample share it); rows never share a drafter
DrafterFactory = Callable[[torch.Generator | None], Drafter]


def register_spec(
    name: str, *, config: type[C], needs_draft: bool = False, draft_kind: ModelKind = "causal", joins: bool = True,
    lossless: bool = True, images_only: bool = False,
) -> Callable[[DriverOf[C]], DriverOf[C]]:
    """`registry.register` for the spec.* family: a method on a causal target whose steps draft (counted in
    `/metrics`) and whose requests join a running batch through the `SpecSession` its driver returns (`joins=False`
    for a drafter that cannot, e.g. one running on the target's own cache). Lossless unless it verifies by a relaxed
    rule of its own (`lossless=False`: spec.lantern, spec.gsd, which also read an image codebook: `images_only`)."""
    return register(name, kind="causal", config=config, lossless=lossless, needs_draft=needs_draft,
                    draft_kind=draft_kind, session="driver" if joins else None, drafts=True, images_only=images_only)
