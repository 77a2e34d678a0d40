"""The transformers reference methods reproduce ar.greedy token for token, and their counts add up."""

from __future__ import annotations

import threading

import pytest

import fastdecode
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt

PROMPTS = ["the quick brown", "def add(a, b):",
           format_prompt(TASKS["letters.reverse"].items(DEFAULT_TEST_SEED, 1)[0].prompt)]


def check_stats(result, max_new_tokens: int) -> None:
    s = result.stats
    assert s.new_tokens == len(result.token_ids) <= max_new_tokens
    assert s.tokens_per_forward == pytest.approx(s.new_tokens / s.forwards)
    assert 0 <= s.accepted <= s.proposed
    assert sum(s.accepted_per_position) == s.accepted


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("method, kwargs", [
    ("hf.greedy", {}),
    ("hf.prompt_lookup", {}),
    ("hf.prompt_lookup", {"num_tokens": 3, "max_matching_ngram_size": 1}),
    ("hf.assisted", {"draft": "other"}),
    ("hf.assisted", {"draft": "self", "assistant_confidence_threshold": 0.0, "num_assistant_tokens": 5}),
])
def test_same_tokens_as_ar_greedy(target, draft, prompt, method, kwargs):
    kwargs = {**kwargs}
    if "draft" in kwargs:
        kwargs["draft"] = target if kwargs["draft"] == "self" else draft
    reference = fastdecode.generate(target, prompt, "ar.greedy", max_new_tokens=24)
    result = fastdecode.generate(target, prompt, method, max_new_tokens=24, trace=True, **kwargs)
    assert result.token_ids == reference.token_ids
    assert result.text == reference.text
    check_stats(result, 24)
    # the steps read back from the hooks rebuild the output
    assert [t for ev in result.trace for _, t in ev.tokens[0]][: len(result.token_ids)] == result.token_ids
    if method == "hf.greedy":
        assert result.stats.forwards == reference.stats.forwards and result.stats.proposed == 0
    if kwargs.get("draft") is target:  # a drafter identical to the target is accepted every time
        assert result.stats.accepted == result.stats.proposed > 0
        assert result.stats.forwards < reference.stats.forwards
        assert result.stats.draft_forwards > 0


@pytest.mark.parametrize("kwargs", [
    {},
    # the target as its own draft, every token accepted: the heuristic schedule lengthens the draft by 2 a step, and
    # transformers carries the length it reached into the next generate() call with the same draft
    {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": 2, "assistant_confidence_threshold": 0.0,
     "self": True},
])
def test_batch_equals_one_by_one(target, draft, kwargs):
    """A batch's rows start as runs of their own do."""
    kwargs = dict(kwargs)
    drafter = target if kwargs.pop("self", False) else draft
    one = [fastdecode.generate(target, p, "hf.assisted", draft=drafter, max_new_tokens=24, **kwargs) for p in PROMPTS]
    batch = fastdecode.generate(target, PROMPTS, "hf.assisted", draft=drafter, max_new_tokens=24, **kwargs)
    for a, b in zip(one, batch, strict=True):
        assert a.token_ids == b.token_ids
        assert (a.stats.forwards, a.stats.proposed, a.stats.accepted) == (
            b.stats.forwards, b.stats.proposed, b.stats.accepted)


def test_assisted_needs_a_draft(target):
    with pytest.raises(fastdecode.IncompatibleMethodError, match="--draft"):
        fastdecode.generate(target, "the quick", "hf.assisted", max_new_tokens=4)


def test_hooks_and_assistant_are_restored(target):
    fastdecode.generate(target, "the quick", "hf.assisted", draft=target, max_new_tokens=6)
    assert not target.model._forward_hooks
    assert "generate" not in vars(target.model)
    assert target.model.generation_config.num_assistant_tokens is None


def test_registered_as_lossless_causal_methods():
    for name in ("hf.greedy", "hf.assisted", "hf.prompt_lookup"):
        method = fastdecode.get_method(name)
        assert method.kind == "causal" and method.lossless
    assert dict(fastdecode.get_method("hf.prompt_lookup").params())["max_matching_ngram_size"] == 2


