"""spec.medusa: Medusa heads (Cai et al. 2024, arXiv 2401.10774) draft a token tree from the target's last hidden
state; `hydra=true` drafts with Hydra heads (Ankner et al. 2024, arXiv 2402.05109), each of which also reads the
tokens on the path it extends.

After each verification the drafter keeps h, the target's hidden state at the last accepted position, whose own
next token (the bonus token) ends the context. Head k guesses the (k + 1)-th token after it. The tree is grown level
by level, as EAGLE-2 grows its own: the `width` best nodes of the newest level each get the `width` likeliest tokens
of the next head, a node scoring the sum of its path's log-probabilities; then the `total_tokens` best nodes are kept
(a child never outscores its parent, so the kept set is a tree; `best_first.py`). Medusa's heads do not see the
path, so one forward of all heads gives every level, read at once (on a device with the verdict before: the heads
run on every verified row, `MedusaDrafter.ahead`), and its tree grows on the host; Hydra's run once
per level on the beam's paths, and its tree grows where they run and is read with its verdict (`tree.DeviceTree`).
The target verifies the tree in one forward (`tree.verify_tree_greedy`, or rejection sampling with q one-hot), so
the output is the target's exactly.
The first step of a request drafts nothing: the heads need the prompt's hidden state.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ...cache.pool import free_retired_graphs
from ...config import check
from ...heads import head_for
from ...heads.hydra import HydraHead
from ...heads.io import held
from ...heads.medusa import MedusaHead, target_embeddings, target_lm_head
from ...heads.medusa_layout import is_medusa_layout, load_medusa_layout
from ...models.base import on_host
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..best_first import Beam, BestFirst, kept_draft
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import speculative
from ..step_graph import StepGraph, StepGraphs
from ..tree import DeviceTree
from ..verify import float_bits, from_bits

MAX_NODES = 64  # a larger tree costs more to verify than it can gain on a CPU (v(32) = 2.33 target steps)


@dataclass(frozen=True)
class MedusaSpecConfig(SpecConfig):
    hydra: bool = False  # draft with Hydra heads (each reads the path it extends) instead of Medusa's
    # a head folder (fastdecode's, or Medusa's own layout: medusa_lm_head.safetensors) or zoo:<model>/<name>;
    # "" = the one shipped beside a zoo target
    head: str = ""
    total_tokens: int = 16  # draft tree nodes (the verification forward feeds them all)
    width: int = 4  # nodes expanded per level, and children given to each
    depth: int = 0  # deepest draft; 0 = one level per head
    # hydra: grow the tree in one captured graph a step (`HydraGraph`): None = on CUDA; True elsewhere runs the same
    # body without capturing (tests), False grows it level by level
    graph: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(1 <= self.total_tokens <= MAX_NODES, "total_tokens", self.total_tokens, f"must be in [1, {MAX_NODES}]")
        check(self.width >= 1, "width", self.width, "must be at least 1")
        check(self.depth >= 0, "depth", self.depth, "must be 0 (one level per head) or more")
        check(not (self.graph and not self.hydra), "graph", self.graph,
              "grows Hydra's tree in one graph: Medusa's tree grows on the host from one forward of its heads; set "
              "hydra=true or leave graph unset")


class MedusaDrafter(BaseDrafter):
    """One row's drafter: keeps the target's hidden state at the last accepted position and grows a tree from it.

    Medusa's heads (not Hydra's) can run on every row the verification scored before its verdict is known, as the
    authors' code runs them on every tree position in the verification forward: their candidates then come in the
    verdict's read (`reads`), and `observe` keeps the accepted node's; one read a step, where running them after
    the verdict on the accepted node's state reads once more. `ahead` chooses: None (the default) on a device only,
    where a read makes the host wait (on the CPU the heads then run on one row instead of 1 + k)."""

    ahead: bool | None = None
    # whether Hydra's step graph is captured (None: on CUDA; elsewhere its body runs again each step, capture-free)
    captures: bool | None = None

    needs_hidden = True
    tree_drafts = True

    def __init__(self, model: CausalLM, head: MedusaHead | HydraHead, cfg: MedusaSpecConfig) -> None:
        self.head = head
        self.cfg = cfg
        self.lm_head = target_lm_head(model) if head.config.tie_lm_head else None  # [V, H]
        self.embed = target_embeddings(model) if isinstance(head, HydraHead) else None  # [V, H]
        self.levels = min(cfg.depth or head.config.num_heads, head.config.num_heads)
        self.hidden: torch.Tensor | None = None  # [H] the target's state whose next token ends the context
        # [levels, 2w] on the host: the heads' candidates at that state, where they came with the verdict (`reads`)
        self.candidates: torch.Tensor | None = None
        self.calls = 0

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.calls

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, k: int) -> Draft:
        levels = min(self.levels, k)
        if (self.hidden is None and self.candidates is None) or levels < 1:
            return Draft.empty()
        if isinstance(self.head, HydraHead):
            assert self.hidden is not None and self.embed is not None
            graphed = self._in_graph(context[-1:], levels)
            if graphed is not None:
                return graphed
            nodes = BestFirst(self.cfg.width, self.cfg.total_tokens, self.hidden.device)
            self.calls += grow_hydra(nodes, self.head, self.hidden, self.embed, self.lm_head,
                                     context[-1:].to(self.hidden.device), levels)
        else:
            if self.candidates is None:  # (read now: the heads run on the accepted node's state alone)
                assert self.hidden is not None
                self.candidates = self._candidates(self.hidden[None])[:, 0].cpu()
            nodes = self._grow_medusa(self.candidates[:levels])
        return nodes.draft()  # (Hydra's on a device unread: the verdict reads it)

    def _ahead(self, device: torch.device) -> bool:
        return not isinstance(self.head, HydraHead) and (not on_host(device) if self.ahead is None else self.ahead)

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None) -> torch.Tensor | None:
        """Where the heads run ahead (`ahead`): their candidates at every row scored, `[levels, 1 + k, 2w]`."""
        if hidden is None or not self._ahead(hidden.device):
            return None
        return self._candidates(hidden)

    @torch.inference_mode()
    def _candidates(self, hidden: torch.Tensor) -> torch.Tensor:
        """One forward of all heads on states `[R, H]`: each level's `width` likeliest tokens after each state and
        their log-probabilities, `[levels, R, 2w]` integers (the indices, then the float32 bits of the values:
        `verify.float_bits`) where the heads run, to read in one copy."""
        assert isinstance(self.head, MedusaHead)
        logits = self.head.logits(hidden, self.lm_head)[: self.levels]  # [levels, R, V]: one forward, all heads
        self.calls += 1
        top = logits.float().log_softmax(-1).topk(min(self.cfg.width, logits.shape[-1]), dim=-1)
        return torch.cat([top.indices, float_bits(top.values)], dim=-1)

    def _grow_medusa(self, candidates: torch.Tensor) -> BestFirst:
        """The tree from one state's candidates, `[levels, 2w]` on the host (`_candidates`): one forward of all heads
        gave every level's, so each beam node gets the same candidates of its level's head, and the tree grows on the
        host, where its bookkeeping launches nothing on a GPU."""
        levels, w = candidates.shape[0], candidates.shape[1] // 2
        ids, logq = candidates[:, :w], from_bits(candidates[:, w:])
        nodes = BestFirst(self.cfg.width, self.cfg.total_tokens, torch.device("cpu"))
        nodes.add_top(logq[:1], ids[:1])
        for d in range(1, levels):
            beam = nodes.beam()
            Q = beam.nodes.numel()
            nodes.add_top(logq[d : d + 1].expand(Q, -1), ids[d : d + 1].expand(Q, -1), beam)
        return nodes

    def _in_graph(self, last: torch.Tensor, levels: int) -> Draft | None:
        """Hydra's tree of `levels` grown by one captured graph (`HydraGraph`, kept by the head for every drafter
        of it and every generation): None where it does not run (`graph`; fewer than two levels; a capture failed)."""
        assert self.hidden is not None and self.embed is not None and isinstance(self.head, HydraHead)
        device = self.hidden.device
        on = self.cfg.graph if self.cfg.graph is not None else device.type == "cuda"
        runs = StepGraphs.of(self.head, "spec.medusa:hydra=true")  # (the head's: its drafters share its graphs)
        if not on or levels < 2 or runs.failed is not None:
            return None
        capturing = device.type == "cuda" if self.captures is None else self.captures
        key = (levels, self.cfg.width, self.cfg.total_tokens, self.hidden.shape[-1], self.hidden.dtype, device,
               self.embed.data_ptr(), None if self.lm_head is None else self.lm_head.data_ptr(), capturing)
        free_retired_graphs()
        entry = runs.kept.get(key)
        fresh = entry is None
        if not isinstance(entry, HydraGraph):
            entry = HydraGraph(self.head, self.embed, self.lm_head, self.cfg, levels, self.hidden)
        entry.hidden.copy_(self.hidden)
        entry.last.copy_(last, non_blocking=True)
        out = runs.run(entry, fresh, None, capturing, device, lambda: None)
        if out is None:
            return None
        if fresh:
            runs.kept[key] = entry
        self.calls += levels
        scores, ids, parents, mask, first = out
        return kept_draft(scores, ids, DeviceTree(parents, levels, mask=mask, first=first), levels)

    def observe(self, verification: Verification) -> None:
        """Keep the hidden state of the last accepted node (the root when none was): its next token ends the
        context now; where the heads ran ahead, keep that node's candidates, read with the verdict."""
        nodes = verification.nodes or range(verification.accepted)  # (a chain: an empty draft, or a linear tree)
        node = nodes[-1] if verification.accepted else -1
        states = verification.node_hidden
        assert states is not None, "spec.medusa declares needs_hidden: the driver must hand over hidden states"
        self.hidden = states[node + 1]
        self.candidates = None
        if self._ahead(states.device):  # (they came with the verdict)
            self.candidates = self.asked(verification)[:, node + 1]  # [levels, 1 + k, 2w] -> the node's


