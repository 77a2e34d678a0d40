"""Every registered method runs on a compatible tiny model and yields valid Stats."""

from __future__ import annotations

import pytest

import fastdecode

# methods whose optional package (Method.requires) is missing here are skipped, not failed: CI installs no extras
# such as llama-cpp-python; tests/unit/test_llamacpp.py checks the refusal they give instead
# methods declared `images_only` run on the tiny image model instead (tests/image/), and refuse a text model here
METHODS = [pytest.param(m.name, marks=pytest.mark.skipif(bool(m.missing()), reason=f"needs {', '.join(m.missing())}"))
           for m in fastdecode.methods() if not m.images_only]
IMAGES_ONLY = [m.name for m in fastdecode.methods() if m.images_only]


@pytest.mark.parametrize("name", METHODS)
def test_method_runs_and_stats_are_consistent(name, causal, diffusion):
    method = fastdecode.get_method(name)
    model = causal if method.kind == "causal" else diffusion
    # the target drafting for itself is a valid causal draft; the tiny MDLM shares its tokenizer
    draft = (diffusion if method.draft_kind == "diffusion" else causal) if method.needs_draft else None
    results = fastdecode.generate(model, ["the quick brown", "def"], name, max_new_tokens=12, draft=draft)
    for r in results:
        s = r.stats
        assert 1 <= s.new_tokens == len(r.token_ids) <= 12
        assert s.forwards >= 1 and s.tokens_per_forward == pytest.approx(s.new_tokens / s.forwards)
        assert s.accepted <= s.proposed or s.proposed == 0
        assert s.wall_s > 0 and s.tokens_per_s > 0 and s.peak_rss_mb > 0
        assert s.prompt_tokens == len(r.prompt_ids)
        assert all(t not in model.eos_token_ids for t in r.token_ids[:-1])
        assert method.description


@pytest.mark.parametrize("name", IMAGES_ONLY)
def test_image_only_methods_refuse_a_text_model_and_name_the_fitting_ones(name, causal):
    with pytest.raises(fastdecode.IncompatibleMethodError, match="image models only.*Methods that fit it: .*ar.greedy"):
        fastdecode.generate(causal, "the", name, max_new_tokens=4)


def test_every_method_documents_its_parameters():
    for m in fastdecode.methods():
        assert m.params()[0][0] == "max_new_tokens"


@pytest.mark.parametrize("name", [m.name for m in fastdecode.methods() if m.needs_draft])
def test_methods_needing_a_draft_refuse_to_run_without_one(name, causal, diffusion):
    with pytest.raises(fastdecode.IncompatibleMethodError, match="needs a draft model"):
        fastdecode.generate(causal, "the", name, max_new_tokens=4)
    kind = fastdecode.get_method(name).draft_kind
    wrong, expected = (
        (causal, "must be a masked-diffusion LM") if kind == "diffusion" else (diffusion, "must be a causal LM")
    )
    with pytest.raises(fastdecode.IncompatibleMethodError, match=expected):
        fastdecode.generate(causal, "the", name, max_new_tokens=4, draft=wrong)
