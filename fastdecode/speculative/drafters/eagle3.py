"""spec.eagle3: EAGLE-3 drafting (Li et al. 2025, arXiv 2503.01840): a trained head reads three of the target's
own layers and drafts with one decoder layer of its own, whose KV cache holds one entry per context token.

Entry j pairs the target's fused feature of token j (from a verification forward: `hidden_layers`,
`Verification.layers`) with the embedding of token j + 1, and its output predicts token j + 2. A chain then feeds
each drafted token with the layer's own last output; a rejected draft's entries are cropped and the accepted tokens
enter with the target's features instead, as in the authors' code. `tree=True` grows EAGLE-2's best-first tree
(`best_first.py`) of at most `total_tokens` nodes with the same head, a level per head forward.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...cache.pool import Storage, StoragePool, free_retired_graphs, retire_graphs
from ...config import check
from ...heads.eagle3 import DraftCache, Eagle3Head, target_embeddings
from ...heads.eagle3_io import eagle3_for
from ...models.base import on_host
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..best_first import Beam, BestFirst, kept_draft, stops_early
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import check_rollback, speculative
from ..model_chain import reads_each_token
from ..step_graph import StepGraph, StepGraphs
from ..tree import DeviceTree

MAX_NODES = 64
BLOCK = 64  # a device's head cache holds its entries in blocks of this many (one key length per graph: `DraftCache`)
POOLED = 4  # dead drafters' block caches kept per head, with their graphs (`_pool`)


@dataclass(frozen=True)
class Eagle3SpecConfig(SpecConfig):
    num_draft_tokens: int = 5  # chain length (the tree's depth)
    # the head: a folder (save_head's layout or SpecForge/SGLang/vLLM's), zoo:<model>/<name>; "" = the shipped one
    head: str = ""
    tree: bool = False  # a dynamic best-first tree instead of a chain
    total_tokens: int = 16  # tree: nodes kept (verification cost grows with them on a CPU)
    width: int = 4  # tree: nodes expanded per level, and children drawn per expanded node
    # tree: stop growing once no child could be kept (the same tree, fewer head forwards; a read a level): None = on
    # the CPU only (best_first.stops_early)
    early_stop: bool | None = None
    # draft in one captured graph a step (the chain's head forwards, or the tree's levels; `HeadGraph`): None = on
    # CUDA; True elsewhere runs the same body without capturing (tests), False drafts forward by forward
    graph: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_draft_tokens >= 1, "num_draft_tokens", self.num_draft_tokens, "must be at least 1")
        check(1 <= self.total_tokens <= MAX_NODES, "total_tokens", self.total_tokens, f"must be in [1, {MAX_NODES}]")
        check(self.width >= 1, "width", self.width, "must be at least 1")
        check(not (self.graph and self.tree and self.early_stop), "graph", self.graph,
              "grows every level of the tree in one graph, which early_stop=true (a read a level) cannot: set one of "
              "them")


class Eagle3Drafter(BaseDrafter):
    """One row's EAGLE-3 drafter: the head's cache of committed entries, the fused features not yet entered."""

    # whether the chain reads each token as it comes (None: on the CPU only; tests set False to run a GPU's path)
    read_each_token: bool | None = None
    # whether a step's graph is captured (None: on CUDA; elsewhere its body runs again each step, capture-free)
    captures: bool | None = None

    def __init__(self, model: CausalLM, head: Eagle3Head, cfg: Eagle3SpecConfig) -> None:
        self.head, self.cfg = head, cfg
        self.hidden_layers = head.config.layers
        self.tree_drafts = cfg.tree
        self.embed = target_embeddings(model)
        self.eos = model.eos_token_ids
        self.vocab = model.vocab_size
        device = model.device
        self.graphed = cfg.graph if cfg.graph is not None else device.type == "cuda"
        # on a device (and for a graph) the head's cache attends over whole blocks: one shape a step (`DraftCache`)
        self.cache = DraftCache(BLOCK if self.graphed or not on_host(device) else 0)
        # a block cache holds the whole generation's entries from its first step (`_room`), and goes back to the
        # head's pool with the graphs captured over it when the drafter dies, for the next generation of the same room
        self._held = [HeadStorage(cache=self.cache)]
        weakref.finalize(self, _give_back, _pool(head), self._held)
        # its captures and replays; why they stopped if a capture failed for the head (its later drafters try none)
        self.graphs = StepGraphs("spec.eagle3", shared=StepGraphs.of(head, "spec.eagle3"))
        self.forwards = 0
        self._entered = 0  # context positions whose entry is in the cache (entry j: token j's feature, token j+1)
        self._featured = 0  # context positions whose fused feature is known (entered or pending)
        self._committed = 0  # cache rows holding committed entries (the rows after them are the last draft's)
        self._pending: list[torch.Tensor] = []  # [m, H] fused features of positions _entered.._featured-1
        self._last: torch.Tensor | None = None  # [H] output of the newest committed entry
        self._n = 0  # context length at the last proposal

    # -- proposing ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int) -> Draft:
        self._n = context.numel()
        self.cache.crop(self._committed)  # drop the last draft's entries
        if k < 1 or self._featured != context.numel() - 1:
            return Draft.empty()  # no features yet (the first step feeds the prompt)
        self._enter(context)
        assert self._last is not None
        if self.cfg.tree:
            return self._tree(min(k, self.cfg.num_draft_tokens))
        return self._chain(min(k, self.cfg.num_draft_tokens))

    def _enter(self, context: torch.Tensor) -> None:
        """Append the pending entries (positions _entered.._featured-1) to the cache in one head forward."""
        if not self._pending:
            return
        fresh = self.cache.block > 0 and self.cache.capacity == 0
        if fresh:
            room = self._room(context.numel())
            taken = _pool(self.head).take((room,))
            if isinstance(taken, HeadStorage) and taken.cache is not None:  # an earlier generation's storage,
                self.cache, self._held[0] = taken.cache, taken  # and the graphs captured over it
            self.cache.room = room
        feats = torch.cat(self._pending)[None]  # [1, m, H]
        m, start = feats.shape[1], self._entered
        ids = context[start + 1 : start + 1 + m].to(feats.device)  # token j + 1 of each entry j
        C = self.cache.length
        allow = torch.ones(m, C + m, dtype=torch.bool)
        allow[:, C:] = torch.ones(m, m, dtype=torch.bool).tril()
        pos = torch.arange(start, start + m, device=feats.device)[None]
        out = self.head.step(self.embed(ids)[None], feats, pos, self.cache, allow)  # [1, m, H]
        self.forwards += 1
        self._pending, self._entered, self._committed = [], start + m, C + m
        self._last = out[0, -1]

    def _room(self, n: int) -> int:
        """A block cache's capacity for a generation from a context of `n` tokens: every committed entry and one
        step's draft entries, rounded up to a power of two, so that generations of about the same length share
        storage and graphs (`_pool`) and the cache never grows, which would capture every graph again. (The drafts
        depend on the capacity, a whole storage attended: a generation's own numbers fix it, not what ran before.)"""
        step = (self.cfg.num_draft_tokens - 1) * min(self.cfg.width, self.vocab) if self.cfg.tree \
            else self.cfg.num_draft_tokens
        need = max(n + self.cfg.max_new_tokens + step, BLOCK)
        return 1 << (need - 1).bit_length()

    def _chain(self, k: int) -> Draft:
        """At most k tokens, each the head's argmax. On a GPU the loop reads nothing: the chain goes to the
        verification unread, which reads it with its verdict (one synchronisation a step, issue #30), and an end of
        text among the drafts ends the output where the driver settles the step; on the CPU each token is read as
        it comes and the chain stops at an end of text (`read_each_token`, as a draft model's chain)."""
        assert self._last is not None
        h, p = self._last, self._entered - 1  # the newest entry sits at position p; chain step i at p + i
        each = reads_each_token(self.read_each_token, h.device)
        if self.graphed and not each and k > 1:
            graphed = self._in_graph("chain", k, k - 1)
            if graphed is not None:
                return Draft(graphed[0])
        tokens = [_pick(self.head, self.head.logits(h))]
        for i in range(1, k):
            if each and int(tokens[-1]) in self.eos:
                break
            allow = torch.ones(1, self.cache.length + 1, dtype=torch.bool)
            out = self.head.step(self.embed(tokens[-1].view(1, 1)), h[None, None],
                                 torch.tensor([[p + i]], device=h.device), self.cache, allow)
            self.forwards += 1
            h = out[0, -1]
            tokens.append(_pick(self.head, self.head.logits(h)))
        return Draft(torch.stack(tokens))

    def _tree(self, depth: int) -> Draft:
        """EAGLE-2's best-first tree, a level per head forward, grown where the head runs (`BestFirst`: read once,
        when complete); each node's feature is its parent's output (the root's: the newest committed entry's)."""
        assert self._last is not None
        if self.graphed and depth >= 2 and not stops_early(self.cfg.early_stop, self._last.device):
            graphed = self._in_graph("tree", depth, (depth - 1) * min(self.cfg.width, self.vocab))
            if graphed is not None:
                scores, ids, parents, mask, first = graphed
                return kept_draft(scores, ids, DeviceTree(parents, depth, mask=mask, first=first), depth)
        nodes = BestFirst(self.cfg.width, self.cfg.total_tokens, self._last.device)
        nodes.add_children(_full_logits(self.head, self.vocab, self._last[None]), carry=self._last[None])
        nodes.grow(depth, self._expand, self.cfg.early_stop)
        return nodes.draft()  # (on a device unread: the verdict reads it)

    # -- a step's drafting in one graph ----------------------------------------------------------------------------
    def _in_graph(self, kind: str, n: int, entries: int) -> tuple[torch.Tensor, ...] | None:
        """The chain of `n` tokens or the tree of `n` levels (`kind`), drafted by one captured graph (`HeadGraph`)
        that appends `entries` to the head's cache: its outputs (cloned), or None where it cannot run (a capture
        failed before). The same arithmetic as forward by forward on a `block` cache, so the same drafts."""
        if self.graphs.failed is not None or self.cache.capacity == 0:
            return None
        assert self._last is not None
        cache, device = self.cache, self._last.device
        c0 = cache.length
        cache.reserve(c0 + entries)
        # (what the body reads besides its static inputs: the tree's shape, the storage, the target's embeddings)
        capturing = device.type == "cuda" if self.captures is None else self.captures
        key = (kind, n, self.cfg.width, self.cfg.total_tokens, cache.capacity, cache.version,
               next(self.embed.parameters()).data_ptr(), capturing)
        graphs = self._held[0].graphs
        if any(k[5] != cache.version for k in graphs):  # the storage was made anew: its graphs are stale
            retire_graphs(graphs)
        free_retired_graphs()
        entry = graphs.get(key)
        fresh = entry is None
        if entry is None:
            entry = HeadGraph(kind, n, self._last, self.head, self.embed, cache, self.cfg, self.vocab)
        entry.last.copy_(self._last)
        entry.meta.copy_(torch.tensor([c0, self._entered - 1]), non_blocking=True)
        out = self.graphs.run(entry, fresh, None, capturing, device, lambda: cache.crop(c0))
        if out is None:
            return None
        if fresh:
            graphs[key] = entry
        cache.length = c0 + entries  # (as the forwards' appends would leave it; the next proposal crops them)
        self.forwards += n - 1
        return out

    def _expand(self, beam: Beam, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward of a beam (its nodes at `depth`, each fed its parent's output): their logits and outputs."""
        assert self._last is not None and beam.carry is not None
        allow = torch.cat([torch.ones(beam.sees.shape[0], self._committed, dtype=torch.bool, device=beam.sees.device),
                           beam.sees], 1)  # [Q, C0 + fed]: the committed entries, its ancestors and itself
        pos = torch.full((1, beam.nodes.numel()), self._entered - 1 + depth, device=self._last.device)
        out = self.head.step(self.embed(beam.tokens[None]), beam.carry[None], pos, self.cache, allow)[0]  # [Q, H]
        self.forwards += 1
        return _full_logits(self.head, self.vocab, out), out

    # -- learning the features of what was accepted ------------------------------------------------------------
    @torch.no_grad()
    def observe(self, verification: Verification) -> None:
        layers = verification.layers
        rows = layers[0].shape[0]  # P + k + S
        P = rows - (verification.logits.shape[0] - 1)
        start = self._n - P  # the context position of the first fed row
        path = self._accepted_path(verification)
        pick = list(range(P)) + [P + node for node in path]
        feats = self.head.fuse([t[pick] for t in layers])  # [P + a, H] positions start .. n - 1 + a
        if self._featured < start:  # a gap (the prompt was prefilled elsewhere): restart the cache here
            self.cache.crop(0)
            self._pending, self._committed, self._last = [], 0, None
            self._entered = self._featured = start
        skip = self._featured - start  # rows whose feature is already known (a tree's path fed again)
        if skip < feats.shape[0]:
            self._pending.append(feats[skip:])
            self._featured = start + feats.shape[0]

    def _accepted_path(self, v: Verification) -> list[int]:
        """The draft nodes accepted, root to leaf (a chain's first `accepted`)."""
        if v.nodes is None:
            return list(range(v.accepted))
        return list(v.nodes)


@dataclass(eq=False)
class HeadStorage(Storage):
    """A drafter's head cache with the graphs captured over it (`graphs`), kept after the drafter in its head's
    `StoragePool` (`_pool`): what cache/pool.py keeps of a model's dead caches. `key` is the cache's capacity once
    it is a block cache given back (`_give_back`); a host cache, or one never allocated, is not kept."""

    cache: DraftCache | None = None

    def clear(self) -> None:
        super().clear()
        self.cache = None


# each head's pool of dead drafters' block caches (at most `POOLED`, the oldest retired first): a drafter's first
# step takes one of its room, so a generation replays from its first step where an earlier one of the same room
# captured; the pool goes with its head (held once per model: heads/io.held), its graphs retired, never destroyed by
# the garbage collector
_POOLS: weakref.WeakKeyDictionary[Eagle3Head, StoragePool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _pool(head: Eagle3Head) -> StoragePool:
    with _POOLS_LOCK:
        pool = _POOLS.get(head)
        if pool is None:
            pool = _POOLS[head] = StoragePool(POOLED)
        return pool


def _give_back(pool: StoragePool, held: list[HeadStorage]) -> None:
    """A drafter's finalizer (holding its storage, never the drafter): a block cache goes to `pool`, keyed by its
    capacity; any other has its graphs retired."""
    storage = held[0]
    cache = storage.cache
    storage.key = (cache.capacity,) if cache is not None and cache.block and cache.capacity else None
    if cache is not None:
        cache.length = 0  # (what it held stays, masked: no query sees a column before it is written again)
    pool.give(storage)


class HeadGraph(StepGraph):
    """One step's drafting by the EAGLE-3 head in one graph (`Eagle3Drafter._in_graph`): the static inputs (the newest
    committed entry's output `last` `[H]`; `meta`: the committed entries, and the newest one's position), what the body
    reads in place (the head, held weakly; the target's embeddings; the block cache; the tree's shape) and the body,
    the chain's or the tree's. It holds no drafter, so it serves the next drafter that takes its cache (`_pool`)."""

    def __init__(self, kind: str, n: int, last: torch.Tensor, head: Eagle3Head, embed: torch.nn.Module,
                 cache: DraftCache, cfg: Eagle3SpecConfig, vocab: int) -> None:
        super().__init__()
        self.kind, self.n = kind, n
        self.last = torch.zeros_like(last)
        self.meta = torch.zeros(2, dtype=torch.long, device=last.device)
        # (weak: the head's pool holds its graphs, which must not keep it alive)
        self._head, self.embed, self.cache = weakref.ref(head), embed, cache
        self.width, self.total, self.vocab = cfg.width, cfg.total_tokens, vocab

    @property
    def head(self) -> Eagle3Head:
        head = self._head()
        assert head is not None, "a graph of a head that was freed"
        return head

    def body(self, arg: None) -> tuple[torch.Tensor, ...]:
        return self._chain() if self.kind == "chain" else self._tree()

    def _chain(self) -> tuple[torch.Tensor, ...]:
        """`Eagle3Drafter._chain` without reads, on the static inputs: each token's head forward writes its entry after
        the committed ones (`meta[0]` of them) and attends over the whole storage."""
        c0, p = self.meta[0:1], self.meta[1:2]
        cap = self.cache.capacity
        columns = torch.arange(cap, device=c0.device)
        h = self.last
        tokens = [_pick(self.head, self.head.logits(h))]
        for i in range(1, self.n):
            allow = (columns < c0 + i)[None]  # [1, capacity]: the committed entries, the chain's so far, itself
            out = self.head.step_at(self.embed(tokens[-1].view(1, 1)), h[None, None], (p + i).view(1, 1),
                                    self.cache, c0 + (i - 1), allow)
            h = out[0, -1]
            tokens.append(_pick(self.head, self.head.logits(h)))
        return (torch.stack(tokens),)

    def _tree(self) -> tuple[torch.Tensor, ...]:
        """`Eagle3Drafter._tree` without reads, on the static inputs: each level's beam writes its entries after the
        tree's so far and sees the committed entries, its ancestors and itself; then the kept nodes, with the ancestor
        mask and order the verification needs (`DeviceTree.shaped`)."""
        c0, p = self.meta[0:1], self.meta[1:2]
        cap = self.cache.capacity
        columns = torch.arange(cap, device=c0.device)
        nodes = BestFirst(self.width, self.total, c0.device)
        nodes.add_children(_full_logits(self.head, self.vocab, self.last[None]), carry=self.last[None])
        committed = (columns < c0)[None]  # [1, capacity]
        for depth in range(1, self.n):
            beam = nodes.beam()
            assert beam.carry is not None
            Q, F = beam.nodes.numel(), nodes.fed
            allow = committed.expand(Q, cap).clone()
            allow.scatter_(1, (c0 + torch.arange(F, device=c0.device))[None].expand(Q, F), beam.sees)
            out = self.head.step_at(self.embed(beam.tokens[None]), beam.carry[None], (p + depth).expand(1, Q),
                                    self.cache, c0 + (F - Q) + torch.arange(Q, device=c0.device), allow)[0]
            nodes.add_children(_full_logits(self.head, self.vocab, out), beam, out)
        scores, ids, parents = nodes._kept()
        tree = DeviceTree.shaped(parents, self.n)
        assert tree.mask is not None and tree.first is not None
        return scores, ids, parents, tree.mask, tree.first


@register_spec("spec.eagle3", config=Eagle3SpecConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: Eagle3SpecConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """EAGLE-3: a trained head drafts from the target's own features (chain, or tree=True); head=FOLDER."""
    check_rollback(model)
    head = eagle3_for(model, cfg.head or None)
    return speculative(model, batch, cfg, ctx, lambda generator: Eagle3Drafter(model, head, cfg))


def _pick(head: Eagle3Head, logits: torch.Tensor) -> torch.Tensor:
    return head.to_target(logits.argmax(-1))  # a 0-dim tensor where the logits are


def _full_logits(head: Eagle3Head, vocab: int, h: torch.Tensor) -> torch.Tensor:
    """`[Q, V]` target-vocabulary logits of outputs `[Q, H]`: -inf outside the draft vocabulary."""
    draft = head.logits(h).float()  # [Q, V']
    full = torch.full((draft.shape[0], vocab), float("-inf"), device=draft.device)
    ids = head.to_target(torch.arange(draft.shape[1], device=draft.device))
    full[:, ids] = draft
    return full
