"""Every bad input raises the intended error with a message that says how to fix it."""

from __future__ import annotations

import json
import shutil

import pytest

import fastdecode
from fastdecode import IncompatibleMethodError, ModelLoadError, ParameterError, PromptError, UnknownMethodError


def copy_with_config(src, dst, **changes):
    """A copy of the model folder `src` at `dst` with config.json fields changed; returns `dst`."""
    shutil.copytree(src, dst)
    cfg_path = dst / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **changes}))
    return dst

def test_unknown_method_lists_close_names(causal):
    with pytest.raises(UnknownMethodError, match=r"Did you mean 'ar.greedy'"):
        fastdecode.generate(causal, "hi", "ar.gredy")


def test_method_that_does_not_fit_the_model_kind(diffusion):
    with pytest.raises(IncompatibleMethodError, match=r"needs a causal model.*diffusion model"):
        fastdecode.generate(diffusion, "hi", "ar.greedy")


@pytest.mark.parametrize(
    "params, pattern",
    [
        ({"max_new_token": 5}, r"Unknown parameter 'max_new_token'.*Did you mean 'max_new_tokens'"),
        ({"temprature": 0.5}, r"Did you mean 'temperature'"),
        ({"max_new_tokens": 0}, r"max_new_tokens=0 is invalid: it must be at least 1"),
        ({"top_p": 1.5}, r"top_p=1.5 is invalid: it must be in \(0, 1\]"),
        ({"temperature": -1}, r"temperature=-1.0 is invalid"),
        ({"temperature": float("nan")}, r"temperature=nan is invalid"),
        ({"temperature": float("inf")}, r"temperature=inf is invalid: it must be a finite number"),
        ({"temperature": "inf", "top_k": 2}, r"temperature=inf is invalid"),
        ({"top_k": "many"}, r"top_k='many' is invalid: expected a value of type int"),
        ({"top_k": 2.5}, r"expected a value of type int"),
    ],
)
def test_bad_parameters(causal, params, pattern):
    with pytest.raises(ParameterError, match=pattern):
        fastdecode.generate(causal, "hi", "ar.sample", **params)


@pytest.mark.parametrize("method", ["spec.pld", "spec.suffix", "dlm.baseline"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), "inf"])
def test_a_temperature_that_is_not_finite_is_refused_by_every_sampling_family(causal, diffusion, method, value):
    model, extra = (diffusion, {}) if method.startswith("dlm.") else (causal, {"top_k": 2})
    with pytest.raises(ParameterError, match=r"temperature=(inf|nan) is invalid: it must be a finite number"):
        fastdecode.generate(model, "hi", method, temperature=value, **extra)


def test_string_parameters_are_coerced(causal):
    r = fastdecode.generate(causal, "hi", "ar.sample", max_new_tokens="3", top_k="2", seed="1", temperature="0.7")
    assert len(r.token_ids) <= 3


@pytest.mark.parametrize("prompt", ["", "   \n", []])
def test_empty_prompt(causal, prompt):
    with pytest.raises(PromptError, match=r"empty|no tokens|No prompts"):
        fastdecode.generate(causal, prompt)


def test_empty_prompt_in_batch_names_it(causal):
    with pytest.raises(PromptError, match=r"Prompt 1 is empty"):
        fastdecode.generate(causal, ["fine", ""])


def test_prompt_plus_max_tokens_too_long(causal):
    limit = causal.max_positions
    with pytest.raises(PromptError, match=r"more than the model's 128 positions.*at most"):
        fastdecode.generate(causal, list(range(5, 5 + limit - 10)), max_new_tokens=20)


def test_missing_folder():
    with pytest.raises(ModelLoadError, match=r"does not exist"):
        fastdecode.load("/no/such/model")


def test_unknown_zoo_name():
    with pytest.raises(ModelLoadError, match=r"No zoo model named"):
        fastdecode.load("zoo:not-a-model")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config.json"):
        fastdecode.load(tmp_path)


