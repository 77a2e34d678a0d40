"""vLLM's shapes beyond OpenAI's API: `/tokenizer_info`, token-id checks for `/detokenize`, and `prompt_logprobs`.

Kept apart from `app.py` (the routes) so that what a vLLM client (lm-eval's remote tokenizer among them) reads is
in one place.
"""

from __future__ import annotations

from typing import Any

from ..models.base import ModelAdapter
from .protocol import ServeError


def token_text(model: ModelAdapter, token: int) -> str:
    """A token's text as logprobs show it; an end-of-sequence token shows as the empty string."""
    return model.decode([token]) if token not in model.eos_token_ids else ""


def check_ids(model: ModelAdapter, ids: list[int], param: str) -> None:
    """Ids the tokenizer cannot decode are a 400, not a tokenizer's exception (a 500)."""
    vocab = model.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ServeError(400, f"Token id {bad[0]} is outside the vocabulary (0 to {vocab - 1}).", param=param)


def tokenizer_info(model: ModelAdapter) -> dict[str, Any]:
    """vLLM's /tokenizer_info: the special tokens, the context and the chat template a client needs to tokenise
    the way the server does."""
    tok = model.tokenizer
    info: dict[str, Any] = {"tokenizer_class": type(tok).__name__ if tok is not None else None,
                            "model_max_length": model.max_positions, "max_model_len": model.max_positions,
                            "eos_token_ids": sorted(model.eos_token_ids), "chat_template": None}
    if tok is None:
        return info
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tok, name, None)
        info[name] = str(value) if value is not None else None
        info[name + "_id"] = getattr(tok, name + "_id", None)
    bos = info["bos_token_id"]  # whether encoding text adds it (a post-processor may, whatever add_bos_token says)
    info["add_bos_token"] = bos is not None and list(tok("a", add_special_tokens=True)["input_ids"][:1]) == [bos]
    info["chat_template"] = getattr(tok, "chat_template", None)
    info["vocab_size"] = len(tok) if hasattr(tok, "__len__") else None
    return info


def vllm_prompt_logprobs(lps: list, model: ModelAdapter, k: int) -> list[dict[str, Any] | None]:
    """vLLM's prompt_logprobs: per prompt token (the first one None) a map from token id to its logprob, rank and
    text, holding the prompt's own token and the top k."""
    out: list[dict[str, Any] | None] = []
    for token, lp, top, rank in lps:
        if lp is None:
            out.append(None)
            continue
        entry = {str(token): {"logprob": lp, "rank": rank, "decoded_token": token_text(model, token)}}
        for r, (i, v) in enumerate(top[:k], start=1):
            entry.setdefault(str(i), {"logprob": v, "rank": r, "decoded_token": token_text(model, i)})
        out.append(entry)
    return out
