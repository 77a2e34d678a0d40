"""Every registered `dlm.*` method runs with every cache on a tiny model and yields valid Stats."""

from __future__ import annotations

import pytest

import fastdecode

METHODS = [m.name for m in fastdecode.methods("diffusion")]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "suffix", "delayed", "window"])
@pytest.mark.parametrize("name", METHODS)
def test_method_with_cache_runs_and_stats_are_consistent(diffusion, name, cache):
    if name == "dlm.freedave" and cache == "delayed":
        with pytest.raises(fastdecode.ParameterError, match="delayed"):
            fastdecode.generate(diffusion, "the", name, max_new_tokens=12, cache=cache)
        return
    results = fastdecode.generate(diffusion, ["the quick brown", "def"], name, max_new_tokens=12, cache=cache,
                                  trace=True)
    for r in results:
        s = r.stats
        assert 1 <= s.new_tokens == len(r.token_ids) <= 12
        assert s.forwards >= 1 and s.tokens_per_forward == pytest.approx(s.new_tokens / s.forwards)
        assert s.forwards <= s.accepted <= s.proposed or name == "dlm.freedave"  # dlm: >= one commit per forward
        assert s.accepted >= s.new_tokens  # every position through the first EOS was committed
        assert s.wall_s > 0 and s.tokens_per_s > 0 and s.prompt_tokens == len(r.prompt_ids)
        assert all(t not in diffusion.eos_token_ids for t in r.token_ids[:-1])
        assert s.finish_reason in ("eos", "length")
        assert (s.finish_reason == "eos") == (r.token_ids[-1] in diffusion.eos_token_ids)


def test_every_dlm_method_shares_the_cache_parameters():
    for name in METHODS:
        params = dict(fastdecode.get_method(name).params())
        assert params["cache"] == "none" and params["cache_refresh"] is None and params["temperature"] == 0.0