def grow_hydra(nodes: BestFirst, head: HydraHead, hidden: torch.Tensor, embed: torch.Tensor,
               lm_head: torch.Tensor | None, first: torch.Tensor, levels: int) -> int:
    """Grow `nodes` `levels` deep with Hydra's heads (no early stop): head d reads the path it extends, the bonus
    token `first` `[1]` (on the heads' device), then each beam node's drafts. Returns the head forwards run."""
    calls = 0

    def logits(paths: torch.Tensor, d: int) -> torch.Tensor:  # [B, d + 1] paths -> head d's [B, V]
        nonlocal calls
        calls += 1
        feats = embed[paths].to(hidden.dtype)  # [B, d + 1, H]
        return head.head_logits(d, hidden.expand(paths.shape[0], -1), feats, lm_head)

    def expand(beam: Beam, d: int) -> tuple[torch.Tensor, None]:
        paths = torch.cat([first.expand(beam.nodes.numel(), 1), nodes.paths(beam, d)], 1)  # [Q, d + 1]
        return logits(paths, d), None

    nodes.add_children(logits(first[None], 0))
    nodes.grow(levels, expand, early_stop=False)
    return calls


class HydraGraph(StepGraph):
    """Hydra's tree grown in one graph (`MedusaDrafter._in_graph`): the static inputs (the target's state `hidden`
    `[H]`, the bonus token `last` `[1]`), what the body reads in place (the head, held weakly; the target's
    embeddings and lm_head), and the body: every level's beam, head forward and children, then the kept nodes with
    their ancestor mask and order (`DeviceTree.shaped`). On a GPU each level was about 20 launches from the host."""

    def __init__(self, head: HydraHead, embed: torch.Tensor, lm_head: torch.Tensor | None, cfg: MedusaSpecConfig,
                 levels: int, hidden: torch.Tensor) -> None:
        super().__init__()
        self._head, self.embed, self.lm_head = weakref.ref(head), embed, lm_head
        self.width, self.total, self.levels = cfg.width, cfg.total_tokens, levels
        self.hidden = torch.zeros_like(hidden)
        self.last = torch.zeros(1, dtype=torch.long, device=hidden.device)

    def body(self, arg: None) -> tuple[torch.Tensor, ...]:
        head = self._head()
        assert head is not None, "a graph of a head that was freed"
        nodes = BestFirst(self.width, self.total, self.hidden.device)
        grow_hydra(nodes, head, self.hidden, self.embed, self.lm_head, self.last, self.levels)
        scores, ids, parents = nodes._kept()
        tree = DeviceTree.shaped(parents, self.levels)
        assert tree.mask is not None and tree.first is not None
        return scores, ids, parents, tree.mask, tree.first


def _head(model: CausalLM, cfg: MedusaSpecConfig) -> MedusaHead | HydraHead:
    kind = "hydra" if cfg.hydra else "medusa"
    if cfg.head and not cfg.hydra and is_medusa_layout(cfg.head):  # heads saved by the Medusa authors' code
        folder = cfg.head
        return held(model, ("medusa-layout", folder), Path(folder).expanduser(),
                    lambda: load_medusa_layout(folder, model))
    head = head_for(model, kind, cfg.head or None)
    assert isinstance(head, (MedusaHead, HydraHead))
    return head


@register_spec("spec.medusa", config=MedusaSpecConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: MedusaSpecConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Medusa heads draft a tree from the target's last hidden state (hydra=true: Hydra heads); head=FOLDER."""
    head = _head(model, cfg)
    return speculative(model, batch, cfg, ctx, lambda generator: MedusaDrafter(model, head, cfg))
