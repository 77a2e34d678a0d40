"""spec.medusa: Medusa heads (Cai et al. 2024, arXiv 2401.10774) draft a token tree from the target's last hidden
state; `hydra=true` drafts with Hydra heads (Ankner et al. 2024, arXiv 2402.05109), each of which also reads the
tokens on the path it extends.

After each verification the drafter keeps h, the target's hidden state at the last accepted position, whose own
next token (the bonus token) ends the context. Head k guesses the (k + 1)-th token after it. The tree is grown level
by level, as EAGLE-2 grows its own: the `width` best nodes of the newest level each get the `width` likeliest tokens
of the next head, a node scoring the sum of its path's log-probabilities; then the `total_tokens` best nodes are kept
(a child never outscores its parent, so the kept set is a tree). Medusa's heads do not see the path, so one forward
of all heads gives every level; Hydra's run once per level on the beam's paths. The target verifies the tree in one
forward (`tree.verify_tree_greedy`, or rejection sampling with q one-hot), so the output is the target's exactly.
The first step of a request drafts nothing: the heads need the prompt's hidden state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...heads import head_for
from ...heads.hydra import HydraHead
from ...heads.medusa import MedusaHead, target_embeddings, target_lm_head
from ...heads.medusa_layout import is_medusa_layout, load_medusa_layout
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import speculative
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

    def __post_init__(self) -> None:
        super().__post_init__()
        check(1 <= self.total_tokens <= MAX_NODES, "total_tokens", self.total_tokens, f"must be in [1, {MAX_NODES}]")
        check(self.width >= 1, "width", self.width, "must be at least 1")
        check(self.depth >= 0, "depth", self.depth, "must be 0 (one level per head) or more")


def read_top(logits: torch.Tensor, width: int) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's `width` likeliest tokens of `logits` `[R, V]` and their log-probabilities (at most 0), in one read
    (one synchronisation on a GPU): the float32 values travel as their bits in the indices' integer copy."""
    logq = logits.float().log_softmax(-1)  # [R, V]
    top = logq.topk(min(width, logq.shape[-1]), dim=-1)
    both = torch.cat([top.indices, float_bits(top.values.clamp(max=0.0))], dim=-1).tolist()  # [R, 2w]
    w = top.indices.shape[-1]
    return [row[:w] for row in both], [from_bits(row[w:]) for row in both]


