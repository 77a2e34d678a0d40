"""spec.eagle3: EAGLE-3 drafting (Li et al. 2025, arXiv 2503.01840): a trained head reads three of the target's
own layers and drafts with one decoder layer of its own, whose KV cache holds one entry per context token.

Entry j pairs the target's fused feature of token j (from a verification forward: `hidden_layers`,
`Verification.layers`) with the embedding of token j + 1, and its output predicts token j + 2. A chain then feeds
each drafted token with the layer's own last output; a rejected draft's entries are cropped and the accepted tokens
enter with the target's features instead, as in the authors' code. `tree=True` grows EAGLE-2's best-first tree
(`best_first.py`) of at most `total_tokens` nodes with the same head, a level per head forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...heads.eagle3 import DraftCache, Eagle3Head, target_embeddings
from ...heads.eagle3_io import eagle3_for
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..best_first import Beam, BestFirst
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import check_rollback, speculative
from ..model_chain import reads_each_token

MAX_NODES = 64


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

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_draft_tokens >= 1, "num_draft_tokens", self.num_draft_tokens, "must be at least 1")
        check(1 <= self.total_tokens <= MAX_NODES, "total_tokens", self.total_tokens, f"must be in [1, {MAX_NODES}]")
        check(self.width >= 1, "width", self.width, "must be at least 1")


class Eagle3Drafter(BaseDrafter):
    """One row's EAGLE-3 drafter: the head's cache of committed entries, the fused features not yet entered."""

    # whether the chain reads each token as it comes (None: on the CPU only; tests set False to run a GPU's path)
    read_each_token: bool | None = None

    def __init__(self, model: CausalLM, head: Eagle3Head, cfg: Eagle3SpecConfig) -> None:
        self.head, self.cfg = head, cfg
        self.hidden_layers = head.config.layers
        self.tree_drafts = cfg.tree
        self.embed = target_embeddings(model)
        self.eos = model.eos_token_ids
        self.vocab = model.vocab_size
        self.cache = DraftCache()
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

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        return self.head.to_target(logits.argmax(-1))  # a 0-dim tensor where the logits are

    def _chain(self, k: int) -> Draft:
        """At most k tokens, each the head's argmax. On a GPU the loop reads nothing: the chain goes to the
        verification unread, which reads it with its verdict (one synchronisation a step, issue #30), and an end of
        text among the drafts ends the output where the driver settles the step; on the CPU each token is read as
        it comes and the chain stops at an end of text (`read_each_token`, as a draft model's chain)."""
        assert self._last is not None
        h, p = self._last, self._entered - 1  # the newest entry sits at position p; chain step i at p + i
        each = reads_each_token(self.read_each_token, h.device)
        tokens = [self._pick(self.head.logits(h))]
        for i in range(1, k):
            if each and int(tokens[-1]) in self.eos:
                break
            allow = torch.ones(1, self.cache.length + 1, dtype=torch.bool)
            out = self.head.step(self.embed(tokens[-1].view(1, 1)), h[None, None],
                                 torch.tensor([[p + i]], device=h.device), self.cache, allow)
            self.forwards += 1
            h = out[0, -1]
            tokens.append(self._pick(self.head.logits(h)))
        return Draft(torch.stack(tokens))

    def _tree(self, depth: int) -> Draft:
        """EAGLE-2's best-first tree, a level per head forward, grown where the head runs (`BestFirst`: read once,
        when complete); each node's feature is its parent's output (the root's: the newest committed entry's)."""
        assert self._last is not None
        nodes = BestFirst(self.cfg.width, self.cfg.total_tokens, self._last.device)
        nodes.add_children(self._full_logits(self._last[None]), carry=self._last[None])
        nodes.grow(depth, self._expand, self.cfg.early_stop)
        return nodes.draft()  # (on a device unread: the verdict reads it)

    def _expand(self, beam: Beam, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward of a beam (its nodes at `depth`, each fed its parent's output): their logits and outputs."""
        assert self._last is not None and beam.carry is not None
        allow = torch.cat([torch.ones(beam.sees.shape[0], self._committed, dtype=torch.bool, device=beam.sees.device),
                           beam.sees], 1)  # [Q, C0 + fed]: the committed entries, its ancestors and itself
        pos = torch.full((1, beam.nodes.numel()), self._entered - 1 + depth, device=self._last.device)
        out = self.head.step(self.embed(beam.tokens[None]), beam.carry[None], pos, self.cache, allow)[0]  # [Q, H]
        self.forwards += 1
        return self._full_logits(out), out

    def _full_logits(self, h: torch.Tensor) -> torch.Tensor:
        """`[Q, V]` target-vocabulary logits of outputs `[Q, H]`: -inf outside the draft vocabulary."""
        draft = self.head.logits(h).float()  # [Q, V']
        full = torch.full((draft.shape[0], self.vocab), float("-inf"), device=draft.device)
        ids = self.head.to_target(torch.arange(draft.shape[1], device=draft.device))
        full[:, ids] = draft
        return full

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


@register_spec("spec.eagle3", config=Eagle3SpecConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: Eagle3SpecConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """EAGLE-3: a trained head drafts from the target's own features (chain, or tree=True); head=FOLDER."""
    check_rollback(model)
    head = eagle3_for(model, cfg.head or None)
    return speculative(model, batch, cfg, ctx, lambda generator: Eagle3Drafter(model, head, cfg))