@pytest.fixture(scope="module")
def zoo_pair():
    return fastdecode.load("zoo:ar-small"), fastdecode.load("zoo:ar-tiny")


@pytest.mark.parametrize("adaptive", [False, True])
def test_spec_draft_model_drafts_as_hf_assisted(zoo_pair, adaptive):
    """The like-for-like pair of the benchmarks: transformers' settings (20 tokens, a 0.4 confidence stop), with the
    threshold fixed or adapted as transformers adapts it where scikit-learn is installed: the same drafts, so the
    same forwards, draft forwards and acceptances."""
    if adaptive:
        pytest.importorskip("sklearn")
    target, draft = zoo_pair
    prompt = format_prompt(TASKS["code.complete"].items(DEFAULT_TEST_SEED, 1)[0].prompt)
    ours = fastdecode.generate(target, prompt, "spec.draft_model", draft=draft, max_new_tokens=96,
                               num_draft_tokens=20, confidence_stop=0.4, adaptive_stop=adaptive)
    theirs = fastdecode.generate(target, prompt, "hf.assisted", draft=draft, max_new_tokens=96,
                                 adaptive_threshold=adaptive)
    assert ours.token_ids == theirs.token_ids
    counts = lambda r: (r.stats.forwards, r.stats.draft_forwards, r.stats.proposed, r.stats.accepted)  # noqa: E731
    assert counts(ours) == counts(theirs)
    if adaptive:  # the adaptation happened: the threshold left 0.4, and the drafts differ from the fixed stop's
        fixed = fastdecode.generate(target, prompt, "spec.draft_model", draft=draft, max_new_tokens=96,
                                    num_draft_tokens=20, confidence_stop=0.4)
        assert fixed.token_ids == ours.token_ids and fixed.stats.proposed != ours.stats.proposed


def test_hf_assisted_records_whether_its_threshold_adapts(monkeypatch):
    from fastdecode.config import build_config
    from fastdecode.hf import assisted

    cfg = build_config(assisted.AssistedConfig, {}, "hf.assisted")
    assert cfg.adaptive_threshold is assisted._transformers_adapts()  # None resolved: what transformers does here
    assert build_config(assisted.AssistedConfig, {"assistant_confidence_threshold": 0.0},
                        "hf.assisted").adaptive_threshold is False  # no threshold, nothing to adapt
    with pytest.raises(fastdecode.ParameterError, match="confidence_threshold=0.4"):
        build_config(assisted.AssistedConfig, {"adaptive_threshold": True, "assistant_confidence_threshold": 0.0},
                     "hf.assisted")
    monkeypatch.setattr(assisted, "_transformers_adapts", lambda: False)  # a machine without scikit-learn
    assert build_config(assisted.AssistedConfig, {}, "hf.assisted").adaptive_threshold is False
    with pytest.raises(fastdecode.ParameterError, match="pip install scikit-learn"):
        build_config(assisted.AssistedConfig, {"adaptive_threshold": True}, "hf.assisted")


def test_a_fixed_threshold_leaves_transformers_as_it_was():
    pytest.importorskip("sklearn")
    import transformers.generation.candidate_generator as candidates

    from fastdecode.hf.assisted import fixed_threshold

    with fixed_threshold():
        assert candidates.is_sklearn_available() is False
        seen = []
        other = threading.Thread(target=lambda: seen.append(candidates.is_sklearn_available()))
        other.start()
        other.join()
        assert seen == [True]  # another thread's runs (a server's) keep transformers' own behaviour
        with fixed_threshold():
            pass
        assert candidates.is_sklearn_available() is False  # a nested run's exit keeps the outer one's setting
    assert candidates.is_sklearn_available() is True


def test_adaptive_stop_needs_a_confidence_stop():
    from fastdecode.config import build_config
    from fastdecode.speculative.drafters.draft_model import DraftModelConfig

    with pytest.raises(fastdecode.ParameterError, match="confidence_stop=0.4"):
        build_config(DraftModelConfig, {"adaptive_stop": "true"}, "spec.draft_model")
    assert build_config(DraftModelConfig, {"adaptive_stop": "true", "confidence_stop": "0.4"},
                        "spec.draft_model").adaptive_stop is True
