"""The home of trained heads: a head kind defined here saves and loads back exactly, by folder and by zoo name, and
every way a folder can be wrong is refused with the cause named."""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
import weakref
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from fastdecode.errors import IncompatibleMethodError, ModelLoadError
from fastdecode.heads import (
    Head,
    HeadConfig,
    Target,
    head_class,
    head_kinds,
    head_names,
    load_head,
    register_head,
    save_head,
)
from fastdecode.heads import io as head_io
from fastdecode.models import CausalLM


@dataclass(frozen=True)
class FuseConfig(HeadConfig):
    hidden_size: int = 16
    layers: tuple[int, ...] = (0, -1)  # which target layers the head fuses, EAGLE-3 style
    draft_vocab: int = 8
    note: str = "test"


@register_head("test-fuse")
class Fuse(Head):
    """fc over the concatenated target layers, a norm, a reduced-vocabulary lm_head and an integer `d2t` buffer."""

    config_class = FuseConfig

    def __init__(self, config: FuseConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        H = config.hidden_size
        self.fc = nn.Linear(len(config.layers) * H, H, bias=False)
        self.norm = nn.Parameter(torch.ones(H))
        self.lm_head = nn.Linear(H, config.draft_vocab, bias=True)
        self.register_buffer("d2t", torch.arange(config.draft_vocab) * 3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # [B, T, n*H] -> [B, T, V']
        return self.lm_head(self.fc(features) * self.norm)


TARGET = Target(name="zoo:tiny", architecture="LlamaForCausalLM", hidden_size=16, num_layers=2, vocab_size=32)


def _head(seed: int = 0) -> Fuse:
    torch.manual_seed(seed)
    head = Fuse(FuseConfig(), TARGET)
    with torch.no_grad():
        head.norm.uniform_(0.5, 1.5)
    return head


def _same(a: Head, b: Head) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def test_a_head_roundtrips_in_float32(tmp_path):
    head = _head()
    save_head(head, tmp_path / "h")
    record = json.loads((tmp_path / "h" / "config.json").read_text())
    assert record == {"fastdecode_head": 1, "kind": "test-fuse", "dtype": "float32",
                      "config": {"hidden_size": 16, "layers": [0, -1], "draft_vocab": 8, "note": "test"},
                      "target": dataclasses.asdict(TARGET)}
    back = load_head(tmp_path / "h", device="cpu")
    assert isinstance(back, Fuse) and not back.training
    assert back.config == head.config and back.config.layers == (0, -1) and back.target == TARGET
    assert _same(head, back) and back.d2t.dtype == torch.int64
    x = torch.randn(1, 3, 32)
    assert torch.equal(head(x), back(x))
    assert "test-fuse" in head_kinds()


def test_a_head_roundtrips_in_bfloat16(tmp_path):
    head = _head()
    save_head(head, tmp_path / "h", dtype="bfloat16")
    assert json.loads((tmp_path / "h" / "config.json").read_text())["dtype"] == "bfloat16"
    back = load_head(str(tmp_path / "h"), device="cpu")  # as saved
    assert back.fc.weight.dtype == torch.bfloat16 and back.d2t.dtype == torch.int64  # integers keep their type
    assert torch.equal(back.fc.weight, head.fc.weight.to(torch.bfloat16))
    again = tmp_path / "again"
    save_head(back, again)
    assert _same(back, load_head(again, device="cpu"))
    up = load_head(tmp_path / "h", device="cpu", dtype=torch.float32)
    assert up.fc.weight.dtype == torch.float32 and torch.equal(up.fc.weight, back.fc.weight.float())
    assert up.d2t.dtype == torch.int64


def test_a_shipped_head_loads_by_zoo_name(tmp_path, monkeypatch):
    monkeypatch.setattr(head_io, "_zoo", lambda: tmp_path)
    save_head(_head(), tmp_path / "tiny" / "heads" / "fuse")
    assert head_names() == ["tiny/fuse"]
    assert _same(load_head("zoo:tiny/fuse", device="cpu"), _head())
    with pytest.raises(ModelLoadError, match="No shipped head named 'zoo:tiny/fuze'.*'tiny/fuse'"):
        load_head("zoo:tiny/fuze")
    with pytest.raises(ModelLoadError, match="No shipped head named 'zoo:tiny'"):
        load_head("zoo:tiny")


def test_missing_or_foreign_folders_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_head(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_head(tmp_path / "file")
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_head(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="not a head config.*fastdecode.load"):
        load_head(tmp_path / "model")


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    record = json.loads(path.read_text())
    for key, value in changes.items():
        if key in record:
            record[key] = value
        else:
            record["config"][key] = value
    path.write_text(json.dumps(record))


def test_an_unknown_kind_is_refused_with_the_known_ones(tmp_path):
    save_head(_head(), tmp_path)
    _edit_config(tmp_path, kind="test-fus")
    with pytest.raises(ModelLoadError, match="Unknown head kind 'test-fus'. Did you mean 'test-fuse'"):
        load_head(tmp_path)
    _edit_config(tmp_path, kind="zzzzzz")
    with pytest.raises(ModelLoadError, match="Choose one of: .*test-fuse"):
        load_head(tmp_path)


def test_config_fields_must_be_the_kinds(tmp_path):
    save_head(_head(), tmp_path)
    _edit_config(tmp_path, width=3)
    with pytest.raises(ModelLoadError, match=r"fields \['width'\] that head kind 'test-fuse' does not have"):
        load_head(tmp_path)


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path):
    save_head(_head(), tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v for k, v in tensors.items() if k != "norm"} | {"extra.bias": torch.zeros(2)}, str(weights))
    with pytest.raises(ModelLoadError, match="missing tensors norm, unexpected tensors extra.bias"):
        load_head(tmp_path)
    save_file(tensors, str(weights))
    _edit_config(tmp_path, draft_vocab=9)  # the config no longer fits the saved tensors
    with pytest.raises(ModelLoadError, match=r"wrong shape.*lm_head.weight \(8, 16\) \(the config gives \(9, 16\)\)"):
        load_head(tmp_path)


def test_pickled_or_damaged_weights_are_never_loaded(tmp_path):
    save_head(_head(), tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pytorch_model.bin, a pickle fastdecode never loads"):
        load_head(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_head(tmp_path)


def test_registration_rules():
    class Loose(HeadConfig):  # no @dataclass(frozen=True) of its own
        size: int = 1

    class Bad(Head):
        config_class = Loose

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_head("test-bad")(Bad)

    class Other(Head):
        config_class = FuseConfig

    with pytest.raises(ValueError, match="already registered"):
        register_head("test-fuse")(Other)
    with pytest.raises(TypeError, match="takes a FuseConfig"):
        Fuse(HeadConfig())

    class Unregistered(Fuse):
        pass

    with pytest.raises(ValueError, match="not a registered head kind"):
        save_head(Unregistered(FuseConfig()), "unused")


def test_the_target_record_refuses_another_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    model = CausalLM(LlamaForCausalLM(config), name="zoo:tiny")
    assert Target.of(model) == TARGET
    TARGET.check(model)
    with pytest.raises(IncompatibleMethodError, match="hidden_size 16 \\(trained on 32\\)"):
        dataclasses.replace(TARGET, hidden_size=32).check(model)


def test_a_head_kind_in_its_own_file_is_found_without_an_import(tmp_path, monkeypatch):
    """One file a kind: a module in fastdecode/heads/ registers its kind when a head is first looked up."""
    import fastdecode.heads as package
    from fastdecode.heads import base

    (tmp_path / "test_found.py").write_text(
        "from dataclasses import dataclass\n"
        "from fastdecode.heads import Head, HeadConfig, register_head\n\n"
        "@dataclass(frozen=True)\n"
        "class FoundConfig(HeadConfig):\n"
        "    width: int = 2\n\n"
        "@register_head('test-found')\n"
        "class Found(Head):\n"
        "    config_class = FoundConfig\n"
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(base, "_found", False)
    try:
        assert "test-found" in head_kinds() and head_class("test-found").__name__ == "Found"
    finally:
        base._KINDS.pop("test-found", None)
        sys.modules.pop("fastdecode.heads.test_found", None)


def test_a_models_head_is_loaded_once_until_its_folder_changes(tmp_path, monkeypatch):
    """`head_for` loads a head once per model (a method runs once per generation); a head written again is loaded
    again, at most `HELD` heads are held per model, and they go with the model."""
    monkeypatch.setattr(head_io, "_zoo", lambda: tmp_path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    model = CausalLM(LlamaForCausalLM(config), name="zoo:tiny")
    save_head(_head(), tmp_path / "tiny" / "heads" / "test-fuse")
    loads: list[object] = []
    original = head_io.load_head
    monkeypatch.setattr(head_io, "load_head", lambda *a, **k: loads.append(a) or original(*a, **k))
    first = head_io.head_for(model, "test-fuse")
    assert head_io.head_for(model, "test-fuse") is first and len(loads) == 1
    save_head(_head(seed=1), tmp_path / "tiny" / "heads" / "test-fuse")  # (written again: new times, new tensors)
    again = head_io.head_for(model, "test-fuse")
    assert again is not first and _same(again, _head(seed=1)) and len(loads) == 2
    for i in range(head_io.HELD):
        save_head(_head(seed=i), tmp_path / f"other{i}")
        head_io.head_for(model, "test-fuse", tmp_path / f"other{i}")
    assert len(head_io._HELD[model]) == head_io.HELD
    head_io.head_for(model, "test-fuse")  # (the least recently asked for was dropped: loaded again)
    assert len(loads) == 3 + head_io.HELD
    alive, held = weakref.ref(model), len(head_io._HELD)
    del model, first, again
    gc.collect()
    assert alive() is None and len(head_io._HELD) == held - 1  # (its heads hold no reference to it, and go with it)
