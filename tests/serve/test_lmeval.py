"""lm-evaluation-harness as a real client (issue #29): its `local-completions` model against a live server on
zoo:ar-small, over two local tasks (tests/data/lmeval/: a multiple-choice task scored by loglikelihood, and a
generate_until task), with both of its tokenizer backends: `huggingface` (the model's own tokenizer files, with the
BOS the zoo's tokenizer adds) and `remote` (the server's /tokenizer_info, /tokenize and /detokenize, no BOS).
What lm-eval reads must equal what fastdecode computes in-process on the same token ids. Skips without lm_eval."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from serve_live import Live  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.models.loading import resolve  # noqa: E402
from fastdecode.serve import ServeConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NAME = "zoo:ar-small"
TASKS = ["fastdecode_sudoku_choice", "fastdecode_reverse_generate"]


@pytest.fixture(scope="module")
def small():
    return fastdecode.load(NAME)


@pytest.fixture(scope="module")
def server(small):
    live = Live(small, ServeConfig(served_name=NAME))
    yield live
    live.stop()


def evaluate(url: str, backend: dict[str, object]) -> dict:
    """lm-eval's `local-completions` over the two local tasks, as `lm_eval --model local-completions ...` runs it."""
    from lm_eval.tasks import TaskManager

    args = {"model": NAME, "base_url": f"{url}/v1/completions", "num_concurrent": 1, "max_length": 512, **backend}
    return lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=TASKS, log_samples=True,
                                   task_manager=TaskManager(include_path=str(ROOT / "tests" / "data" / "lmeval"),
                                                            include_defaults=False),  # not lm-eval's 14k files
                                   bootstrap_iters=0)


def encode_pair(tok, context: str, continuation: str, bos: bool) -> tuple[list[int], list[int]]:
    """lm-eval's split of a loglikelihood request: the context's trailing spaces go to the continuation, the whole
    text is encoded once and the continuation is what follows the context's tokens."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok(context + continuation, add_special_tokens=bos)["input_ids"]
    n = len(tok(context, add_special_tokens=bos)["input_ids"])
    return whole[:n], whole[n:]


def loglikelihood(model, context: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([context + continuation])  # [1, T]
    logits = model.forward(ids, torch.arange(ids.shape[1])[None])[0, len(context) - 1 : -1]  # [C, V]
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(continuation)[:, None]).sum())


def greedy(model, prompt: list[int], until: str) -> str:
    text = fastdecode.generate(model, [prompt], method="ar.greedy", max_new_tokens=16)[0].text
    return text.split(until)[0]


def check(model, out: dict, bos: bool) -> None:
    tok = model.tokenizer
    choice = out["samples"]["fastdecode_sudoku_choice"]
    generated = out["samples"]["fastdecode_reverse_generate"]
    assert len(choice) == 4 and len(generated) == 4
    for sample in choice:
        for (context, continuation), ((ll, _),) in zip(sample["arguments"], sample["resps"], strict=True):
            ctx, cont = encode_pair(tok, context, continuation, bos)
            assert ll == pytest.approx(loglikelihood(model, ctx, cont), abs=1e-3), (context, continuation)
    for sample in generated:
        prompt, kwargs = sample["arguments"][0]
        ids = tok(prompt, add_special_tokens=bos)["input_ids"]
        assert sample["resps"][0][0] == greedy(model, ids, kwargs["until"][0]), prompt
    # the task's score is lm-eval's reading of those same answers
    solved = sum(s["resps"][0][0] == s["target"] for s in generated) / len(generated)
    assert out["results"]["fastdecode_reverse_generate"]["exact_match,none"] == pytest.approx(solved)


def test_lm_eval_with_the_models_tokenizer_and_its_bos(server, small, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task files name their data relative to the repository root
    out = evaluate(server.url, {"tokenizer_backend": "huggingface", "tokenizer": str(resolve(NAME)),
                                "add_bos_token": True})
    check(small, out, bos=True)


def test_lm_eval_with_the_servers_tokenizer_endpoints(server, small, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = evaluate(server.url, {"tokenizer_backend": "remote"})
    check(small, out, bos=False)