@dataclass
class _Tree:
    """Nodes in creation order (parents first), each with its token, parent (-1 = root) and log path score."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]

    def grow(self, beam: list[int], logits: torch.Tensor, width: int) -> list[int]:
        """Give each beam node (-1 = the root) the `width` likeliest tokens of its row of `logits` `[len(beam), V]`."""
        return self.grow_from(beam, *read_top(logits, width))

    def grow_from(self, beam: list[int], ids: list[list[int]], logq: list[list[float]]) -> list[int]:
        """Give each beam node its row's candidates: `ids` and their log-probabilities `logq` (`read_top`)."""
        new = []
        for parent, row, lq in zip(beam, ids, logq, strict=True):
            base = self.scores[parent] if parent >= 0 else 0.0
            for token, s in zip(row, lq, strict=True):
                new.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(parent)
                self.scores.append(base + s)
        return new

    def best(self, nodes: list[int], n: int) -> list[int]:
        """The `n` best nodes, best first; ties to the node made first (a parent before its children)."""
        return sorted(nodes, key=lambda i: (-self.scores[i], i))[:n]

    def path(self, node: int) -> list[int]:
        """Tokens from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]


class MedusaDrafter(BaseDrafter):
    """One row's drafter: keeps the target's hidden state at the last accepted position and grows a tree from it."""

    needs_hidden = True
    tree_drafts = True

    def __init__(self, model: CausalLM, head: MedusaHead | HydraHead, cfg: MedusaSpecConfig) -> None:
        self.head = head
        self.cfg = cfg
        self.lm_head = target_lm_head(model) if head.config.tie_lm_head else None  # [V, H]
        self.embed = target_embeddings(model) if isinstance(head, HydraHead) else None  # [V, H]
        self.levels = min(cfg.depth or head.config.num_heads, head.config.num_heads)
        self.hidden: torch.Tensor | None = None  # [H] the target's state whose next token ends the context
        self.tree: Draft | None = None
        self.calls = 0

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.calls

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, k: int) -> Draft:
        levels = min(self.levels, k)
        if self.hidden is None or levels < 1:
            self.tree = None
            return Draft.empty()
        tree = _Tree([], [], [])
        if isinstance(self.head, HydraHead):
            self._grow_hydra(tree, int(context[-1]), levels)
        else:
            self._grow_medusa(tree, levels)
        keep = sorted(tree.best(list(range(len(tree.tokens))), self.cfg.total_tokens))  # parents first
        index = {node: i for i, node in enumerate(keep)}
        parents = [index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep]
        self.tree = Draft(torch.tensor([tree.tokens[i] for i in keep], dtype=torch.long), parents=parents)
        return self.tree

    def _grow_medusa(self, tree: _Tree, levels: int) -> None:
        assert self.hidden is not None and isinstance(self.head, MedusaHead)
        logits = self.head.logits(self.hidden[None], self.lm_head)[:levels, 0]  # [levels, V]: one forward, all heads
        self.calls += 1
        # every node of a level gets its head's candidates: all levels' in one read
        ids, logq = read_top(logits, self.cfg.width)
        level = tree.grow_from([-1], ids[:1], logq[:1])
        for d in range(1, levels):
            beam = tree.best(level, self.cfg.width)
            level = tree.grow_from(beam, [ids[d]] * len(beam), [logq[d]] * len(beam))

    def _grow_hydra(self, tree: _Tree, last: int, levels: int) -> None:
        assert self.hidden is not None and self.embed is not None and isinstance(self.head, HydraHead)
        beam: list[int] = [-1]
        for d in range(levels):
            paths = torch.tensor([[last] + tree.path(b) for b in beam])  # [B, d + 1]: the bonus token, then drafts
            feats = self.embed[paths].to(self.hidden.dtype)  # [B, d + 1, H]
            logits = self.head.head_logits(d, self.hidden.expand(len(beam), -1), feats, self.lm_head)  # [B, V]
            self.calls += 1
            level = tree.grow(beam, logits, self.cfg.width)
            beam = tree.best(level, self.cfg.width)

    def observe(self, verification: Verification) -> None:
        """Keep the hidden state of the last accepted node (the root when none was): its next token ends the
        context now."""
        node = -1
        if self.tree is not None and verification.accepted:
            node = _accepted_node(self.tree, verification.tokens[: verification.accepted])
        states = verification.node_hidden
        assert states is not None, "spec.medusa declares needs_hidden: the driver must hand over hidden states"
        self.hidden = states[node + 1]


def _accepted_node(draft: Draft, accepted: tuple[int, ...]) -> int:
    """The node ending the accepted path: from the root, the child holding each accepted token in turn (siblings
    hold distinct tokens, so the path is unique)."""
    tokens = draft.tokens.tolist()
    parents = draft.parents if draft.parents is not None else list(range(-1, len(tokens) - 1))
    node = -1
    for token in accepted:
        node = next(i for i, (t, p) in enumerate(zip(tokens, parents, strict=True)) if p == node and t == token)
    return node


def _head(model: CausalLM, cfg: MedusaSpecConfig) -> MedusaHead | HydraHead:
    kind = "hydra" if cfg.hydra else "medusa"
    if cfg.head and not cfg.hydra and is_medusa_layout(cfg.head):  # heads saved by the Medusa authors' code
        return load_medusa_layout(cfg.head, model)
    head = head_for(model, kind, cfg.head or None)
    assert isinstance(head, (MedusaHead, HydraHead))
    return head


@register_spec("spec.medusa", config=MedusaSpecConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: MedusaSpecConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Medusa heads draft a tree from the target's last hidden state (hydra=true: Hydra heads); head=FOLDER."""
    head = _head(model, cfg)
    return speculative(model, batch, cfg, ctx, lambda generator: MedusaDrafter(model, head, cfg))
