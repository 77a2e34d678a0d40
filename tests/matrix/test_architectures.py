"""Every architecture family users bring, tiny and random: ar.greedy equals transformers' greedy generate(), every
lossless method equals ar.greedy or is refused before its first step with the cause named, and rolling the cache
back then regenerating equals never having drafted (issue 19).

Models are built from configs here (fp32, CPU, seed 0): 2 layers, hidden 32, vocabulary 128, a larger init and an
lm_head scaled up so that greedy choices are well separated and the context (not only the last token) decides them.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
import transformers as T
from transformers.cache_utils import get_layer_types_and_kwargs

import fastdecode
import fastdecode.registry
from fastdecode.errors import IncompatibleMethodError
from fastdecode.hf.driver import check_sliding_assistant
from fastdecode.models import CausalLM
from fastdecode.models import capabilities as caps
from fastdecode.models.causal import cache_argument

V = 128
N = 14  # new tokens per generation
PROMPT = [5, 17, 33, 9, 17, 33, 41, 7, 60, 5, 17, 33]  # repeats, so lookup drafters find matches
SHORT = [70, 12, 99, 5, 17]
EOS = V  # one past the vocabulary: never generated, so every run makes exactly N tokens
COMMON = dict(vocab_size=V, bos_token_id=0, eos_token_id=EOS, pad_token_id=2, tie_word_embeddings=False)
WINDOW = 6  # shorter than prompt + output, so the window really drops positions
INIT = 0.2  # initializer_range: larger than the usual 0.02, so attention and mixers weigh the context


def _decoder(cls, **kw):
    base = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256, initializer_range=INIT, **COMMON)
    return cls(**{**base, **kw})


def _gemma(cls, **kw):
    return _decoder(cls, head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8, **kw)


ARCHS = {
    "llama": lambda: T.LlamaForCausalLM(_decoder(T.LlamaConfig)),
    "qwen2": lambda: T.Qwen2ForCausalLM(_decoder(T.Qwen2Config)),
    "qwen3": lambda: T.Qwen3ForCausalLM(_decoder(T.Qwen3Config, head_dim=8)),
    "mistral-window": lambda: T.MistralForCausalLM(_decoder(T.MistralConfig, sliding_window=WINDOW)),
    # eager: Gemma-2 caps its attention logits (attn_logit_softcapping), which SDPA cannot do; a model built from a
    # config got SDPA in transformers 5.17, whose SDPA path then dropped the cap (later versions refuse it), so
    # transformers' own outputs, the reference here, were not the model's (fastdecode applies the cap)
    "gemma2": lambda: T.Gemma2ForCausalLM(_gemma(T.Gemma2Config, attn_implementation="eager")),
    "gemma3": lambda: T.Gemma3ForCausalLM(_gemma(T.Gemma3TextConfig,
                                                 layer_types=["sliding_attention", "full_attention"])),
    "phi3": lambda: T.Phi3ForCausalLM(_decoder(T.Phi3Config)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                                   initializer_range=INIT, **COMMON)),
    "gpt-neox": lambda: T.GPTNeoXForCausalLM(_decoder(T.GPTNeoXConfig, num_key_value_heads=4)),
    "opt": lambda: T.OPTForCausalLM(T.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                                word_embed_proj_dim=32, max_position_embeddings=256, init_std=INIT,
                                                **COMMON)),
    "falcon": lambda: T.FalconForCausalLM(T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         max_position_embeddings=256, initializer_range=INIT,
                                                         **COMMON)),
    "olmo2": lambda: T.Olmo2ForCausalLM(_decoder(T.Olmo2Config)),
    "mixtral": lambda: T.MixtralForCausalLM(_decoder(T.MixtralConfig, num_local_experts=4, num_experts_per_tok=2)),
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=32, n_layer=2, n_head=4, initializer_range=INIT,
                                                      **COMMON)),
    "mamba": lambda: T.MambaForCausalLM(T.MambaConfig(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                                      conv_kernel=4, initializer_range=INIT, use_mambapy=False,
                                                      **COMMON)),
    "mamba2": lambda: T.Mamba2ForCausalLM(T.Mamba2Config(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                                         num_heads=8, head_dim=8, n_groups=1, conv_kernel=4,
                                                         chunk_size=16, initializer_range=INIT, **COMMON)),
    "jamba": lambda: T.JambaForCausalLM(_decoder(T.JambaConfig, attn_layer_period=2, attn_layer_offset=1,
                                                 expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                                                 num_experts_per_tok=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                                                 mamba_dt_rank=4)),
    "falcon-h1": lambda: T.FalconH1ForCausalLM(_decoder(T.FalconH1Config, head_dim=8, mamba_d_ssm=64, mamba_n_heads=8,
                                                       mamba_d_head=8, mamba_d_state=8, mamba_n_groups=1,
                                                       mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16)),
}
SLIDING = {"mistral-window", "gemma2", "gemma3"}
STATE = {"mamba": "MambaMixer", "mamba2": "Mamba2Mixer", "jamba": "JambaMambaMixer", "falcon-h1": "FalconH1Mixer"}
ALIBI = {"bloom"}


@functools.cache
def model(name: str) -> CausalLM:
    torch.manual_seed(0)
    module = ARCHS[name]().eval()
    with torch.no_grad():
        module.get_output_embeddings().weight.mul_(4.0)  # greedy margins well above float noise
    module.generation_config.eos_token_id = EOS
    module.generation_config.pad_token_id = 2
    return CausalLM(module, tokenizer=None, name=name)


@functools.cache
def greedy(name: str, prompt: tuple[int, ...]) -> list[int]:
    return fastdecode.generate(model(name), list(prompt), "ar.greedy", max_new_tokens=N).token_ids


def hf_generate(name: str, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' own greedy generate() on a left-padded batch."""
    width = max(map(len, prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model(name).model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=N, eos_token_id=EOS,
                                         pad_token_id=2)
    return out[:, width:].tolist()


def test_the_zoo_covers_every_cache_and_attention_kind():
    assert {n for n in ARCHS if caps.sliding_windows(model(n))} == SLIDING
    assert {n for n in ARCHS if caps.state_layer_types(model(n))} == set(STATE)
    assert {n for n in ARCHS if caps.uses_alibi(model(n))} == ALIBI
    assert {n for n in ARCHS if caps.attention_free(model(n))} == {"mamba", "mamba2"}
    assert caps.sliding_windows(model("gemma3")) == {0: WINDOW}
    assert caps.state_layer_types(model("mamba")) == ["MambaMixer (linear_attention)"]


@pytest.mark.parametrize("name", ARCHS)
def test_outputs_depend_on_the_context(name):
    """Greedy decisions that follow the whole context, not only the last token, so a cache bug changes them."""
    out = greedy(name, tuple(PROMPT))
    assert len(out) == N
    # one earlier token changed, inside the sliding windows too
    others = [greedy(name, tuple(PROMPT[:i] + [PROMPT[i] + 1] + PROMPT[i + 1 :])) for i in (-3, -2)]
    assert any(out != other for other in others)


@pytest.mark.parametrize("name", ARCHS)
def test_ar_greedy_equals_transformers_generate(name):
    assert greedy(name, tuple(PROMPT)) == hf_generate(name, [PROMPT])[0]
    assert greedy(name, tuple(SHORT)) == hf_generate(name, [SHORT])[0]


@pytest.mark.parametrize("name", ARCHS)
def test_left_padded_batch_equals_transformers_and_one_by_one(name):
    batch = fastdecode.generate(model(name), [PROMPT, SHORT], "ar.greedy", max_new_tokens=N)
    assert [r.token_ids for r in batch] == [greedy(name, tuple(PROMPT)), greedy(name, tuple(SHORT))]
    assert [r.token_ids for r in batch] == hf_generate(name, [PROMPT, SHORT])


# -- every lossless method ---------------------------------------------------------------------------------------
def _lossless() -> list[tuple[str, dict]]:
    cases = []
    for m in fastdecode.registry.list_methods("causal"):
        if not m.lossless or m.name == "ar.greedy" or m.draft_kind != "causal":
            continue  # spec.dlm_draft needs a masked-diffusion draft (tests/invariants/test_spec_dlm_draft.py)
        cases.append((m.name, {}))
        if m.name == "spec.suffix":
            cases.append((m.name, {"tree": True}))
    return cases


LOSSLESS = _lossless()
TREE = {"spec.lookahead", "spec.recycling", "spec.rsd", "spec.dyntree", "spec.medusa"}
HF_ASSISTED = {"hf.prompt_lookup", "hf.assisted"}
# transformers before 5.18 cannot run an assistant with sliding-window layers (hf/driver.py: check_sliding_assistant)
OLD_SLIDING_ASSISTANT = tuple(int(x) for x in T.__version__.split(".")[:2]) < (5, 18)


def _refusal(name: str, method: str, params: dict) -> str | None:
    """The message a method must be refused with on an architecture, or None when it must run."""
    if name in STATE and (method.startswith("spec.") or method in HF_ASSISTED):
        return rf"state-space layers \({STATE[name]} \("
    if name in ALIBI and (method in TREE or params.get("tree")):
        return "uses ALiBi attention"
    if method == "hf.assisted" and name in SLIDING and OLD_SLIDING_ASSISTANT:
        return "sliding-window attention layers .* cannot run as an assistant"
    if method == "spec.sparse_self" and not model(name).preallocated:  # sparse attention needs fastdecode's cache
        return "Sparse attention reads a subset of fastdecode's preallocated KV cache"
    return None


def _cases():
    for name in ARCHS:
        for method, params in LOSSLESS:
            marks = []
            tag = method + ("[tree]" if params.get("tree") else "")
            yield pytest.param(name, method, params, marks=marks, id=f"{name}-{tag}")


def _run(name: str, method: str, params: dict, prompts):
    draft = model(name) if fastdecode.get_method(method).needs_draft else None  # the target drafting for itself
    return fastdecode.generate(model(name), prompts, method, max_new_tokens=N, draft=draft, **params)


@pytest.mark.parametrize("name, method, params", list(_cases()))
def test_lossless_method_equals_ar_greedy_or_is_refused_up_front(name, method, params):
    refused = _refusal(name, method, params)
    if refused is None:
        results = _run(name, method, params, [PROMPT, SHORT])
        assert [r.token_ids for r in results] == [greedy(name, tuple(PROMPT)), greedy(name, tuple(SHORT))]
        return
    draft = model(name) if fastdecode.get_method(method).needs_draft else None
    events = fastdecode.stream(model(name), PROMPT, method, max_new_tokens=N, draft=draft, **params)
    with pytest.raises(IncompatibleMethodError, match=refused):
        next(events)  # raised before the first step's event


def test_refusals_name_the_cause_in_full():
    with pytest.raises(IncompatibleMethodError,
                       match=r"recurrent state-space layers \(MambaMixer \(linear_attention\)\)"):
        _run("mamba", "spec.pld", {}, PROMPT)
    with pytest.raises(IncompatibleMethodError, match=r"FalconH1Mixer \(hybrid\)"):
        _run("falcon-h1", "spec.ngram", {}, PROMPT)
    with pytest.raises(IncompatibleMethodError, match="BloomForCausalLM.*ALiBi.*chain method"):
        _run("bloom", "spec.lookahead", {}, PROMPT)
    with pytest.raises(IncompatibleMethodError, match="not supported with stateful models.*Use hf.greedy"):
        _run("mamba2", "hf.prompt_lookup", {}, PROMPT)
    with pytest.raises(IncompatibleMethodError, match="draft model 'mamba'"):
        fastdecode.generate(model("llama"), PROMPT, "hf.assisted", max_new_tokens=N, draft=model("mamba"))


def test_an_old_transformers_refuses_a_sliding_window_assistant_up_front():
    check_sliding_assistant(model("gemma2"), "hf.assisted", version="5.18.0")
    check_sliding_assistant(model("llama"), "hf.assisted", version="5.17.0")  # no sliding window: nothing to refuse
    with pytest.raises(IncompatibleMethodError, match=r"transformers 5\.17\.0 .*pip install -U 'transformers>=5\.18'"):
        check_sliding_assistant(model("mistral-window"), "hf.assisted", version="5.17.0")


@pytest.mark.parametrize("name", ARCHS)
def test_the_cache_goes_to_an_argument_of_the_models_forward(name):
    """A cache passed under a name the forward does not take lands in its **kwargs unread (Mamba's `cache_params`
    under transformers 5.17): every step would start from an empty cache."""
    m = model(name)
    assert m._cache_arg in inspect.signature(m.model.forward).parameters
    assert cache_argument({"input_ids": 0, "cache": 0, "past_key_values": 0}) == "cache"
    assert cache_argument({"input_ids": 0, "cache_params": 0}) == "cache_params"


# -- rollback ------------------------------------------------------------------------------------------------------
def _steps(m: CausalLM, cache, token: int, pos: int, n: int) -> tuple[list[int], torch.Tensor]:
    tokens, logits = [], []
    for _ in range(n):
        out = m.forward(torch.tensor([[token]]), torch.tensor([[pos]]), cache)[:, -1]  # [1, V]
        token, pos = int(out.argmax(-1)), pos + 1
        tokens.append(token)
        logits.append(out)
    return tokens, torch.cat(logits)


def _rollback_cases():
    for name in ARCHS:
        yield pytest.param(name, id=name)


@pytest.mark.parametrize("name", list(_rollback_cases()))
def test_rollback_then_regenerate_equals_never_drafting(name):
    m = model(name)
    L = len(PROMPT)
    cache = m.new_cache()
    first = int(m.forward(torch.tensor([PROMPT]), torch.arange(L)[None], cache)[:, -1].argmax(-1))
    if name in STATE:  # a recurrent state cannot go back: refused, at the cache and by every speculative method
        assert not cache.can_rollback()
        with pytest.raises(IncompatibleMethodError, match="cannot roll back"):
            cache.trim(1)
        return
    drafted, logits = _steps(m, cache, first, L, 8)  # 8 tokens "drafted", all in the cache
    assert cache.length == L + 8
    cache.crop(L + 3)  # keep 3 of them
    again, logits_again = _steps(m, cache, drafted[2], L + 3, 5)
    assert again == drafted[3:]
    torch.testing.assert_close(logits_again, logits[3:], rtol=0, atol=1e-5)
    assert [first] + drafted[:3] + again == greedy(name, tuple(PROMPT))[:9]


NATIVE = {"llama", "qwen2", "mistral-window"}  # the Llama-shaped decoders models/native.py runs directly


def test_the_direct_forward_serves_exactly_the_llama_shaped_decoders():
    assert {n for n in ARCHS if model(n).native is not None} == NATIVE


@pytest.mark.parametrize("name", sorted(NATIVE))
def test_direct_forward_equals_transformers_forward_bit_for_bit(name):
    """A padded batch prefill, a token-tree block over the cache and a decode step: logits and hidden states of the
    direct forward equal transformers' module forward exactly, and so do the caches they leave."""
    m = model(name)
    native = m.native
    prompts = [PROMPT, SHORT]
    width = max(map(len, prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)  # 0 -> {1, 2 -> 3}
    block = torch.tensor([[40, 41, 42, 43], [50, 51, 52, 53]])
    block_pos = positions[:, -1:] + 1 + torch.tensor([0, 1, 1, 2])
    outs = []
    for direct in (True, False):
        m.native = native if direct else None
        try:
            cache = m.new_cache(batch=2, capacity=width + 8)
            first = m.forward(ids, positions, cache, mask, hidden=True)
            second = m.forward(block, block_pos, cache, visible=tree, hidden=True)
            cache.crop_rows([width + 1, width + 2])  # keep a ragged part of the tree
            third = m.forward(torch.tensor([[7], [8]]), torch.tensor([[20], [21]]), cache, num_logits=1)
        finally:
            m.native = native
        outs.append((first.logits, first.hidden, second.logits, second.hidden, third,
                      cache.layers[1].keys[:, :, : width + 3].clone()))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ARCHS)
def test_chosen_layers_equal_transformers_hidden_states(name):
    """`forward(hidden=(0, -1))` finds every architecture's decoder layers: layer 0's output over a cached prefill
    equals transformers' own record of it (`hidden_states[1]`, after the embeddings; Mamba's tuple, and Mamba2's
    before transformers 5.25, has no embeddings: layer 0's output comes first)."""
    m = model(name)
    ids = torch.tensor([PROMPT])
    out = m.forward(ids, torch.arange(len(PROMPT))[None], m.new_cache(capacity=len(PROMPT)), num_logits=1,
                    hidden=(0, -1))
    with torch.inference_mode():
        states = m.model(input_ids=ids, output_hidden_states=True).hidden_states
        embedded = name not in ("mamba", "mamba2") or torch.equal(states[0], m.model.get_input_embeddings()(ids))
    ref = states[1 if embedded else 0]
    assert len(out.layers) == 2 and out.layers[1].shape == (1, len(PROMPT), m.config.hidden_size)
    torch.testing.assert_close(out.layers[0], ref, rtol=1e-5, atol=1e-5)


def test_sliding_windows_reads_the_one_dict_of_older_transformers(monkeypatch):
    """transformers 5.17 (the GPU machine's) returns one kwargs dict for every layer, 5.2x one dict per layer: both
    give the same windows."""
    gemma = model("gemma3")
    types, per_layer = get_layer_types_and_kwargs(caps._text_config(gemma))
    shared = per_layer if isinstance(per_layer, dict) else next(kw for kw in per_layer if kw.get("sliding_window"))
    monkeypatch.setattr(caps, "get_layer_types_and_kwargs", lambda config: (types, dict(shared)))
    assert caps.sliding_windows(gemma) == {0: WINDOW}
    monkeypatch.setattr(caps, "get_layer_types_and_kwargs", lambda config: (["full_attention"] * len(types), {}))
    assert caps.sliding_windows(gemma) == {}
