"""The host work of a greedy decode step in exact mode with graphs (issue #30, docs/gpu.md "Host work per step"): on
a GPU every torch operation outside the captured forward is a launch or a dispatch, and every read of the device a
synchronisation, so a step's count is guarded here. Run with `graphs="replay"` on the CPU (the same static buffers
as the captured path, without capturing) and with captured graphs under FASTDECODE_TEST_DEVICE=cuda."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.ar.driver import ARSession
from fastdecode.ar.greedy import GreedyConfig
from fastdecode.config import build_config
from fastdecode.engine import encode_batch
from fastdecode.models.base import on_host
from fastdecode.models.host_ops import HostOps
from fastdecode.registry import RunContext

# what the decode step reached (tools/host_ops.py prints them by line): 3 copies into the graph's static buffers
# (meta, ids, positions) with their views, the clone of the block's logits, the driver's position += 1 and argmax
# with their views; 76 before the attention plan and the padding moved into the graph
MAX_OPS = 13
# a speculative step of one row's chain, besides its drafter's own (spec.pld's n-gram search: 6 a length it tries,
# host tensors): the block (3) and its copies into the graph's buffers (9 with their views), the logits' clone and
# slices, the verdict's argmax, the accepted tokens written into the row's context; 47 on zoo:ar-small before a
# chain's block was fed without padding and masks and the verdict compared the drafts on the host; on a GPU two
# more: the block's ids and positions copied to the device (`_onto`, no operation on the CPU)
MAX_SPEC_OPS = 23


@pytest.fixture(scope="module")
def graphed(causal_dir, load_model, device):
    return load_model(causal_dir, dtype="bfloat16", exact=8, graphs="cuda" if device.type == "cuda" else "replay")


def _counted_steps(model, prompts: list[str], steps: int) -> list[HostOps]:
    """The counts of the decode steps in which every row was fed (no row had finished: a plain step)."""
    batch = model.tokenizer(prompts, return_tensors="pt", padding=True)
    session = ARSession(model, GreedyConfig(max_new_tokens=steps + 4), slots=len(prompts))
    session.join(batch.input_ids, batch.attention_mask)
    for _ in range(3):  # the prefill's pick, then the eager forward that allocates the storage, then the capture
        session.step()
    counts = []
    for _ in range(steps):
        with HostOps() as count:
            picked = session.step()
        if len(picked) < len(prompts) or any(fin for *_, fin in picked):
            break  # a row ended (EOS): the next steps run the padded path
        counts.append(count)
    assert len(counts) >= 3, "the tiny model ended its rows too early to count plain steps"
    return counts


@pytest.mark.parametrize("prompts", [["def add(a, b):"], ["the quick brown fox", "Sort this"]])
def test_a_greedy_step_runs_few_host_operations_and_reads_the_device_once(graphed, prompts):
    for count in _counted_steps(graphed, prompts, steps=8):
        assert count.ops <= MAX_OPS, f"{count.ops} operations outside the graph:\n" + "\n".join(
            f"{n}  {line}" for line, n in count.by_line.most_common())
        assert count.reads == 1, f"{count.reads} device-to-host reads in a greedy step (the picked tokens only)"


def test_the_counter_sees_reads_and_skips_the_graph_body(graphed):
    """The guard above is only as good as its counter: `.item()` and `.tolist()` are reads, and the replayed
    forward's own operations are not counted (a step that replays runs far more than MAX_OPS operations)."""
    x = torch.arange(3)
    with HostOps() as count:
        x.tolist()
        x[0].item()
    assert count.reads == 2
    batch = graphed.tokenizer(["def add(a, b):"], return_tensors="pt")
    session = ARSession(graphed, GreedyConfig(max_new_tokens=8), slots=1)
    session.join(batch.input_ids)
    for _ in range(3):
        session.step()
    replays = graphed.graphs.stats["replays"]
    with HostOps() as count:
        session.step()
    assert graphed.graphs.stats["replays"] == replays + 1
    assert 0 < count.ops <= MAX_OPS


def test_a_speculative_step_runs_few_host_operations(graphed, device):
    """spec.pld's steps (a host drafter, chain drafts) in exact mode with graphs: the verification of one row's chain
    is fed as the row's own tensors (no padded block, no masks), and the verdict reads the argmaxes once and compares
    them with the drafts on the host."""
    spec = fastdecode.get_method("spec.pld")
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    cfg = build_config(spec.config, {"max_new_tokens": 24}, "spec.pld")
    session = spec.driver(graphed, encode_batch(graphed, [prompt], 24), cfg, RunContext())
    for _ in range(2):  # the prefill, the eager forward that allocates the storage, the capture
        next(session)
    limit = MAX_SPEC_OPS + 2 * (not on_host(device))  # on a device: the draft's copy there
    counted = 0
    for _ in range(6):
        with HostOps() as count:
            event = next(session, None)
        if event is None or event.finished[0]:
            break
        ours = {line: n for line, n in count.by_line.items() if not line.startswith("speculative/lookup.py")}
        assert sum(ours.values()) <= limit, "operations outside the graph and the drafter:\n" + "\n".join(
            f"{n}  {line}" for line, n in sorted(ours.items(), key=lambda kv: -kv[1]))
        counted += 1
    assert counted >= 2, "the tiny model ended its row too early to count speculative steps"


def test_views_and_metadata_are_host_work_not_launches():
    """`HostOps.launches` counts what runs a kernel or a copy on a GPU; a view, a detach and a scalar read do not."""
    x = torch.zeros(4, 4)
    with HostOps() as count:
        y = torch.ones(4, 4)  # a fill: a launch
        part = y[1:, :2].unsqueeze(0).expand(2, 3, 2)  # four views (two slices)
        z = part + 1  # a launch
        w = z.detach()  # metadata
        x.copy_(y)  # a launch
        value = float(w.sum())  # the sum a launch, its read a scalar copy
    assert count.ops == 10 and count.launches == 4 and count.reads == 1 and value == 24.0