def test_missing_weights(tmp_path, causal_dir):
    shutil.copytree(causal_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model.safetensors is missing"):
        fastdecode.load(tmp_path / "m")


def test_pickled_weights_are_refused(tmp_path, causal_dir):
    shutil.copytree(causal_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").rename(tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"pytorch_model.bin, a pickle format.*safetensors"):
        fastdecode.load(tmp_path / "m")


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_weights(tmp_path, causal_dir, damage):
    shutil.copytree(causal_dir, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match=r"corrupt or truncated"):
        fastdecode.load(tmp_path / "m")


def test_remote_code_stays_off(tmp_path, causal_dir):
    # as a LLaDA checkpoint ships its code
    copy_with_config(causal_dir, tmp_path / "m", model_type="llada",
                     auto_map={"AutoModel": "modeling_llada.LLaDAModelLM"})
    with pytest.raises(ModelLoadError, match=r"trust_remote_code=True"):
        fastdecode.load(tmp_path / "m")


def test_weights_that_do_not_match_config(tmp_path, causal_dir):
    copy_with_config(causal_dir, tmp_path / "m", num_hidden_layers=3)
    with pytest.raises(ModelLoadError, match=r"lacks weights"):
        fastdecode.load(tmp_path / "m")


def test_an_empty_list_of_prompts_is_named_as_such(causal):
    with pytest.raises(PromptError, match=r"No prompts given"):
        fastdecode.generate(causal, [])


@pytest.mark.parametrize(
    "prompt, pattern",
    [
        (b"the quick", r"is bytes: decode it to text first"),
        (bytearray(b"the quick"), r"is bytes: decode it to text first"),
        (42, r"is int, not text or a list of token ids"),
        (None, r"is NoneType, not text or a list of token ids"),
        ({}, r"is dict, not text or a list of token ids"),
        ([1, "2", 3], r"item at position 1 is str, not a token id"),
        ([1, 2.5], r"item at position 1 is float, not a token id"),
        (["fine", 7], r"Prompt 1 is int, not text or a list of token ids"),
    ],
)
def test_prompts_of_the_wrong_type(causal, prompt, pattern):
    with pytest.raises(PromptError, match=pattern):
        fastdecode.generate(causal, prompt, max_new_tokens=2)


@pytest.mark.parametrize("bad", [-1, 10_000])
def test_token_ids_outside_the_vocabulary(causal, bad):
    with pytest.raises(
        PromptError, match=rf"token id {bad} at position 1 is outside the vocabulary \(0 to {causal.vocab_size - 1}\)"
    ):
        fastdecode.generate(causal, [5, bad, 6], max_new_tokens=2)


def test_text_that_is_not_utf8(causal):
    text = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands over non-UTF-8 bytes of argv
    with pytest.raises(PromptError, match=r"not UTF-8.*0xe9"):
        fastdecode.generate(causal, text, max_new_tokens=2)


def test_a_model_or_draft_passed_as_a_string(causal, causal_dir):
    with pytest.raises(fastdecode.ArgumentError, match=r"fastdecode.load\('zoo:ar-small'\)"):
        fastdecode.generate("zoo:ar-small", "hi")
    with pytest.raises(fastdecode.ArgumentError, match=r"draft= must be a model from fastdecode.load"):
        fastdecode.generate(causal, "hi", "spec.draft_model", draft=str(causal_dir))


def test_token_id_prompts_still_work(causal):
    import torch

    by_list = fastdecode.generate(causal, [5, 6, 7], max_new_tokens=3)
    assert fastdecode.generate(causal, torch.tensor([5, 6, 7]), max_new_tokens=3).token_ids == by_list.token_ids
    batch = fastdecode.generate(causal, [[5, 6, 7], [8, 9]], max_new_tokens=3)
    assert isinstance(batch, list) and batch[0].token_ids == by_list.token_ids


def test_kind_that_contradicts_a_causal_folder(causal_dir):
    with pytest.raises(
        ModelLoadError, match=r"holds a causal model \(architectures LlamaForCausalLM\).*kind='diffusion'.*--kind"
    ):
        fastdecode.load(causal_dir, kind="diffusion")


def test_kind_that_contradicts_a_diffusion_folder(diffusion_dir):
    with pytest.raises(ModelLoadError, match=r"holds a diffusion model") as e:
        fastdecode.load(diffusion_dir, kind="causal")
    assert len(str(e.value)) < 400  # not transformers' list of every causal class


def test_unknown_model_type_without_code_does_not_suggest_remote_code(tmp_path, causal_dir):
    copy_with_config(causal_dir, tmp_path / "m", model_type="no-such-arch")
    with pytest.raises(ModelLoadError, match=r"ships no modelling code") as e:
        fastdecode.load(tmp_path / "m")
    assert "trust_remote_code" not in str(e.value)
    (tmp_path / "m" / "modeling_x.py").write_text("")
    with pytest.raises(ModelLoadError, match=r"trust_remote_code=True"):
        fastdecode.load(tmp_path / "m")


def test_kind_that_cannot_be_told_names_the_cli_flag(tmp_path, causal_dir):
    copy_with_config(causal_dir, tmp_path / "m", model_type="custom", architectures=["CustomModel"],
                     auto_map={"AutoModel": "modeling_x.CustomModel"})
    with pytest.raises(ModelLoadError, match=r"kind='causal' or kind='diffusion' \(CLI: --kind causal\|diffusion\)"):
        fastdecode.load(tmp_path / "m", trust_remote_code=True)


def test_pickle_advice_is_a_conversion_that_runs_today(tmp_path, causal_dir, causal):
    """The advice names calls today's transformers has, and following it gives a folder fastdecode loads."""
    import re

    import torch
    import transformers

    shutil.copytree(causal_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    torch.save(causal.model.state_dict(), tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as refused:
        fastdecode.load(tmp_path / "m")
    advice = re.search(r"transformers\.(\w+)\.from_pretrained\(DIR\)\.save_pretrained\(NEW_DIR\)", str(refused.value))
    assert advice and "safe_serialization" not in str(refused.value)
    auto = getattr(transformers, advice.group(1))
    auto.from_pretrained(tmp_path / "m").save_pretrained(tmp_path / "new")
    shutil.copy(tmp_path / "m" / "tokenizer.json", tmp_path / "new")
    converted = fastdecode.load(tmp_path / "new")
    assert fastdecode.generate(converted, "the quick", max_new_tokens=4).token_ids == fastdecode.generate(
        causal, "the quick", max_new_tokens=4).token_ids


def test_a_prompt_that_fills_the_context_is_told_to_shrink_not_the_budget(causal):
    """A prompt with no room left for even one token: lowering max_new_tokens cannot help, so the fix says so."""
    import pytest

    import fastdecode
    from fastdecode.errors import PromptError

    limit = causal.max_positions
    with pytest.raises(PromptError, match=f"Shorten the prompt to at most {limit - 1} tokens") as e:
        fastdecode.generate(causal, [5] * limit, "ar.greedy", max_new_tokens=4)
    assert "at most 0" not in str(e.value)
    with pytest.raises(PromptError, match="lower max_new_tokens to at most 4"):
        fastdecode.generate(causal, [5] * (limit - 4), "ar.greedy", max_new_tokens=8)
