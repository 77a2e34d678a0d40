"""The image-model contract (docs/image.md): layout, code-only generation, Result.image, and classifier-free
guidance below the drivers, checked against a reference decoder that runs two separate full forwards per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from statistical.sampling_stats import chi_square_p_value  # tests/ is on the path (rootdir conftest)

import fastdecode
from fastdecode.errors import ParameterError, PromptError


def reference_logits(model, prefix: list[int], scale: float) -> torch.Tensor:
    """Guided next-token logits `[V]` of `prefix` from two uncached forwards of the module: u + s (c - u)."""
    image = model.image
    uncond = [image.null_token] + prefix[1:]
    with torch.no_grad():
        c = model.model(torch.tensor([prefix], device=model.device)).logits[0, -1].float().cpu()
        u = model.model(torch.tensor([uncond], device=model.device)).logits[0, -1].float().cpu()
    guided = u + scale * (c - u)
    guided[image.K:] = float("-inf")
    return guided

def reference_greedy(model, label: str, scale: float) -> list[int]:
    prefix = [model.image.label_token(label)]
    for _ in range(model.image.tokens):
        prefix.append(int(reference_logits(model, prefix, scale).argmax()))
    return prefix[1:]


def test_layout_of_a_digit_model(tiny_image_model) -> None:
    image = tiny_image_model.image
    assert (image.K, image.C, image.null_token, image.grid, image.d) == (4, 10, 14, (8, 8), 1)
    assert image.label_token("7") == 11 and image.label_token("null") == 14
    assert tiny_image_model.encode("7") == [11]
    assert torch.allclose(image.codebook[:, 0], torch.tensor([0.0, 1 / 3, 2 / 3, 1.0]))


def test_generate_writes_one_image_of_codes(tiny_image_model) -> None:
    r = fastdecode.generate(tiny_image_model, "7")
    image = tiny_image_model.image
    assert len(r.token_ids) == 64 and all(0 <= t < image.K for t in r.token_ids)
    assert r.prompt_ids == [image.label_token("7")]
    assert r.image is not None and r.image.shape == (8, 8) and r.image.dtype == np.uint8
    assert np.array_equal(r.image, image.decode(torch.tensor([r.token_ids]))[0])
    assert r.stats.forwards == 64 and r.stats.finish_reason == "length"


def test_scale_one_is_unguided(tiny_image_guided) -> None:
    """cfg_scale=1 overrides the folder's default of 3 and gives exactly the conditional model's greedy decode."""
    r = fastdecode.generate(tiny_image_guided, "0", cfg_scale=1)
    assert r.token_ids == reference_greedy(tiny_image_guided, "0", 1.0)
    default = fastdecode.generate(tiny_image_guided, "0").token_ids
    assert default == reference_greedy(tiny_image_guided, "0", 3.0) != r.token_ids  # the default (3) guides


@pytest.mark.parametrize("scale", [0.0, 3.0])
def test_guided_logits_are_u_plus_s_times_c_minus_u(tiny_image_model, scale: float) -> None:
    """One cached guided forward per step equals two separate uncached forwards combined, at every step."""
    model = tiny_image_model.with_scale(scale)
    tokens = fastdecode.generate(model, "5").token_ids
    prompt = [model.image.label_token("5")]
    cache = model.new_cache(1)
    dev = model.device
    logits = model.forward(torch.tensor([prompt], device=dev), torch.tensor([[0]], device=dev), cache)[0, -1].cpu()
    for i, t in enumerate(tokens[:12]):
        expected = reference_logits(model, prompt + tokens[:i], scale)
        assert torch.allclose(logits, expected, atol=1e-4, equal_nan=False)
        logits = model.forward(torch.tensor([[t]], device=dev), torch.tensor([[i + 1]], device=dev), cache)[0, -1].cpu()


def test_guided_greedy_matches_the_reference(tiny_image_model) -> None:
    r = fastdecode.generate(tiny_image_model, "0", cfg_scale=3)
    assert r.token_ids == reference_greedy(tiny_image_model, "0", 3.0)
    assert r.stats.forwards == 64  # the conditional and unconditional rows share each forward


@pytest.mark.parametrize("method", ["spec.jacobi", "spec.pld", "spec.lookahead"])
def test_lossless_methods_stay_lossless_under_guidance(tiny_image_model, method: str) -> None:
    prompts = ["1", "7", "null"]
    base = fastdecode.generate(tiny_image_model, prompts, "ar.greedy", cfg_scale=2.5)
    got = fastdecode.generate(tiny_image_model, prompts, method, cfg_scale=2.5)
    assert [r.token_ids for r in got] == [r.token_ids for r in base]
    assert all(r.image is not None and r.image.shape == (8, 8) for r in got)


def test_guided_sampling_follows_the_guided_distribution(tiny_image_model) -> None:
    """ar.sample's first codes under guidance against softmax(u + s (c - u)) (chi-square), and seeded runs repeat."""
    n = 400
    runs = fastdecode.generate(tiny_image_model, ["2"] * n, "ar.sample", cfg_scale=4, seed=3)
    first = [r.token_ids[0] for r in runs]
    p = torch.softmax(reference_logits(tiny_image_model, [tiny_image_model.image.label_token("2")], 4.0), -1)
    assert chi_square_p_value(first, p) > 1e-3
    once, again = (fastdecode.generate(tiny_image_model, ["2"] * 3, "ar.sample", cfg_scale=4, seed=5) for _ in "ab")
    assert [r.token_ids for r in once] == [r.token_ids for r in again]
    assert all(0 <= t < tiny_image_model.image.K for r in runs for t in r.token_ids)


def test_text_models_refuse_guidance(causal) -> None:
    with pytest.raises(ParameterError, match="only image models"):
        fastdecode.generate(causal, "hello", cfg_scale=2)
    assert fastdecode.generate(causal, "hello", cfg_scale=1, max_new_tokens=3).image is None


def test_bad_image_requests_say_how_to_fix(tiny_image_model) -> None:
    with pytest.raises(PromptError, match="one label"):
        fastdecode.generate(tiny_image_model, "seven")
    with pytest.raises(PromptError, match="one class label"):
        fastdecode.generate(tiny_image_model, [1, 2])
    with pytest.raises(ParameterError, match="exactly 64 tokens"):
        fastdecode.generate(tiny_image_model, "7", max_new_tokens=10)
    with pytest.raises(ParameterError, match=">= 0"):
        fastdecode.generate(tiny_image_model, "7", cfg_scale=-1)
