"""tools/fused_compile.py (does torch.compile trace the fused forwards under this torch?) with torch.compile's eager
backend: dynamo traces both zoo forwards whole, the fall-back to the unfused forward would fail the check, and the
traced functions run the plain operations, so the tokens equal the unfused run's."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["zoo:ar-small", "zoo:dlm-small"])
def test_both_fused_forwards_trace_whole_with_the_unfused_tokens(name, tool, capsys, device):
    compile_check = tool("fused_compile")
    assert compile_check.main(["--models", name, "--dtypes", "float32", "--tokens", "4", "--backend", "eager",
                               "--device", str(device)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{name} float32 on {device}: fused forward built and ran")
    assert "tokens equal to the unfused run's on 2 of 2 prompts" in line
