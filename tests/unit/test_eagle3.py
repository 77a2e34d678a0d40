"""EAGLE-3: the training-time test sees exactly what decoding sees, the drafter enters the target's features of
accepted tokens into the head's cache (chain and tree), the loss trains what it should, and heads round-trip through
SpecForge/SGLang/vLLM's layout."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastdecode
from fastdecode.engine import encode_batch
from fastdecode.errors import IncompatibleMethodError, ModelLoadError, ParameterError
from fastdecode.heads import load_head, save_head
from fastdecode.heads.eagle3 import DraftCache, Eagle3Config, Eagle3Head, default_layers, vocab_maps
from fastdecode.heads.eagle3_io import eagle3_for, is_eagle3_layout, load_eagle3, save_eagle3
from fastdecode.registry import RunContext
from fastdecode.speculative.drafters.eagle3 import Eagle3Drafter, Eagle3SpecConfig
from fastdecode.speculative.driver import speculative
from fastdecode.train.data import Example
from fastdecode.train.measure import measure_tau, suite_prompts
from fastdecode.train.objectives import TargetBatch, head_objective
from fastdecode.train.objectives.eagle3 import simulated_tau, ttt_losses

SMALL = Eagle3Config(hidden_size=16, target_hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=4,
                     intermediate_size=24, vocab_size=40, draft_vocab_size=12, layers=(0, 1, 1))


def _head(seed: int = 0, config: Eagle3Config = SMALL) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(config).eval()
    head.set_vocab(torch.rand(config.vocab_size))
    return head


def test_vocab_maps_keep_the_most_counted_tokens_in_id_order():
    counts = torch.tensor([5.0, 0, 9, 1, 9, 0])
    d2t, t2d = vocab_maps(counts, 3)
    assert (torch.arange(3) + d2t).tolist() == [0, 2, 4]
    assert t2d.tolist() == [True, False, True, False, True, False]
    assert default_layers(6) == (1, 3, 5) and default_layers(2) == (0, 1, 1)


def test_the_draft_vocabulary_is_fitted_on_the_answers_of_the_training_data(causal):
    objective = head_objective("eagle3")
    head = objective.build_head(causal, {"token_counts": torch.zeros(causal.vocab_size), "draft_vocab": 4,
                                         "init": "target"})
    examples = [Example([0, 50, 7, 7, 9], 2, "t"), Example([0, 60, 9, 7, 1], 2, "t")]  # answers 7 7 9 / 9 7 1
    objective.prepare(head, examples)
    assert head.t2d.nonzero().flatten().tolist() == [0, 1, 7, 9]
    assert (torch.arange(4) + head.d2t).tolist() == [0, 1, 7, 9]  # 7, 9, 1 counted; then the lowest id
    # the output side starts as the target's: its output embeddings of those ids and its final norm
    # (the head is built on the CPU, the target may be on the test device)
    assert torch.equal(head.lm_head.weight, causal.model.lm_head.weight[[0, 1, 7, 9]].to(head.lm_head.weight.device))
    assert torch.equal(head.norm.weight, causal.model.model.norm.weight.to(head.norm.weight.device))


def test_config_refuses_a_shape_that_cannot_run():
    with pytest.raises(ParameterError, match="draft_vocab_size"):
        Eagle3Config(**{**SMALL.__dict__, "draft_vocab_size": 41})
    with pytest.raises(ParameterError, match="three target layers"):
        Eagle3Config(**{**SMALL.__dict__, "layers": (0, 1)})


@torch.no_grad()
def test_training_time_test_equals_decoding_with_the_cache():
    """Unrolled step i at row p == the decode path: entries 0..p from the target's features, then i chain entries
    fed the layer's own outputs, at positions p+1..p+i."""
    head = _head()
    T, H, steps = 9, 16, 4
    torch.manual_seed(1)
    feats = torch.randn(1, T, H)
    emb = torch.randn(1, T + steps + 1, H)  # emb[:, j] embeds token j
    pos = torch.arange(T)[None]
    allow0 = torch.ones(T, T, dtype=torch.bool).tril()[None]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    h, unrolled = feats, []
    for i in range(steps):
        h = head.ttt_step(emb[:, 1 + i : 1 + i + T], h, pos + i, keys, values, allow0)
        unrolled.append(h)
    for p in (0, 4, T - 1):
        cache = DraftCache()
        allow = torch.ones(p + 1, p + 1, dtype=torch.bool).tril()
        out = head.step(emb[:, 1 : p + 2], feats[:, : p + 1], pos[:, : p + 1], cache, allow)
        torch.testing.assert_close(out[0, -1], unrolled[0][0, p], rtol=1e-4, atol=1e-5)
        h = out[:, -1:]
        for i in range(1, steps):
            allow = torch.ones(1, cache.length + 1, dtype=torch.bool)
            h = head.step(emb[:, p + 1 + i : p + 2 + i], h, torch.tensor([[p + i]]), cache, allow)
            torch.testing.assert_close(h[0, -1], unrolled[i][0, p], rtol=1e-4, atol=1e-5)


