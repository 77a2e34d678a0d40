"""tests/carried.py: on another device, a test that fails for a zoo or results file the device call did not carry is
skipped with the file named; on the CPU it fails as ever."""

from __future__ import annotations

import pytest
from carried import NOT_CARRIED, absent_from_checkout, skip_if_not_carried, skip_when_not_carried

from fastdecode.errors import ModelLoadError

ZOO, RESULTS = NOT_CARRIED
GONE = ZOO / "no-such-model" / "model.safetensors"


def _outcome(device: str, error: BaseException):
    """What the hook wrapper's body makes of a test phase that raised `error`."""
    body = skip_when_not_carried(device)
    next(body)
    body.throw(error)


def test_an_absent_zoo_or_results_file_is_found_in_the_error_or_its_causes():
    assert absent_from_checkout(ModelLoadError(f"Weights file {GONE} is missing.")) == GONE
    assert absent_from_checkout(FileNotFoundError(2, "No such file or directory", str(GONE))) == GONE
    results = RESULTS / "no-such-run" / "rows.jsonl"
    wrapped = RuntimeError("loading failed")
    wrapped.__cause__ = FileNotFoundError(f"No such file or directory: '{results}'")
    assert absent_from_checkout(wrapped) == results
    # a file that is there, or one outside the zoo and the results, is a real failure
    present = next(ZOO.glob("*/config.json"))
    assert absent_from_checkout(ModelLoadError(f"Weights file {present} is broken.")) is None
    assert absent_from_checkout(FileNotFoundError(2, "No such file", "/no/such/folder/model.safetensors")) is None
    assert absent_from_checkout(RuntimeError("Expected all tensors to be on the same device")) is None


def test_a_model_folder_without_its_weights_counts_as_its_weights_absent(tmp_path, monkeypatch):
    import carried

    monkeypatch.setattr(carried, "NOT_CARRIED", (tmp_path,))
    folder = tmp_path / "ar-small"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    # transformers names the folder: "Error no file named model.safetensors, or pytorch_model.bin, found in directory"
    error = OSError(f"Error no file named model.safetensors, or pytorch_model.bin, found in directory {folder}.")
    assert absent_from_checkout(error) == folder / "model.safetensors"
    (folder / "model.safetensors").write_bytes(b"")
    assert absent_from_checkout(error) is None  # the weights are there: a real failure
    assert absent_from_checkout(OSError(f"cannot read {tmp_path}")) is None  # not a model folder


def test_on_a_device_the_test_is_skipped_and_on_the_cpu_it_fails():
    error = ModelLoadError(f"Weights file {GONE} is missing.")
    with pytest.raises(pytest.skip.Exception, match="no-such-model/model.safetensors is not in this checkout"):
        _outcome("cuda", error)
    with pytest.raises(ModelLoadError):
        _outcome("cpu", error)
    with pytest.raises(ValueError):  # another error stays an error on the device too
        _outcome("cuda", ValueError("bad"))
    body = skip_when_not_carried("cuda")
    next(body)
    with pytest.raises(StopIteration) as done:  # a phase that passed keeps its result
        body.send("result")
    assert done.value.value == "result"


def test_a_test_can_name_the_files_it_needs():
    skip_if_not_carried("cpu", GONE)  # the CPU: nothing happens, the test goes on (and fails if it needs the file)
    skip_if_not_carried("cuda", ZOO)  # present
    with pytest.raises(pytest.skip.Exception, match="not in this checkout"):
        skip_if_not_carried("cuda", GONE)
