"""spec.recycling: Token Recycling (Luo et al. 2024), candidate tokens the target ranked highly are kept in an
adjacency matrix and recycled as a draft tree.

A[v] holds the target's top-k next tokens the last time v was an input. Each step the tree template (by default
the authors' static tree "2.2.2", 80 nodes) is filled breadth first from the last context token (a node of rank r
under a parent with token v gets token A[v, r]), verified in one forward with a tree mask, and A is overwritten for
every input token of that forward with the top-k of its logits, so candidates from rejected branches are reused.
As in the authors' evaluation code, which allocates A once and passes it to every question, A outlives the
request: one matrix per k in the run's drafter memory (by default its target model's), shared by every run with
that memory (`shared_matrix=False` gives each request an empty one, as a seeded sampled run always gets, so that
its seed repeats).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...errors import ParameterError
from ...models.causal import CausalLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import speculative
from ..memory import DrafterMemory, learns_across_requests, run_memory


@dataclass(frozen=True)
class RecyclingConfig(SpecConfig):
    top_k_candidates: int = 8  # k, candidates kept per token (the paper's output-id top-k)
    template: str = "2.2.2"  # the authors' static tree "2.2.2" (80 nodes, 6 deep), or rank budgets per depth such as
    #   "7,5,3,2,1,0" (a root path of ranks r_1..r_d is a node iff r_1 + ... + r_d <= budget[d]: 71 nodes, 6 deep)
    shared_matrix: bool = True  # keep A across requests on the same target (the authors' code); False: empty per
    #   request

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.top_k_candidates >= 1, "top_k_candidates", self.top_k_candidates, "must be at least 1")
        if self.template not in STATIC_TREES:
            budgets = parse_template(self.template)
            check(all(a >= b for a, b in zip(budgets, budgets[1:], strict=False)), "template", self.template,
                  "must not increase with depth")


# The authors' static tree "2.2.2" (Luowaterbi/TokenRecycling, the evaluation's default): for every node, given as
# the candidate ranks of its root path, how many children it has; they are always the ranks 0, 1, ... of its row
# of the adjacency matrix. Nodes not listed have none. 8 / 21 / 25 / 15 / 8 / 3 nodes at depths 1 to 6.
TREE_2_2_2 = {
    (): 8,
    (0,): 8, (1,): 4, (2,): 3, (3,): 2, (4,): 1, (5,): 1, (6,): 1, (7,): 1,
    (0, 0): 8, (0, 1): 3, (0, 2): 2, (0, 3): 1, (0, 4): 1, (0, 5): 1, (0, 6): 1, (0, 7): 1,
    (1, 0): 2, (1, 1): 1, (2, 0): 1, (3, 0): 1, (4, 0): 1, (5, 0): 1,
    (0, 0, 0): 5, (0, 0, 1): 2, (0, 0, 2): 1, (0, 0, 3): 1, (0, 0, 4): 1,
    (0, 1, 0): 1, (0, 2, 0): 1, (1, 0, 0): 1, (2, 0, 0): 1, (3, 0, 0): 1,
    (0, 0, 0, 0): 3, (0, 0, 0, 1): 1, (0, 0, 0, 2): 1, (0, 0, 1, 0): 1, (0, 1, 0, 0): 1, (1, 0, 0, 0): 1,
    (0, 0, 0, 0, 0): 2, (0, 0, 0, 1, 0): 1,
}
STATIC_TREES = {"2.2.2": TREE_2_2_2}


def static_template(fanout: dict[tuple[int, ...], int], width: int) -> list[tuple[int, int]]:
    """(parent, rank) of every node of a static tree, breadth first and by rank path within a depth (the
    authors' order); ranks past the row width `width` (top_k_candidates) are left out with their subtrees."""
    nodes: list[tuple[int, int]] = []
    level: list[tuple[int, tuple[int, ...]]] = [(-1, ())]  # (node index, rank path); -1 is the root
    while level:
        nxt = []
        for parent, path in level:
            for rank in range(min(fanout.get(path, 0), width)):
                nodes.append((parent, rank))
                nxt.append((len(nodes) - 1, path + (rank,)))
        level = sorted(nxt, key=lambda item: item[1])
    return nodes


def template_nodes(text: str, width: int) -> list[tuple[int, int]]:
    """The (parent, rank) list of the template named or written in `text`."""
    if text in STATIC_TREES:
        return static_template(STATIC_TREES[text], width)
    return tree_template(parse_template(text), width)


def parse_template(text: str) -> list[int]:
    try:
        budgets = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        budgets = []
    if not budgets or min(budgets) < 0:
        raise ParameterError(f"Parameter template={text!r} is invalid: name a static tree ({', '.join(STATIC_TREES)}) "
                             f"or write rank budgets per depth, e.g. '7,5,3,2,1,0'.")
    return budgets


def tree_template(budgets: list[int], width: int) -> list[tuple[int, int]]:
    """(parent, rank) of every node, breadth first: a root path of ranks r_1..r_d is a node iff
    sum(r) <= budgets[d-1]."""
    nodes: list[tuple[int, int]] = []
    level: list[tuple[int, int]] = [(-1, 0)]  # (node index, rank sum so far); -1 is the root
    for budget in budgets:
        nxt = []
        for (parent, total), rank in itertools.product(level, range(width)):
            if total + rank <= budget:
                nodes.append((parent, rank))
                nxt.append((len(nodes) - 1, total + rank))
        level = nxt
    return nodes


def new_matrix(vocab_size: int, k: int) -> torch.Tensor:
    return torch.full((vocab_size, k), -1, dtype=torch.long)  # [V, k] A, -1 = not seen yet


def shared_matrix(memory: DrafterMemory, vocab_size: int, k: int) -> torch.Tensor:
    """The matrix kept across requests in `memory`, like the authors' evaluation loop keeps it."""
    return memory.get(("spec.recycling", vocab_size, k), lambda: new_matrix(vocab_size, k))


class RecyclingDrafter(BaseDrafter):
    tree_drafts = True

    def __init__(self, cfg: RecyclingConfig, adjacency: torch.Tensor) -> None:
        self.k = cfg.top_k_candidates
        self.template = template_nodes(cfg.template, self.k)
        self.depth = [0] * len(self.template)
        for i, (parent, _) in enumerate(self.template):
            self.depth[i] = 1 if parent < 0 else self.depth[parent] + 1
        self.adjacency = adjacency  # [V, k], written in place
        self._inputs: list[int] = []  # tokens whose logits the verification forward returns

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        root = int(context[-1])
        tokens: list[int] = []
        parents: list[int] = []
        placed: dict[int, int] = {}  # template index -> draft node index
        rows: dict[int, list[int]] = {}  # the matrix's rows read so far (each once: a read per entry was 3 operations)
        for i, (parent, rank) in enumerate(self.template):
            if self.depth[i] > k or (parent >= 0 and parent not in placed):
                continue
            above = root if parent < 0 else tokens[placed[parent]]
            row = rows.get(above)
            if row is None:
                row = rows[above] = self.adjacency[above].tolist()
            token = row[rank]
            if token < 0:
                continue
            placed[i] = len(tokens)
            tokens.append(token)
            parents.append(-1 if parent < 0 else placed[parent])
        self._inputs = [root] + tokens
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=parents)

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        return logits[: 1 + num_draft].topk(self.k, dim=-1).indices  # [1 + T, k], one row per input token

    def observe(self, verification: Verification) -> None:
        self.adjacency[torch.tensor(self._inputs)] = self.asked(verification)


@register_spec("spec.recycling", config=RecyclingConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: RecyclingConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Token Recycling: a draft tree from an adjacency matrix of the target's recent top-k candidates."""
    k, memory = cfg.top_k_candidates, run_memory(ctx, model)

    def drafter(generator) -> RecyclingDrafter:
        # a seeded sampled run starts from an empty matrix of its own, so that its seed repeats
        shared = cfg.shared_matrix and learns_across_requests(cfg, ctx.generator)
        matrix = shared_matrix(memory, model.vocab_size, k) if shared else new_matrix(model.vocab_size, k)
        return RecyclingDrafter(cfg, matrix)

    return speculative(model, batch, cfg, ctx, drafter)
