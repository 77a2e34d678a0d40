"""Token trees: attention masks, depth positions and verification of many candidate continuations at once.

A tree of T nodes is given by `tokens [T]` and `parents [T]` (the parent's node index, -1 for a child of the
root, i.e. of the last context token), parents listed before their children. In the verification forward
each node attends to the context and to its ancestors and sits at position (last context position + depth),
as in SpecInfer (Miao et al. 2024) and Medusa. Logit row 0 belongs to the root, row i + 1 to node i.
"""

from __future__ import annotations

import torch

from .verify import Reading, Verdict, as_read, wanted, with_drafts


def depths(parents: list[int]) -> list[int]:
    """Depth of every node: 1 for children of the root."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """`[T, T]` bool: node i may attend to node j iff j is i or an ancestor of i.

    Built a depth at a time (every node's next ancestor up in one gather), a few tensor operations a level: row by
    row it was four a node (~400 for spec.recycling's 80-node tree), each a dispatch on the host every step."""
    T = len(parents)
    up = torch.tensor([T if p < 0 else p for p in parents] + [T], dtype=torch.long)  # [T + 1], T: above the root
    mask = torch.zeros(T, T + 1, dtype=torch.bool)
    rows = torch.arange(T)
    node = rows
    for _ in range(max(depths(parents), default=0)):  # a node of depth d has d - 1 ancestors, then the root
        mask[rows, node] = True
        node = up[node]
    return mask[:, :T]


def children(parents: list[int]) -> dict[int, list[int]]:
    """Children of every node in listed order; key -1 is the root."""
    out: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        out.setdefault(p, []).append(i)
        out.setdefault(i, [])
    return out


def tree_greedy_reading(tokens: torch.Tensor | list[int], parents: list[int], logits: torch.Tensor,
                        also: torch.Tensor | None = None) -> Reading:
    """`verify_tree_greedy`, its read left to the caller (`Reading`). `tokens` left unread where the logits are (a
    drafter that grew its tree there: spec.rsd greedy) are read with the argmaxes, in the same copy."""
    T = len(parents)
    parts, split = with_drafts(tokens, logits.argmax(-1))

    def finish(values: list[int]) -> Verdict:
        here, values = split(values)
        best = values[: T + 1]  # [T + 1]
        ok = [False] * T
        depth = depths(parents)
        end, end_depth = -1, 0
        for i, (t, p) in enumerate(zip(here, parents, strict=True)):
            ok[i] = t == best[p + 1] and (p < 0 or ok[p])
            if ok[i] and depth[i] > end_depth:
                end, end_depth = i, depth[i]
        path = _path(parents, end)
        return Verdict(len(path), [here[i] for i in path] + [best[end + 1]], as_read(values[T + 1 :], also),
                       tuple(path))

    return Reading(wanted(parts, also), finish)


def verify_tree_greedy(tokens: list[int], parents: list[int], logits: torch.Tensor,
                       also: torch.Tensor | None = None) -> Verdict:
    """Longest root path whose every token is the target's argmax after its parent; then the target's next token.

    logits: `[T + 1, V]`. Among equally deep accepted nodes the first listed wins. `also`: integers read with the
    argmax, in one synchronisation on a GPU (`Verdict.read`).
    """
    return tree_greedy_reading(tokens, parents, logits, also).verdict()


def preorder(parents: list[int]) -> list[int]:
    """The nodes depth first, children in listed order: `order[j]` is the node that goes to place j. A tree listed
    breadth first (spec.recycling's template, spec.rsd's levels) then has its first-listed path, the drafter's best
    guess, as its first branch."""
    kids = children(parents)
    order: list[int] = []
    stack = kids[-1][::-1]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(kids[node][::-1])
    return order


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
    tokens: list[int], parents: list[int], p: torch.Tensor, generator: torch.Generator | None,
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
    draws (`Verdict.read`).
    """
    T = len(tokens)
    values = wanted([torch.multinomial(p, 1, generator=generator)], also).tolist()
    drawn = values[: T + 1]  # y at the root, then at each node
    kids = children(parents)
    node, path = -1, list[int]()
    while True:
        y = drawn[node + 1]
        child = next((c for c in kids[node] if tokens[c] == y), None)
        if child is None:
            return Verdict(len(path), [tokens[i] for i in path] + [y], as_read(values[T + 1 :], also), tuple(path))
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
