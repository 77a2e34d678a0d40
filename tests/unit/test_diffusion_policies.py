"""Policy pieces on hand-built canvases: block views, LLaDA's schedule, the DCD window, AdaBlock's block end."""

from __future__ import annotations

import torch

from fastdecode.diffusion.policies.adablock import AdaBlock, AdaBlockConfig
from fastdecode.diffusion.policies.baseline import Schedule
from fastdecode.diffusion.policies.dcd import DCDConfig, SlidingWindow
from fastdecode.diffusion.policy import Step, View, block_view, first_mask

M, E = 9, 1  # mask and EOS ids


def test_block_view_is_the_first_block_holding_a_mask_and_the_last_may_be_short():
    gen = torch.tensor([[5, 5, 5, M, M, M, M], [5, 5, 5, 5, 5, 5, M], [M] * 7])
    assert first_mask(gen, M).tolist() == [3, 6, 0]
    v = block_view(gen, M, 3)
    assert v.lo.tolist() == [3, 6, 0] and v.hi.tolist() == [6, 7, 3] and v.block.tolist() == [1, 2, 0]


def test_schedule_splits_each_block_when_it_starts_and_counts_its_steps():
    s = Schedule(M, size=4, steps=3, rows=1, device=torch.device("cpu"))
    rows = torch.tensor([0])
    s.view(torch.tensor([[M] * 8]), rows)
    assert [int(s.count(rows)) for _ in range(3)] == [2, 1, 1]
    s.view(torch.tensor([[5, 5, 5, 5, 6, M, M, M]]), rows)  # a new block with 3 masks
    assert [int(s.count(rows)) for _ in range(3)] == [1, 1, 1]


def test_dcd_window_keeps_about_window_masks_and_stops_at_the_first_eos():
    cfg = DCDConfig(max_new_tokens=12, window=3, max_window=5)
    w = SlidingWindow(M, frozenset({E}), cfg, rows=1, device=torch.device("cpu"))
    rows = torch.tensor([0])
    v = w.view(torch.tensor([[M] * 12]), rows)
    assert (int(v.lo), int(v.hi)) == (0, 3)
    v = w.view(torch.tensor([[5, M, 6] + [M] * 9]), rows)  # two decoded, one mask left: the right edge grows by 2
    assert (int(v.lo), int(v.hi)) == (1, 5)
    v = w.view(torch.tensor([[5, 7, 6, M, 8] + [M] * 7]), rows)
    assert (int(v.lo), int(v.hi)) == (3, 7)
    v = w.view(torch.tensor([[5, 7, 6, M, 8, 8, 8] + [M] * 5]), rows)  # 9, capped at max_window from the left edge
    assert (int(v.lo), int(v.hi)) == (3, 8)
    v = w.view(torch.tensor([[5, 7, 6, M, 8, 8, E] + [M] * 5]), rows)  # never past a decoded EOS
    assert (int(v.lo), int(v.hi)) == (3, 6)


class Tok:
    def __len__(self) -> int:
        return 12

    def decode(self, ids: list[int]) -> str:
        return {4: "a\n", 5: ".", 6: "\n"}.get(ids[0], "x")


class Model:
    mask_token_id, device, tokenizer = M, torch.device("cpu"), Tok()


def step_of(x0: list[int], conf: list[float], lo: int, hi: int) -> Step:
    W = len(x0)
    masked = torch.ones(1, W, dtype=torch.bool)
    return Step(0, torch.tensor([0]), View(torch.tensor([lo]), torch.tensor([hi]), torch.tensor([0])),
                torch.full((1, W), M), masked, masked, torch.zeros(1, W, 3), torch.tensor([x0]),
                torch.tensor([conf], dtype=torch.float64))


def test_adablock_ends_the_block_at_the_most_confident_delimiter_of_the_window():
    policy = AdaBlock(Model(), AdaBlockConfig(max_new_tokens=16, block_length=4, delimiter_threshold=0.3), rows=1)
    assert sorted(policy.delims.tolist()) == [4, 6]  # tokens whose text holds a newline
    # delimiters at offsets 2 (p .5) and 3 (p .6) of a window of 4 (25% of 16): the block ends after offset 3
    assert policy._block_end(step_of([7, 7, 6, 4, 6, 7], [.9, .9, .5, .6, .99, .9], 0, 6)).tolist() == [4]
    # none confident enough, or only outside the window: the default block
    assert policy._block_end(step_of([7, 6, 7, 7, 6, 7], [.9, .2, .9, .9, .99, .9], 0, 6)).tolist() == [4]
    assert policy._block_end(step_of([7, 7, 6, 7, 7, 7], [.9, .9, .5, .9, .9, .9], 8, 14)).tolist() == [11]
