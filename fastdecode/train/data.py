"""The training mixture: task items from train seeds, encoded as prompt + answer + EOS, batched by length."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..bench.tasks import DEFAULT_TEST_SEED, TASKS, Item, format_prompt

# relative sampling weight of each task family member; harder tasks get more
DEFAULT_MIXTURE: dict[str, float] = {
    **{name: 1.0 for name in TASKS if name.startswith(("lists.", "letters."))},
    "lists.sort": 2.0, "lists.insert_index": 1.5, "lists.remove_index": 1.5, "lists.replace_index": 1.5,
    "letters.sort": 1.5, "puzzles.sudoku": 3.0, "puzzles.latin_square": 1.0,
    # code items are several times longer than task items and learn every token: a small weight is still a large share
    "code.complete": 0.5,
}
DECONTAMINATE = 500  # training never shows the prompts of the first N test items of each task


@dataclass(frozen=True)
class Example:
    ids: list[int]  # bos + prompt + answer + eos
    prompt_len: int  # tokens before the answer
    task: str


def encode(tokenizer, item: Item, answer_pad_to: int | None = None) -> Example:
    """Encode exactly as inference does: the formatted prompt alone (with bos), then the answer and EOS.

    With `answer_pad_to`, the answer is padded with EOS to that many tokens (LLaDA's SFT recipe).
    """
    prompt = tokenizer(format_prompt(item.prompt), add_special_tokens=True)["input_ids"]
    answer = tokenizer(item.reference, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if answer_pad_to is not None:
        answer = answer[:answer_pad_to] + [tokenizer.eos_token_id] * max(0, answer_pad_to - len(answer))
    return Example(prompt + answer, len(prompt), item.task)


def held_out_prompts(n: int = DECONTAMINATE) -> set[str]:
    out: set[str] = set()
    for task in TASKS.values():
        out.update(item.prompt for item in task.items(DEFAULT_TEST_SEED, min(n, 300 if task.family == "code" else n)))
    return out


def item_stream(mixture: Mapping[str, float], seed: int, chunk: int = 64) -> Iterator[Item]:
    """Endless items from train seeds only, tasks drawn by weight, test prompts removed."""
    rng = random.Random(seed)
    names, weights = list(mixture), list(mixture.values())
    banned = held_out_prompts()
    next_seed = {name: seed * 1000 for name in names}  # disjoint seed blocks per training seed
    buffers: dict[str, list[Item]] = {name: [] for name in names}
    while True:
        name = rng.choices(names, weights)[0]
        if not buffers[name]:
            buffers[name] = [i for i in TASKS[name].items(next_seed[name], chunk) if i.prompt not in banned]
            next_seed[name] += 1
        if buffers[name]:
            yield buffers[name].pop()


def batches(examples: Iterator[Example], max_tokens: int, pool: int = 256, seed: int = 0) -> Iterator[list[Example]]:
    """Group examples of similar length so that padded batches hold about `max_tokens` tokens."""
    rng = random.Random(seed)
    while True:
        chunk = sorted((next(examples) for _ in range(pool)), key=lambda e: len(e.ids))
        group: list[list[Example]] = [[]]
        for ex in chunk:
            longest = max(len(ex.ids), max((len(e.ids) for e in group[-1]), default=0))
            if group[-1] and longest * (len(group[-1]) + 1) > max_tokens:
                group.append([])
            group[-1].append(ex)
        rng.shuffle(group)
        yield from group


def collate(batch: list[Example], pad_id: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `ids [B, T]`, `attention [B, T]` and `answer [B, T]` (True on answer tokens)."""
    T = min(max_len, max(len(e.ids) for e in batch))
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    attention = torch.zeros(len(batch), T, dtype=torch.long)
    answer = torch.zeros(len(batch), T, dtype=torch.bool)
    for b, e in enumerate(batch):
        n = min(len(e.ids), T)
        ids[b, :n] = torch.tensor(e.ids[:n])
        attention[b, :n] = 1
        # code items learn the whole source (the prompt is code too); task items learn their answer
        first = 1 if e.task.startswith("code.") else e.prompt_len
        answer[b, first:n] = True
    return ids, attention, answer


def packed_rows(examples: Iterator[Example], row_len: int, pool: int = 256) -> Iterator[list[Example]]:
    """Rows of whole examples, `row_len` tokens at most each, filled first-fit from a pool (longest first).

    Packing mixes tasks inside every batch: length-grouped batches hold one task each (lengths are
    task-specific), so each optimiser step pulled the model towards a single task.
    """
    while True:
        chunk = sorted((next(examples) for _ in range(pool)), key=lambda e: -len(e.ids))
        rows: list[list[Example]] = []
        room: list[int] = []
        for ex in chunk:
            n = min(len(ex.ids), row_len)
            for r, free in enumerate(room):
                if n <= free:
                    rows[r].append(ex)
                    room[r] -= n
                    break
            else:
                rows.append([ex])
                room.append(row_len - n)
        yield from rows


def packed_batches(examples: Iterator[Example], row_len: int, max_tokens: int, pool: int = 256,
                   seed: int = 0) -> Iterator[list[list[Example]]]:
    """Batches of `max_tokens // row_len` packed rows, in a seeded random order."""
    rng = random.Random(seed)
    per_batch = max(1, max_tokens // row_len)
    rows = packed_rows(examples, row_len, pool)
    while True:
        window = [next(rows) for _ in range(per_batch * 8)]
        rng.shuffle(window)
        for i in range(0, len(window), per_batch):
            yield window[i:i + per_batch]


class Packed(NamedTuple):
    ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T], restarting at 0 for every example
    mask: torch.Tensor  # [B, 1, T, T] bool, True where a token may attend
    answer: torch.Tensor  # [B, T] bool, tokens that take a loss
    doc: torch.Tensor  # [B, T] index of the example within its row, -1 on padding


def collate_packed(batch: list[list[Example]], pad_id: int, row_len: int, causal: bool = True) -> Packed:
    """Packed rows: each token attends to its own example only (earlier tokens of it when `causal`).

    Padding attends only to itself, so no attention row is empty.
    """
    T = min(row_len, max(sum(len(e.ids) for e in row) for row in batch))
    B = len(batch)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    positions = torch.zeros(B, T, dtype=torch.long)
    doc = torch.full((B, T), -1, dtype=torch.long)
    answer = torch.zeros(B, T, dtype=torch.bool)
    for b, row in enumerate(batch):
        at = 0
        for d, e in enumerate(row):
            n = min(len(e.ids), T - at)
            if n <= 0:
                break
            ids[b, at:at + n] = torch.tensor(e.ids[:n])
            positions[b, at:at + n] = torch.arange(n)
            doc[b, at:at + n] = d
            first = 1 if e.task.startswith("code.") else e.prompt_len
            answer[b, at + first:at + n] = True
            at += n
        positions[b, at:] = torch.arange(T - at)
    mask = (doc[:, :, None] == doc[:, None, :]) & (doc[:, :, None] >= 0)  # [B, T, T]
    if causal:
        mask &= torch.ones(T, T, dtype=torch.bool).tril()
    mask |= torch.eye(T, dtype=torch.bool)
    return Packed(ids, positions, mask[:, None], answer, doc)
