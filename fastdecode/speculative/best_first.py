"""The best-first draft tree of EAGLE-2 (Li et al. 2024, arXiv 2406.16858, `topK_genrate`), shared by the drafters
that grow one (spec.dyntree with a draft model, spec.eagle3 with its head): nodes scored by their log path
probability under the draft, the `width` best of the newest level expanded, and the `total` best of all kept.

The tree grows where the draft's logits are and nothing of it is read (`BestFirst.draft`): the beam is chosen on the
device, what each beam node attends to is built there (`Beam.sees`), and the kept tree goes to the verification as a
`tree.DeviceTree`, whose shape the verdict reads with the argmaxes. A tree grown a level at a time with a read a level
made the host wait for the GPU once a level (issue #30); the authors' code reads once, when the tree is complete,
and once more for the verdict. Ties go to the node created first, as a stable sort gives on any device; scores are
float64 sums of the float32 log-probabilities, so the trees equal those of the host-side code this replaced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..models.base import on_host
from .drafter import Draft
from .tree import DeviceTree


def stops_early(early_stop: bool | None, device: torch.device) -> bool:
    """Whether a drafter asks `BestFirst.saturated` before each level: a drafter's `early_stop` setting, by default
    (None) on the host only, where the read costs nothing. On a device the check is a read a level (the host waits
    for the GPU), and leaving it out runs every level: the same tree, more draft forwards (docs/gpu.md, "Trees read
    once"); which costs more is the device's to measure, hence the setting."""
    return on_host(device) if early_stop is None else early_stop


@dataclass(frozen=True)
class Beam:
    """The nodes of a level chosen to be fed to the draft (and given children), best first."""

    nodes: torch.Tensor  # [Q] node indices
    tokens: torch.Tensor  # [Q]
    sees: torch.Tensor  # [Q, F] bool over the nodes fed so far, in the order fed (these Q last): its ancestors, itself
    carry: torch.Tensor | None  # [Q, ...] what each node's parent handed down (EAGLE-3: the parent's output)


class BestFirst:
    """Every node generated this step, in creation order (parents before children), as tensors where the draft is.

    `add_children` gives the root or a beam its `width` likeliest children each; `beam` picks the `width` best of the
    newest level and feeds them (they take the next columns of the fed order); `best` reads the kept tree once.
    A token the draft cannot propose (-inf: outside a reduced draft vocabulary) is a node scored -inf, never kept."""

    def __init__(self, width: int, total: int, device: torch.device) -> None:
        self.width, self.total, self.device = width, total, device
        self.tokens = torch.zeros(0, dtype=torch.long, device=device)
        self.parents = torch.zeros(0, dtype=torch.long, device=device)  # -1: a child of the root
        self.scores = torch.zeros(0, dtype=torch.float64, device=device)  # log path probability under the draft
        self.sees = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [N, F] each node's ancestors among the fed
        self.carry: torch.Tensor | None = None
        self.fed = 0  # nodes fed to the draft so far (the columns of `sees`)
        self.levels = 0  # levels made: the depth of the newest
        self._level = 0  # where the newest level starts

    def add_children(self, logits: torch.Tensor, beam: Beam | None = None, carry: torch.Tensor | None = None) -> None:
        """Children for each beam node (the root when None): `logits` `[Q, V]`, one row per beam node; `carry`
        `[Q, ...]` what each hands down to its children."""
        logq = logits.float().log_softmax(-1)  # [Q, V]
        top = logq.topk(min(self.width, logq.shape[-1]), dim=-1)
        self.add_top(top.values, top.indices, beam, carry)

    def add_top(self, logq: torch.Tensor, ids: torch.Tensor, beam: Beam | None = None,
                carry: torch.Tensor | None = None) -> None:
        """`add_children` from each row's candidates already chosen: `ids` `[Q, w]` and their log-probabilities
        `logq`, best first (the row's top-w)."""
        Q, w = ids.shape
        if beam is None:
            base = torch.zeros(1, dtype=torch.float64, device=self.device)
            parents = torch.full((1,), -1, dtype=torch.long, device=self.device)
            sees = torch.zeros(1, self.fed, dtype=torch.bool, device=self.device)
        else:
            base, parents, sees = self.scores[beam.nodes], beam.nodes, beam.sees
        # <= the parent's score: clamp keeps rounding from breaking this, so the kept set is closed under ancestors
        scores = base[:, None] + logq.clamp(max=0.0).double()  # [Q, w]
        self._level = self.tokens.numel()
        self.levels += 1
        self.tokens = torch.cat([self.tokens, ids.reshape(-1)])
        self.parents = torch.cat([self.parents, parents[:, None].expand(Q, w).reshape(-1)])
        self.scores = torch.cat([self.scores, scores.reshape(-1)])
        self.sees = torch.cat([self.sees, sees[:, None].expand(Q, w, self.fed).reshape(Q * w, self.fed)])
        if carry is not None:
            new = carry[:, None].expand(Q, w, *carry.shape[1:]).reshape(Q * w, *carry.shape[1:])
            self.carry = new if self.carry is None else torch.cat([self.carry, new])

    def beam(self) -> Beam:
        """The `width` best nodes of the newest level (ties: the first created), fed next."""
        n = self.tokens.numel() - self._level
        order = torch.sort(self.scores[self._level :], descending=True, stable=True).indices[: self.width]
        nodes = order + self._level
        Q, F = min(self.width, n), self.fed
        self.sees = torch.cat([self.sees, torch.zeros(self.sees.shape[0], Q, dtype=torch.bool, device=self.device)], 1)
        rows = self.sees[nodes]
        rows[torch.arange(Q, device=self.device), F + torch.arange(Q, device=self.device)] = True  # each sees itself
        self.sees[nodes] = rows  # (its children copy the row)
        self.fed = F + Q
        return Beam(nodes, self.tokens[nodes], rows, self.carry[nodes] if self.carry is not None else None)

    def grow(self, levels: int, expand: Callable[[Beam, int], tuple[torch.Tensor, torch.Tensor | None]],
             early_stop: bool | None = None) -> None:
        """The levels after the root's children (given first, `add_children`), up to `levels` deep: each time the
        beam is chosen and `expand(beam, depth)` gives its rows' logits `[Q, V]` (the beam's nodes sit at `depth`)
        and what they hand down to their children (or None); stopped early once no child could be kept where
        `stops_early` says so."""
        stop = stops_early(early_stop, self.device)
        for depth in range(1, levels):
            beam = self.beam()
            if stop and self.saturated(beam):
                break
            logits, carry = expand(beam, depth)
            self.add_children(logits, beam, carry)

    def paths(self, beam: Beam, depth: int) -> torch.Tensor:
        """`[Q, depth]` the tokens from the root's child down to each beam node (all at `depth`)."""
        out, node = [], beam.nodes
        for _ in range(depth):
            out.append(self.tokens[node])
            node = self.parents[node]
        return torch.stack(out[::-1], 1)

    def saturated(self, beam: Beam) -> bool:
        """Whether no child of the beam could be kept: `total` nodes already score at least the beam's best (or no
        beam node can be proposed). Reads the scores (`stops_early`)."""
        best = self.scores.index_select(0, beam.nodes[:1])  # [1]
        return bool((best == float("-inf")) | ((self.scores >= best).sum() >= self.total))  # (one read)

    def draft(self) -> Draft:
        """The kept tree as a draft: on the host read once (`best`); on a device left there (`kept`), for its verdict
        to read (`tree.DeviceTree`)."""
        return kept_draft(*self._kept(), self.levels)

    def best(self) -> tuple[list[int], list[int]]:
        """`(tokens, parents)` of the kept tree (`kept`) on the host, one read, without its nodes scored -inf (a token
        the draft cannot propose; a child of one scores -inf too, so what is left is a tree), parents renumbered."""
        return _read_kept(*self._kept())

    def kept(self) -> tuple[torch.Tensor, DeviceTree]:
        """The `total` best nodes in creation order (closed under ancestors: a child never scores above its parent)
        where the tree grew, nothing read: tokens `[N]` and a `DeviceTree`. The number of nodes must be known on the
        host, so nodes scored -inf are kept where fewer than `total` others were made: N = min(total, nodes made).
        They are verified as any other node is (a token equal to the target's choice is accepted, which is lossless
        whatever proposed it); `best`, the host's, drops them."""
        _, ids, parents = self._kept()
        return ids, DeviceTree(parents, self.levels)

    def _kept(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kept nodes' scores `[N]` (in creation order), tokens and parents renumbered among them (-1: the root)."""
        made = self.tokens.numel()
        N = min(self.total, made)
        keep = torch.sort(self.scores, descending=True, stable=True).indices[:N].sort().values
        place = torch.full((made,), -1, dtype=torch.long, device=self.device)
        place.index_copy_(0, keep, torch.arange(N, device=self.device))  # a kept node's place among the kept
        up = self.parents.index_select(0, keep)
        parents = torch.where(up < 0, up, place.index_select(0, up.clamp(min=0)))
        return self.scores.index_select(0, keep), self.tokens.index_select(0, keep), parents


def kept_draft(scores: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor | DeviceTree, levels: int) -> Draft:
    """A best-first tree's kept nodes (`BestFirst._kept`: scores, tokens, parents) as a draft: on the host read once,
    the nodes scored -inf dropped (`BestFirst.best`); on a device left there as a `tree.DeviceTree` of `levels` (or
    the one given, with what was computed with it)."""
    tree = parents if isinstance(parents, DeviceTree) else DeviceTree(parents, levels)
    if on_host(ids.device):
        tokens, left = _read_kept(scores, ids, tree.parents)
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=left)
    return Draft(ids, parents=tree)


def _read_kept(scores: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor) -> tuple[list[int], list[int]]:
    """`BestFirst.best` of kept nodes: one read, the nodes scored -inf dropped, parents renumbered."""
    values = torch.cat([ids, parents, (scores > float("-inf")).long()]).tolist()
    n = ids.numel()
    index = {-1: -1}  # a kept node's place among those left
    tokens: list[int] = []
    left: list[int] = []
    for i, (token, parent, ok) in enumerate(zip(values[:n], values[n : 2 * n], values[2 * n :], strict=True)):
        if ok:
            index[i] = len(tokens)
            tokens.append(token)
            left.append(index[parent])
    return tokens, left
