"""The logits pipeline on hand-built logits: each processor, per-position histories of chains and trees, the
order of processors, greedy vs sampling, and the stateful-processor interface."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastdecode import sampling
from fastdecode.sampling import (
    History,
    LogitsPipeline,
    MinP,
    Positions,
    RepetitionPenalty,
    SuppressTokens,
    Temperature,
    TopK,
    TopP,
)

NEG = float("-inf")


def cfg(**kw):
    return SimpleNamespace(**kw)


def test_history_from_ids_skips_padding_and_grows_in_place():
    ids = torch.tensor([[2, 2, 5, 6], [7, 5, 5, 1]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    h = History.from_ids(ids, vocab_size=8, mask=mask)
    assert h.seen[0].nonzero().flatten().tolist() == [5, 6]
    assert h.seen[1].nonzero().flatten().tolist() == [1, 5, 7]
    h.append(torch.tensor([3, 4]))
    h.extend(1, [0, 6])
    assert h.seen[0].nonzero().flatten().tolist() == [3, 5, 6]
    assert h.seen[1].nonzero().flatten().tolist() == [0, 1, 4, 5, 6, 7]
    assert h.rows().seen() is h.seen  # the ar picker reads the mask without a copy
    assert h.rows([1]).seen().tolist() == h.seen[1:].tolist()


def test_chain_positions_see_the_drafted_tokens_before_them():
    h = History.from_ids(torch.tensor([[0]]), vocab_size=6)
    at = h.draft(0, torch.tensor([3, 4, 3]))
    assert at.paths == ((), (3,), (3, 4), (3, 4, 3))
    seen = at.seen()
    assert [row.nonzero().flatten().tolist() for row in seen] == [[0], [0, 3], [0, 3, 4], [0, 3, 4]]
    assert h.seen.sum() == 1  # drafted tokens never reach the committed history


def test_tree_positions_see_their_ancestors_only():
    h = History.from_ids(torch.tensor([[0]]), vocab_size=8)
    #        root
    #       /    \
    #     n0=1  n1=2
    #     /  \      \
    #  n2=3  n3=4   n4=5
    at = h.draft(0, [1, 2, 3, 4, 5], parents=[-1, -1, 0, 0, 1])
    assert at.paths == ((), (1,), (2,), (1, 3), (1, 4), (2, 5))
    seen = [row.nonzero().flatten().tolist() for row in at.seen()]
    assert seen == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 2, 5]]


def test_positions_of_several_rows_concatenate():
    h = History.from_ids(torch.tensor([[0], [1]]), vocab_size=4)
    at = Positions.cat([h.draft(1, [2]), h.draft(0, [3, 2])])
    assert at.rows.tolist() == [1, 1, 0, 0, 0]
    assert [r.nonzero().flatten().tolist() for r in at.seen()] == [[1], [1, 2], [0], [0, 3], [0, 2, 3]]


def test_repetition_penalty_per_position():
    h = History.from_ids(torch.tensor([[0]]), vocab_size=3)
    logits = torch.tensor([[2.0, 2.0, -1.0]]).expand(3, -1)
    out = RepetitionPenalty(2.0)(logits, h.draft(0, [2, 1]))
    assert out.tolist() == [[1.0, 2.0, -1.0], [1.0, 2.0, -2.0], [1.0, 1.0, -2.0]]
    with pytest.raises(AssertionError):
        RepetitionPenalty(2.0)(logits, None)


def test_history_free_processors_match_the_functions():
    x = torch.tensor([[1.0, 3.0, 2.0, 0.5, -1.0]])
    assert torch.equal(Temperature(2.0)(x, None), sampling.temperature(x, 2.0))
    assert torch.equal(TopK(2)(x, None), sampling.top_k(x, 2))
    assert torch.equal(TopP(0.7)(x, None), sampling.top_p(x, 0.7))
    assert torch.equal(MinP(0.3)(x, None), sampling.min_p(x, 0.3))
    assert SuppressTokens([1, 3])(x, None).tolist() == [[1.0, NEG, 2.0, NEG, -1.0]]
    assert SuppressTokens([0])(x[None].expand(2, 3, -1), None)[..., 0].eq(NEG).all()  # any leading shape


def test_from_config_orders_processors_as_transformers_does():
    pipe = LogitsPipeline.from_config(cfg(temperature=0.5, top_k=3, top_p=0.9, min_p=0.1, repetition_penalty=1.3))
    assert [type(p) for p in pipe.processors] == [RepetitionPenalty, Temperature, TopK, TopP, MinP]
    assert pipe.sampling and pipe.uses_history
    # temperature 0: only what can move the argmax; missing fields are off
    greedy = LogitsPipeline.from_config(cfg(temperature=0, top_k=3, min_p=0.2, repetition_penalty=1.3))
    assert [type(p) for p in greedy.processors] == [RepetitionPenalty] and not greedy.sampling
    plain = LogitsPipeline.from_config(cfg(temperature=1.0))
    assert plain.processors == [] and not plain.uses_history


def test_pipeline_equals_the_old_ar_sample_chain():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    ids = torch.randint(0, 50, (4, 7))
    h = History.from_ids(ids, 50)
    c = cfg(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.4)
    expect = sampling.repetition_penalty(logits, h.seen, 1.4)
    expect = sampling.min_p(sampling.top_p(sampling.top_k(sampling.temperature(expect, 0.7), 20), 0.9), 0.05)
    pipe = LogitsPipeline.from_config(c)
    assert torch.equal(pipe.process(logits, h.rows()), expect)
    assert torch.equal(pipe.distributions(logits, h.rows()), expect.float().softmax(-1))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(pipe.pick(logits, h.rows(), g1), sampling.sample(expect, g2))


def test_greedy_pipeline_equals_temperature_zero_pick_and_penalised_argmax():
    torch.manual_seed(1)
    logits = torch.randn(5, 30) * 3
    h = History.from_ids(torch.randint(0, 30, (1, 10)), 30)
    at = h.draft(0, [int(logits[0].argmax()), 4, 9, 4])
    pipe = LogitsPipeline.from_config(cfg(temperature=0, repetition_penalty=1.5))
    best = pipe.greedy(logits, at)
    assert torch.equal(best, pipe.pick(logits, at, None))
    assert torch.equal(best, sampling.repetition_penalty(logits, at.seen(), 1.5).argmax(-1))


class NoImmediateRepeat:
    """A toy stateful processor: the state is the last token; that token is forbidden next."""

    uses_history = True
    stateful = True

    def start(self):
        return None

    def advance(self, state, token):
        return token

    def __call__(self, logits, at):
        last = at.states(self)
        out = logits.clone()
        for n, t in enumerate(last):
            if t is not None:
                out[n, t] = NEG
        return out


def test_stateful_processor_follows_paths_and_needs_no_rollback():
    proc = NoImmediateRepeat()
    pipe = LogitsPipeline([proc])
    h = pipe.history(torch.tensor([[1, 2]]), vocab_size=6)
    assert h.states[proc] == [2]  # advanced over the prompt
    at = h.draft(0, [3, 4, 5], parents=[-1, 0, -1])
    assert at.states(proc) == [2, 3, 4, 5]
    out = pipe.process(torch.zeros(4, 6), at)
    assert [int(r.eq(NEG).nonzero()) for r in out] == [2, 3, 4, 5]
    # only the accepted tokens reach the History: the rejected branch leaves nothing to undo
    h.extend(0, [3, 1])
    assert h.states[proc] == [1]
    assert h.draft(0, [0]).states(proc) == [1, 0]


def test_target_distribution_keeps_its_contract_and_takes_min_p():
    from fastdecode.speculative.verify import target_distribution

    x = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    assert torch.allclose(target_distribution(x, 1.0, min_p=0.3), sampling.min_p(x, 0.3).softmax(-1))
