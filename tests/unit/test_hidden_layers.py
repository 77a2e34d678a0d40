"""`CausalLM.forward(..., hidden=(i, ...))`: chosen decoder layers' outputs for every position computed.

On a tiny random fp32 Llama the direct forward (models/native.py) and transformers' forward through fastdecode's
attention return the same layers bit for bit; both, and transformers' own cache path (`_legacy`), equal a plain
transformers forward's `hidden_states[i + 1]` to 1e-6 (absolute + relative: a cached block sums in another order
than one full pass).
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from fastdecode.errors import ParameterError
from fastdecode.models import CausalLM
from fastdecode.models.causal import CausalOutput

ATOL = 1e-6
IDS = torch.tensor([[5, 17, 33, 9, 17, 33, 41, 7, 60]])  # a 5-token prefill, then a 4-token verification block
ASK = (0, 2, -1, 1, 0)  # any order, negative and repeated indices


def _llama(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    return CausalLM(LlamaForCausalLM(config).eval())


def _reference(m: CausalLM, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        return m.model(input_ids=ids, output_hidden_states=True).hidden_states


def _prefill_then_verify(m: CausalLM, ask=ASK) -> tuple[CausalOutput, CausalOutput]:
    """A cached prefill of 5 tokens, then a verification-style block of 4 that keeps only the last logits."""
    cache = m.new_cache(capacity=16)
    pos = torch.arange(IDS.shape[1])[None]
    first = m.forward(IDS[:, :5], pos[:, :5], cache, hidden=ask)
    block = m.forward(IDS[:, 5:], pos[:, 5:], cache, num_logits=1, visible=torch.ones(4, 4, dtype=torch.bool).tril(),
                      hidden=ask)
    return first, block


def _check_against_transformers(m: CausalLM, first: CausalOutput, block: CausalOutput, final_norm) -> None:
    ref = _reference(m, IDS)
    count = len(ref) - 1
    assert block.logits.shape[1] == 1  # fewer logits, every position's layers
    for out, cols in ((first, slice(0, 5)), (block, slice(5, 9))):
        assert len(out.layers) == len(ASK)
        for i, layer in zip(ASK, out.layers, strict=True):
            assert layer.shape == (1, cols.stop - cols.start, m.config.hidden_size)
            i %= count
            if i < count - 1:  # transformers' last entry is after the final norm: check ours through that norm
                torch.testing.assert_close(layer, ref[i + 1][:, cols], rtol=ATOL, atol=ATOL)
            else:
                torch.testing.assert_close(final_norm(layer), ref[-1][:, cols], rtol=ATOL, atol=ATOL)
        torch.testing.assert_close(out.hidden, ref[-1][:, cols], rtol=ATOL, atol=ATOL)


def test_direct_and_transformers_forward_return_the_same_layers_bit_for_bit():
    m = _llama()
    assert m.native is not None
    direct = _prefill_then_verify(m)
    native, m.native = m.native, None
    try:
        planned = _prefill_then_verify(m)
    finally:
        m.native = native
    for a, b in zip(direct, planned, strict=True):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
        assert all(torch.equal(x, y) for x, y in zip(a.layers, b.layers, strict=True))
    with torch.inference_mode():
        _check_against_transformers(m, *direct, m.model.model.norm)


def test_transformers_own_cache_path_returns_the_same_layers():
    """`_legacy` (transformers' DynamicCache and masks), forced on the Llama; GPT-2 on both transformers paths."""
    m = _llama()
    m.preallocated, m.native = False, None
    first, block = _prefill_then_verify(m)
    with torch.inference_mode():
        _check_against_transformers(m, first, block, m.model.model.norm)
    torch.manual_seed(0)
    gpt2 = CausalLM(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                               bos_token_id=0, eos_token_id=1)).eval())
    assert gpt2.native is None
    for preallocated in (True, False):  # fastdecode's attention and cache, then transformers' own
        gpt2.preallocated = preallocated
        first, block = _prefill_then_verify(gpt2)
        with torch.inference_mode():
            _check_against_transformers(gpt2, first, block, gpt2.model.transformer.ln_f)


def test_a_token_tree_block_returns_every_position():
    m = _llama()
    cache = m.new_cache(capacity=16)
    m.forward(IDS[:, :5], torch.arange(5)[None], cache)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    out = m.forward(IDS[:, 5:], torch.tensor([[5, 6, 6, 7]]), cache, visible=tree, num_logits=2, hidden=(-2,))
    assert out.logits.shape[1] == 2 and len(out.layers) == 1 and out.layers[0].shape == (1, 4, 32)


def test_hidden_true_and_false_are_unchanged():
    m = _llama()
    ids, pos = IDS[:, :5], torch.arange(5)[None]
    plain = m.forward(ids, pos)
    assert isinstance(plain, torch.Tensor)
    last = m.forward(ids, pos, hidden=True)
    assert isinstance(last, CausalOutput) and last.layers == () and torch.equal(last.logits, plain)
    none = m.forward(ids, pos, hidden=())
    assert isinstance(none, CausalOutput) and none.layers == () and torch.equal(none.hidden, last.hidden)
    ask = m.forward(ids, pos, hidden=[1])
    assert torch.equal(ask.logits, plain) and torch.equal(ask.hidden, last.hidden)


def test_no_hook_stays_on_the_layers():
    m = _llama()
    m.native = None
    m.forward(IDS, torch.arange(9)[None], hidden=True)  # transformers installs its own recording hooks once
    before = [len(layer._forward_hooks) for layer in m.model.model.layers]
    m.forward(IDS, torch.arange(9)[None], hidden=(0, 1))
    with pytest.raises(ParameterError):
        m.forward(IDS, torch.arange(9)[None], hidden=(0, 7))
    assert [len(layer._forward_hooks) for layer in m.model.model.layers] == before


@pytest.mark.parametrize("bad, message", [
    ((3,), "layer 3 does not exist; this model runs 3 decoder layers"),
    ((-4,), "layer -4 does not exist"),
    ((0, "1"), "must be integers"),
    ((True,), "must be integers"),
    ((0.5,), "must be integers"),
    ((torch.tensor(0.5),), "must be integers"),
    ("0", "a sequence of decoder layer indices"),
    (1, "a sequence of decoder layer indices"),
])
def test_bad_layer_indices_are_refused(bad, message):
    m = _llama()
    with pytest.raises(ParameterError, match=message):
        m.forward(IDS, torch.arange(9)[None], hidden=bad)