def _batch(causal, head, texts: list[str]) -> TargetBatch:
    """Prompt + the target's own greedy answer, as the training loop builds it (on the target's device)."""
    rows, answers = [], []
    for text in texts:
        prompt = causal.tokenizer(text)["input_ids"]
        out = fastdecode.generate(causal, text, "ar.greedy", max_new_tokens=12).token_ids
        rows.append(prompt + out)
        answers.append([False] * len(prompt) + [True] * len(out))
    T = max(map(len, rows))
    dev = causal.device
    ids = torch.tensor([r + [2] * (T - len(r)) for r in rows], device=dev)
    real = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows], device=dev)
    answer = torch.tensor([a + [False] * (T - len(a)) for a in answers], device=dev)
    with torch.no_grad():
        fwd = causal.forward(ids, torch.arange(T, device=dev)[None].expand(len(rows), T), None,
                             attention_mask=real.long(), hidden=head.config.layers)
    return TargetBatch(ids, real, answer, fwd.hidden, fwd.layers, fwd.logits)


def test_the_loss_reaches_every_trained_tensor_and_the_metrics_are_rates(causal):
    objective = head_objective("eagle3")
    head = objective.build_head(causal, {"token_counts": torch.ones(causal.vocab_size), "ttt": 3})
    assert head.config.layers == objective.target_layers(causal, {}) == default_layers(2)
    batch = _batch(causal, head, ["the quick brown fox", "def add(a, b):"])
    loss, metrics = objective.head_loss(head, causal, batch, torch.Generator())
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    assert sorted(metrics) == ["acc0", "acc1", "acc2", "tau"]
    assert all(0 <= metrics[f"acc{i}"] <= 1 for i in range(3))
    assert metrics["tau"] == pytest.approx(simulated_tau([metrics[f"acc{i}"] for i in range(3)]))
    assert simulated_tau([1.0, 0.5, 0.5]) == 1 + 1 + 0.5 + 0.25


def test_an_out_of_vocabulary_target_is_not_trained_but_counts_as_a_miss(causal):
    objective = head_objective("eagle3")
    batch = _batch(causal, eagle3_for(causal), ["the quick brown fox"])
    counts = torch.ones(causal.vocab_size)
    counts[batch.ids[batch.answer].cpu()] = 0  # the draft vocabulary holds none of the answer's tokens
    head = objective.build_head(causal, {"token_counts": counts, "draft_vocab": 3})
    losses, accs = ttt_losses(head, causal.model.get_input_embeddings(), batch, 2)
    assert [float(part.detach()) for part in losses] == [0.0, 0.0] and accs == [0.0, 0.0]


def test_the_unrolled_loss_skips_only_rows_that_never_count(causal):
    """ttt_losses runs later steps on fewer rows and takes logits only where they count: the same numbers as running
    every row at every step."""
    head = eagle3_for(causal)
    texts = ["Sort this waiting line alphabetically by last name", "0123456789 ABC abc the lazy dog"]
    batch = _batch(causal, head, texts)
    assert int(batch.answer.float().argmax(-1).min()) > 8  # long prompts: rows are skipped after step 0
    losses, accs = ttt_losses(head, causal.model.get_input_embeddings(), batch, 3)
    embed = causal.model.get_input_embeddings()
    B, T = batch.ids.shape
    dev = batch.ids.device  # the target's, where eagle3_for puts the head too
    ids = torch.nn.functional.pad(batch.ids, (0, 5))
    answer = torch.nn.functional.pad(batch.answer & batch.attention, (0, 5))
    logits = torch.nn.functional.pad(batch.logits, (0, 0, 0, 5))
    allow = (torch.ones(T, T, dtype=torch.bool, device=dev).tril()[None] & batch.attention[:, None, :]
             | torch.eye(T, dtype=torch.bool, device=dev))
    h, keys, values = head.fuse(batch.layers), [], []
    for i in range(3):
        h = head.ttt_step(embed(ids[:, 1 + i : 1 + i + T]), h, torch.arange(T, device=dev)[None] + i, keys, values,
                          allow)
        counted = answer[:, 2 + i : 2 + i + T]
        teacher = logits[:, 1 + i : 1 + i + T][counted]
        p = teacher[:, head.t2d].softmax(-1)
        ce = -(p * head.logits(h[counted]).log_softmax(-1)).sum(-1)
        kept = head.t2d[teacher.argmax(-1)]
        torch.testing.assert_close(losses[i], (ce * kept).sum() / kept.sum(), rtol=1e-4, atol=1e-5)
        hit = head.to_target(head.logits(h[counted]).argmax(-1)) == teacher.argmax(-1)
        assert accs[i] == pytest.approx(float(hit.float().mean()))


