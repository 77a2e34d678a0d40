"""Token trees: attention masks, depth positions and verification of many candidate continuations at once.

A tree of T nodes is given by `tokens [T]` and `parents [T]` (the parent's node index, -1 for a child of the
root, i.e. of the last context token), parents listed before their children. In the verification forward
each node attends to the context and to its ancestors and sits at position (last context position + depth),
as in SpecInfer (Miao et al. 2024) and Medusa. Logit row 0 belongs to the root, row i + 1 to node i.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .verify import Reading, Verdict, as_read, wanted, with_drafts


@dataclass(frozen=True)
class DeviceTree:
    """A tree's shape left where a drafter grew it (a best-first tree on a GPU: `BestFirst.kept`), so that nothing of
    it is read before the verdict, which reads it with the argmaxes (issue #30: one synchronisation a step). The
    verification forward's mask and positions are built there (`ancestor_mask`, `node_depths`); the verdict gives the
    parents back on the host (`Verdict.parents`), and the driver goes on with them as with a host tree."""

    parents: torch.Tensor  # [T] long, -1 for a child of the root, parents listed before their children
    depth: int  # a bound on the deepest node, known on the host (the levels grown)
    order: torch.Tensor | None = None  # [T] where `reordered`: node j is the drafter's node order[j]
    # computed with the tree where a drafter did so (`shaped`: a best-first tree grown in one graph computes them in
    # it), else None: its `ancestor_mask` [T, T] and its `branch_first` order [T]
    mask: torch.Tensor | None = None
    first: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.parents.numel()

    @staticmethod
    def shaped(parents: torch.Tensor, depth: int) -> DeviceTree:
        """The tree with its ancestor mask and branch-first order computed now, where it is (inside a drafter's
        graph, they cost no launch of their own)."""
        tree = DeviceTree(parents, depth)
        return DeviceTree(parents, depth, mask=ancestor_mask(tree), first=branch_first(tree))  # type: ignore[arg-type]

    def reordered(self, order: torch.Tensor) -> DeviceTree:
        """The tree whose node j is node `order[j]` of this one (`reorder`, where the tree is); a mask computed
        with the tree is permuted with it."""
        T = len(self)
        place = torch.empty_like(order).scatter_(0, order, torch.arange(T, device=order.device))  # inverse
        up = self.parents.index_select(0, order)
        mask = None if self.mask is None else self.mask.index_select(0, order).index_select(1, order)
        return DeviceTree(torch.where(up < 0, up, place.index_select(0, up.clamp(min=0))), self.depth, order, mask)


Parents = list[int] | DeviceTree  # a tree's shape: on the host, or where its drafter grew it


def depths(parents: list[int]) -> list[int]:
    """Depth of every node: 1 for children of the root."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def ancestor_mask(parents: Parents) -> torch.Tensor:
    """`[T, T]` bool: node i may attend to node j iff j is i or an ancestor of i; where the tree is.

    Built a depth at a time (every node's next ancestor up in one gather), a few tensor operations a level: row by
    row it was four a node (~400 for spec.recycling's 80-node tree), each a dispatch on the host every step."""
    T = len(parents)
    if isinstance(parents, DeviceTree) and parents.mask is not None:
        return parents.mask
    if isinstance(parents, DeviceTree):
        device, levels = parents.parents.device, parents.depth
        up = torch.cat([torch.where(parents.parents < 0, T, parents.parents),
                        torch.full((1,), T, dtype=torch.long, device=device)])  # [T + 1], T: above the root
    else:
        device, levels = torch.device("cpu"), max(depths(parents), default=0)
        up = torch.tensor([T if p < 0 else p for p in parents] + [T], dtype=torch.long)
    mask = torch.zeros(T, T + 1, dtype=torch.bool, device=device)
    rows = torch.arange(T, device=device)
    node = rows
    for _ in range(levels):  # a node of depth d has d - 1 ancestors, then the root
        mask[rows, node] = True
        node = up[node]
    return mask[:, :T]


def node_depths(parents: Parents, mask: torch.Tensor | None = None) -> torch.Tensor:
    """`[T]` long, every node's depth (1 for children of the root), where the tree is; from its `ancestor_mask` when
    given."""
    if isinstance(parents, DeviceTree):
        return (ancestor_mask(parents) if mask is None else mask).sum(-1)
    return torch.tensor(depths(parents), dtype=torch.long)


def children(parents: list[int]) -> dict[int, list[int]]:
    """Children of every node in listed order; key -1 is the root."""
    out: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        out.setdefault(p, []).append(i)
        out.setdefault(i, [])
    return out


def tree_greedy_reading(tokens: torch.Tensor | list[int], parents: Parents, logits: torch.Tensor,
                        also: torch.Tensor | None = None) -> Reading:
    """`verify_tree_greedy`, its read left to the caller (`Reading`). `tokens` left unread where the logits are (a
    drafter that grew its tree there: spec.rsd greedy, a best-first tree on a GPU) are read with the argmaxes, in the
    same copy, and so is a `DeviceTree`'s shape (`Verdict.parents`, `Verdict.order`)."""
    T = len(parents)
    parts, split = _with_tree(tokens, parents, logits.argmax(-1))

    def finish(values: list[int]) -> Verdict:
        here, tree, order, values = split(values)
        best = values[: T + 1]  # [T + 1]
        ok = [False] * T
        depth = depths(tree)
        end, end_depth = -1, 0
        for i, (t, p) in enumerate(zip(here, tree, strict=True)):
            ok[i] = t == best[p + 1] and (p < 0 or ok[p])
            if ok[i] and depth[i] > end_depth:
                end, end_depth = i, depth[i]
        path = _path(tree, end)
        shape = (tree, order) if isinstance(parents, DeviceTree) else (None, None)
        return Verdict(len(path), [here[i] for i in path] + [best[end + 1]], as_read(values[T + 1 :], also),
                       tuple(path), *shape)

    return Reading(wanted(parts, also), finish)


def _with_tree(tokens: torch.Tensor | list[int], parents: Parents, mine: torch.Tensor
               ) -> tuple[list[torch.Tensor], Callable[[list[int]], tuple[list[int], list[int], list[int] | None,
                                                                             list[int]]]]:
    """What a tree verdict reads beside its own values `mine` (where the target's logits are): the drafts where a
    drafter left them there (`with_drafts`), and a `DeviceTree`'s parents and order. Returns the tensors to read and
    how the values read split into the tokens, the parents, the order (None: as drafted) and the rest."""
    parts, split = with_drafts(tokens, mine)
    if not isinstance(parents, DeviceTree):
        host = parents

        def as_given(values: list[int]) -> tuple[list[int], list[int], list[int] | None, list[int]]:
            here, rest = split(values)
            return here, host, None, rest

        return parts, as_given
    shape = [parents.parents] + ([parents.order] if parents.order is not None else [])
    T, n = len(parents), len(parents) * len(shape)

    def unread(values: list[int]) -> tuple[list[int], list[int], list[int] | None, list[int]]:
        here, rest = split(values[n:])
        return here, values[:T], values[T:n] if n > T else None, rest

    return [t.to(mine.device) for t in shape] + parts, unread


def verify_tree_greedy(tokens: list[int], parents: list[int], logits: torch.Tensor,
                       also: torch.Tensor | None = None) -> Verdict:
    """Longest root path whose every token is the target's argmax after its parent; then the target's next token.

    logits: `[T + 1, V]`. Among equally deep accepted nodes the first listed wins. `also`: integers read with the
    argmax, in one synchronisation on a GPU (`Verdict.read`).
    """
    return tree_greedy_reading(tokens, parents, logits, also).verdict()


def branch_first(parents: Parents) -> list[int] | torch.Tensor:
    """An order of the nodes with the tree's first branch first (the root's first-listed child, its first-listed
    child, and so on), then the others as listed: `order[j]` is the node that goes to place j (parents stay before
    their children). A tree listed breadth first (spec.recycling's template, spec.rsd's levels, a best-first tree's
    levels) then has its first-listed path, the drafter's best guess, as its first branch (`first_branch_prefix`).
    A `DeviceTree`'s order is computed where it is, as a tensor, and nothing is read."""
    if not isinstance(parents, DeviceTree):
        kids = children(parents)
        branch: list[int] = []
        at = -1
        while kids[at]:
            at = kids[at][0]
            branch.append(at)
        rest = set(branch)
        return branch + [i for i in range(len(parents)) if i not in rest]
    if parents.first is not None:
        return parents.first
    T, device = len(parents), parents.parents.device
    # first[i]: node i's first-listed child (T + 1: none); index T stands for the root, T + 1 for "none"
    up = torch.where(parents.parents < 0, T, parents.parents)
    first = torch.full((T + 2,), T + 1, dtype=torch.long, device=device)
    first = first.scatter_reduce(0, up, torch.arange(T, device=device), "amin")
    key = torch.cat([torch.arange(T, device=device) + T, torch.zeros(2, dtype=torch.long, device=device)])
    node = first[T:T + 1]
    for d in range(parents.depth):  # the branch's node at depth d + 1 gets key d, before every other node
        key.index_fill_(0, node, d)  # (none: the spare slot T + 1)
        node = first.index_select(0, node)
    return torch.sort(key[:T], stable=True).indices


def reorder(parents: list[int], order: list[int]) -> list[int]:
    """The parents of the tree whose node j is node `order[j]` of the tree `parents`."""
    place = {node: j for j, node in enumerate(order)}
    return [-1 if parents[node] < 0 else place[parents[node]] for node in order]


def first_branch_prefix(parents: list[int], path: tuple[int, ...]) -> int:
    """How many leading nodes of an accepted path (its nodes, root to leaf: `Verdict.nodes`) are the tree's first
    branch (nodes 0..m-1, node i the child of node i - 1): the nodes whose logits rows a verification forward
    computes where a chain would, at consecutive columns right after the context, where a chain (and `ar.greedy`)
    puts the same tokens. Later nodes of a path off that branch have siblings between them (exact mode on a GPU cuts
    such a path where it leaves the branch or confirms it as a chain: docs/gpu.md, "Trees on a GPU")."""
    m = 0
    while m < len(path) and path[m] == m and parents[m] == m - 1:
        m += 1
    return m


def verify_tree_sampling(
    tokens: torch.Tensor | list[int], parents: Parents, p: torch.Tensor, generator: torch.Generator | None,
    also: torch.Tensor | None = None,
) -> Verdict:
    """Multi-step speculative sampling over deterministic children (SpecInfer with q one-hot): from the root, draw
    y ~ p at the node; a child holding y is accepted and the walk goes on from it, else y is emitted. The emitted
    tokens are distributed as under p: each is drawn from p at its node, whatever the tree.

    The recursive rejection of SpecInfer tries the children in turn, accepting child c with probability r(c) / |r|
    under the running residual r and else removing c from r; that accepts child c with probability p(c) and, when
    all are rejected, draws from p without the children: the same law as one draw y ~ p. So every node's draw is made
    at once (`multinomial` over the `[T + 1]` rows) and read once (one synchronisation on a GPU, issue #30), and the
    walk runs on the host; a node the walk does not reach leaves its draw unused, which changes nothing of the law.
    Sibling tokens must be distinct (the first listed wins otherwise).

    p: `[T + 1, V]` target distributions (processors already applied); `also`: integers where p is, read with the
    draws (`Verdict.read`); `tokens` left where p is, and a `DeviceTree`'s parents, are read with them too.
    """
    T = len(parents)
    parts, split = _with_tree(tokens, parents, torch.multinomial(p, 1, generator=generator))
    here, tree, _, values = split(wanted(parts, also).tolist())
    drawn = values[: T + 1]  # y at the root, then at each node
    kids = children(tree)
    shape = tree if isinstance(parents, DeviceTree) else None
    node, path = -1, list[int]()
    while True:
        y = drawn[node + 1]
        child = next((c for c in kids[node] if here[c] == y), None)
        if child is None:
            return Verdict(len(path), [here[i] for i in path] + [y], as_read(values[T + 1 :], also), tuple(path),
                           shape)
        path.append(child)
        node = child


def verify_tree_rsd(
    tokens: torch.Tensor | list[int], parents: list[int], p: torch.Tensor, q: torch.Tensor,
    generator: torch.Generator | None, also: torch.Tensor | None = None,
) -> Verdict:
    """Recursive rejection sampling for siblings drawn WITHOUT replacement (Recursive Speculative Decoding,
    Jeon et al. 2024, arXiv 2402.14160).

    The children x_1..x_m of a node were drawn in listed order from q without replacement, so x_j ~ q_j, the
    node's q with x_1..x_{j-1} removed and renormalised. With r_1 = p at the node, x_j is accepted with
    probability min(1, r_j(x_j) / q_j(x_j)); on rejection r_{j+1} = norm(max(r_j - q_j, 0)). When all are
    rejected, or at a leaf, the token is drawn from r. Each stage emits a token distributed as r_j whatever q_j
    is, so the emitted tokens are distributed as under p. A child its q_j cannot draw (q_j(x) = 0: a row of q with
    fewer tokens of positive probability than the branching factor, `rsd.gumbel_top_k`) was not drawn: it is passed
    over, as are the siblings after it.

    The walk runs where p is and reads once (one synchronisation a step on a GPU, issue #30): a depth at a time,
    each child of the node reached tried in turn under `torch.where` (the tree's shape is known on the host, the
    walk's node is not), a uniform drawn for every node at once and the final token drawn once from the residual
    where the walk stopped; a node the walk does not try leaves its uniform unused, which changes nothing of the law.

    p: `[T + 1, V]` target distributions (processors applied; row 0 the root, row i + 1 node i).
    q: `[T, V]` row i is the draft distribution node i and its siblings were drawn from (the parent's q).
    `also`: integers where p is, read with the verdict (`Verdict.read`).
    """
    T, device = len(parents), p.device
    x_all = torch.as_tensor(tokens, dtype=torch.long).to(device)  # [T]
    kids = children(parents)
    width = max((len(c) for c in kids.values()), default=0)
    rows = [kids.get(i - 1, []) for i in range(T + 1)]  # row node + 1: its children, then -1
    table = torch.tensor([cs + [-1] * (max(width, 1) - len(cs)) for cs in rows], dtype=torch.long).to(device)
    u = torch.rand(T, generator=generator, device=device)  # [T]: a uniform for each node, used if it is tried
    # the walk's values are [1]-shaped tensors, indexed with index_select: indexing with a 0-dim tensor reads it
    node = torch.full((1,), -1, dtype=torch.long, device=device)
    stopped = torch.zeros(1, dtype=torch.bool, device=device)
    r = p[0].double()  # [V] the running residual at the node reached
    ids = torch.arange(p.shape[-1], device=device)
    tiny = torch.finfo(torch.float64).tiny
    walk: list[torch.Tensor] = []  # per depth, the node accepted there (-1: none, the walk stopped)
    for _ in range(max(depths(parents), default=0)):
        row = table.index_select(0, node + 1)[0]  # [width] the children of the node reached
        moved = torch.zeros(1, dtype=torch.bool, device=device)
        trying = ~stopped  # until a child is accepted, or one its q cannot draw comes
        tried = torch.zeros(p.shape[-1], dtype=torch.bool, device=device)  # earlier siblings' tokens
        for j in range(width):
            c = row[j : j + 1].clamp(min=0)  # [1]
            x = x_all.index_select(0, c)
            q_j = q.index_select(0, c)[0].double().masked_fill(tried, 0.0)
            q_j = q_j / q_j.sum().clamp(min=tiny)
            q_x = q_j.index_select(0, x)
            trying = trying & (row[j : j + 1] >= 0) & (q_x > 0)
            accept = trying & (u.index_select(0, c) * q_x < r.index_select(0, x))
            node = torch.where(accept, c, node)
            moved = moved | accept
            rejected = trying & ~accept
            residual = (r - q_j).clamp(min=0.0)
            mass = residual.sum()
            # r == q_j leaves nothing: rejection then had probability 0 up to rounding, and r is still the law
            r = torch.where(rejected & (mass > 0), residual / mass.clamp(min=tiny), r)
            tried = tried | (rejected & (ids == x))
            trying = trying & ~accept
        walk.append(torch.where(moved, node, -1))
        r = torch.where(moved, p.index_select(0, node + 1)[0].double(), r)  # at the accepted child: p there
        stopped = stopped | ~moved
    y = torch.multinomial(r, 1, generator=generator)  # [1] from the residual where the walk stopped
    path = torch.cat(walk) if walk else torch.zeros(0, dtype=torch.long, device=device)
    values = wanted([y, path, x_all.index_select(0, path.clamp(min=0))], also).tolist()
    D = path.numel()
    n = next((i for i, v in enumerate(values[1 : 1 + D]) if v < 0), D)
    return Verdict(n, values[1 + D : 1 + D + n] + [values[0]], as_read(values[1 + 2 * D :], also),
                   tuple(values[1 : 1 + n]))


def _path(parents: list[int], end: int) -> list[int]:
    path = []
    while end >= 0:
        path.append(end)
        end = parents[end]
    return path[::-1]


def check_tree(tokens: list[int], parents: list[int]) -> None:
    """Parents before children, and distinct tokens among siblings (needed for lossless sampling)."""
    assert len(tokens) == len(parents)
    for i, p in enumerate(parents):
        assert -1 <= p < i, f"node {i} has parent {p}: parents must be listed first"
    for node, kid in children(parents).items():
        assert len({tokens[c] for c in kid}) == len(kid), f"node {node} has repeated child tokens"
