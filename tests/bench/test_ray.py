"""`fastdecode bench --ray` on a local Ray instance (ray.init with two CPUs; no other address): rows of every
configuration run on the same worker as their item's baseline row, stream back to the one file, and resume.

Ray's local start takes about 10-20 s of this test's time."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from fastdecode.bench.harness import read_rows, run_bench  # noqa: E402
from fastdecode.cli import RAY_DEFAULT, expand_list_options  # noqa: E402

PARAMS = {"ar.greedy": {"max_new_tokens": 12}, "spec.pld": {"max_new_tokens": 12}}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_bench_on_ray_matches_local_and_resumes(local_ray, tmp_path):
    out = tmp_path / "ray.jsonl"
    summary = run_bench("quick", "zoo:ar-tiny", ["spec.pld"], out, limit=1, warmup=False, ray=True, ray_workers=2,
                        params=PARAMS)
    rows = read_rows(out)
    assert summary.written == len(rows) == summary.total and len(rows) % 2 == 0
    runs = {r["run"] for r in rows}
    assert len(runs) == 2 and all(r.rsplit("-w", 1)[1] in ("0", "1") for r in runs)  # one run per worker
    base = {(r["task"], r["item"]): r for r in rows if r["is_baseline"]}
    for r in rows:
        own = base[(r["task"], r["item"])]
        assert r["run"] == own["run"]  # every configuration ran on the worker of its own baseline row
        assert r["equal_to_baseline"] is True and r["token_ids"] == own["token_ids"]
    # the same rows as a local run
    run_bench("quick", "zoo:ar-tiny", ["spec.pld"], tmp_path / "local.jsonl", limit=1, warmup=False, params=PARAMS)
    local = {(r["task"], r["item"], r["method"]): r["token_ids"] for r in read_rows(tmp_path / "local.jsonl")}
    assert local == {(r["task"], r["item"], r["method"]): r["token_ids"] for r in rows}
    again = run_bench("quick", "zoo:ar-tiny", ["spec.pld"], out, limit=1, warmup=False, ray=True, ray_workers=2,
                      params=PARAMS)
    assert again.written == 0 and again.skipped == len(rows)


def test_bare_ray_flag_takes_rays_default():
    argv = ["fastdecode", "bench", "--methods", "a", "b", "--ray"]
    assert expand_list_options(argv)[-2:] == ["--ray", RAY_DEFAULT]
    argv = ["fastdecode", "bench", "--ray", "--methods", "a"]
    assert expand_list_options(argv)[2:4] == ["--ray", RAY_DEFAULT]
    argv = ["fastdecode", "bench", "--ray", "ray://head:10001", "--methods", "a"]
    assert expand_list_options(argv)[2:4] == ["--ray", "ray://head:10001"]