class Oracle(Eagle3Head):
    """A head whose guesses are read off the known output: right except where `wrong` says (by position)."""

    future: list[int] = []
    wrong: set[int] = set()

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        pos = self._pos  # the position of the entry whose output this is: it predicts token pos + 2
        base = super().logits(out)
        guess = self.future[pos + 2] if pos + 2 < len(self.future) else 0
        if pos + 2 in self.wrong:
            guess = (guess + 1) % self.config.vocab_size
        one = torch.full_like(base, -30.0)
        one[..., guess] = 30.0  # the test keeps the whole vocabulary: draft id = target id
        return one

    def step(self, emb, h, positions, cache, allow):
        self._pos = int(positions[0, -1])
        return super().step(emb, h, positions, cache, allow)


@pytest.mark.parametrize("tree", [False, True])
def test_the_cache_holds_the_target_features_of_accepted_tokens(causal, tree, to_device):
    """With an oracle head that is sometimes wrong, every step enters the accepted tokens' target features: the
    head's committed cache equals the entries recomputed from one target forward over the final text."""
    prompt = causal.tokenizer("Sort this")["input_ids"]
    base = fastdecode.generate(causal, "Sort this", "ar.greedy", max_new_tokens=30).token_ids
    donor = eagle3_for(causal)
    head = to_device(Oracle(donor.config, donor.target).eval())
    head.load_state_dict(donor.state_dict())
    head.t2d.fill_(True)
    head.d2t.zero_()
    head.future, head.wrong = prompt + base, {len(prompt) + 4, len(prompt) + 5, len(prompt) + 13}
    # (graph=False: the oracle reads each forward's position on the host, which a captured graph would not repeat)
    cfg = Eagle3SpecConfig(max_new_tokens=30, tree=tree, num_draft_tokens=4, total_tokens=8, width=2, graph=False)
    made: list[Eagle3Drafter] = []

    def factory(_):
        made.append(Eagle3Drafter(causal, head, cfg))
        return made[-1]

    events = list(speculative(causal, encode_batch(causal, [prompt], 30), cfg, RunContext(), factory))
    assert [t for e in events for _, t in e.tokens[0]] == base
    assert sum(e.accepted[0] for e in events) > 10  # the oracle's drafts were accepted (not only rejected)
    drafter = made[0]
    n = drafter._entered  # committed entries: positions 0..n-1
    dev = causal.device
    ids = torch.tensor([prompt + base], device=dev)
    with torch.no_grad():
        fwd = causal.forward(ids, torch.arange(ids.shape[1], device=dev)[None], None, hidden=head.config.layers)
        cache = DraftCache()
        Eagle3Head.step(head, causal.model.get_input_embeddings()(ids[:, 1 : n + 1]),
                        head.fuse([t[:, :n] for t in fwd.layers]), torch.arange(n, device=dev)[None], cache,
                        torch.ones(n, n, dtype=torch.bool, device=dev).tril())
    assert drafter.cache.k is not None and cache.k is not None
    torch.testing.assert_close(drafter.cache.k[:, :, :n], cache.k, rtol=1e-4, atol=1e-4)


def test_a_head_round_trips_through_the_specforge_layout(tmp_path, causal):
    head = eagle3_for(causal)
    save_eagle3(head, tmp_path / "theirs", dtype="float32")
    record = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert record["architectures"] == ["LlamaForCausalLMEagle3"] and record["draft_vocab_size"] == 320
    assert record["target_hidden_size"] == 64 and record["num_hidden_layers"] == 1
    assert record["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    assert record["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]  # vLLM counts the embeddings as 0
    assert is_eagle3_layout(tmp_path / "theirs")
    back = load_eagle3(tmp_path / "theirs", causal)  # no device named: on the CPU; `head` is on the target's
    mine, theirs = head.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k].cpu(), theirs[k]) for k in mine)
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= set(mine)
    assert mine["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 64
    # by folder through the method: either layout decodes the same
    save_head(head, tmp_path / "ours")
    a = fastdecode.generate(causal, "Sort this", "spec.eagle3", max_new_tokens=12, head=str(tmp_path / "ours"))
    b = fastdecode.generate(causal, "Sort this", "spec.eagle3", max_new_tokens=12, head=str(tmp_path / "theirs"))
    assert a.token_ids == b.token_ids
    assert torch.equal(load_head(tmp_path / "ours", device="cpu").fc.weight, back.fc.weight)


def test_a_foreign_head_for_another_target_is_refused(tmp_path, causal):
    save_eagle3(_head(config=Eagle3Config(**{**SMALL.__dict__, "layers": (0, 1, 1)})), tmp_path / "small")
    with pytest.raises(IncompatibleMethodError, match="hidden size 64"):
        fastdecode.generate(causal, "Sort", "spec.eagle3", max_new_tokens=4, head=str(tmp_path / "small"))
    # a tensor of the wrong shape, one too many, a truncated file: each refused with the cause (heads/io.py)
    weights = tmp_path / "small" / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({**tensors, "fc.weight": tensors["fc.weight"][:, 1:].contiguous()}, str(weights))
    with pytest.raises(ModelLoadError, match=r"wrong shape for an EAGLE-3 head.*fc\.weight"):
        load_eagle3(tmp_path / "small", causal)
    save_file({**tensors, "extra.weight": torch.zeros(2)}, str(weights))
    with pytest.raises(ModelLoadError, match="unexpected tensors extra.weight. Only single-layer Llama EAGLE-3"):
        load_eagle3(tmp_path / "small", causal)
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_eagle3(tmp_path / "small", causal)
    weights.unlink()
    (tmp_path / "small" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="pytorch_model.bin, a pickle fastdecode never loads: convert it"):
        load_eagle3(tmp_path / "small", causal)


SHIPPED = Path(str(resources.files("fastdecode") / "zoo")) / "ar-small" / "heads" / "eagle3"


def test_the_shipped_head_keeps_its_card_claim_on_a_few_items():
    """τ of spec.eagle3 with zoo:ar-small's head, measured again on the first item of four parallel-lists tasks, is
    within 10 % of the card's per-item counts for them (README.md quotes the overall τ of all its items)."""
    card = json.loads((SHIPPED / "card.json").read_text())
    measured = card["measured"]
    assert measured["method"] == "spec.eagle3" and card["target"] == "zoo:ar-small"
    model = fastdecode.load("zoo:ar-small", device="cpu", dtype="float32")
    per_task = measured["per_task"]
    picked = list(range(0, measured["items"], per_task))[:4]
    prompts = suite_prompts(measured["suite"], per_task)
    got = measure_tau(model, "spec.eagle3", dict(measured["params"]), [prompts[i] for i in picked])
    claimed = sum(measured["item_tokens"][i] for i in picked) / sum(measured["item_forwards"][i] for i in picked)
    assert got["tau"] == pytest.approx(claimed, rel=0.1)
    assert f"τ = {measured['tau']:.2f}" in (SHIPPED / "README.md").read_text()


def test_the_shipped_head_saved_in_the_specforge_layout_decodes_the_same(tmp_path):
    model = fastdecode.load("zoo:ar-small", device="cpu", dtype="float32")
    save_eagle3(eagle3_for(model), tmp_path / "ar-small-eagle3")
    assert json.loads((tmp_path / "ar-small-eagle3" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] \
        == [2, 4, 6]
    prompt = suite_prompts("parallel-lists", 1)[0]
    shipped = fastdecode.generate(model, prompt, "spec.eagle3", max_new_tokens=24)
    folder = str(tmp_path / "ar-small-eagle3")
    theirs = fastdecode.generate(model, prompt, "spec.eagle3", max_new_tokens=24, head=folder)
    assert theirs.token_ids == shipped.token_ids
    assert theirs.stats.accepted_per_position == shipped.stats.accepted_per_position  # the same drafts
