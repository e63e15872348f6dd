"""Data-parallel fits over torch.distributed: two gloo processes on the CPU, each holding a shard.

One spawn runs every scenario (starting processes costs seconds); each test then checks its part
against a single-process fit of the whole data set.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchkm

WORLD = 2
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
N, D, K = 611, 6, 5  # n odd: the shards differ in size


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    centres = torch.randn(K, D, generator=g, dtype=torch.float64) * 4 + 20  # far from the origin
    x = (centres[torch.randint(0, K, (N,), generator=g)] + torch.randn(N, D, generator=g, dtype=torch.float64)).float()
    w = torch.rand(N, generator=g) + 0.25
    c0 = x[torch.randperm(N, generator=g)[:K]].clone()
    return x, w, c0


def _shard(t: torch.Tensor, rank: int) -> torch.Tensor:
    bounds = [0, 400, N]  # unequal shards
    return t[bounds[rank]: bounds[rank + 1]]


def _scenarios(x: torch.Tensor, w: torch.Tensor, c0: torch.Tensor) -> dict:
    far = c0.clone()
    far[0] += 1e4  # a centroid nothing is near: its cluster empties and is relocated
    return {
        "given": {"init": c0},
        "weights": {"init": c0, "sample_weight": w},
        "empty": {"init": far, "max_iter": 5},
        "kmeans++": {"random_state": 3},
        "kmeans||": {"init": "k-means||", "random_state": 3},
        "random": {"init": "random", "random_state": 3},
        "random_weighted": {"init": "random", "random_state": 3, "sample_weight": w},
        "subsample": {"init": c0, "max_points_per_centroid": 50},
        "cosine": {"init": c0, "metric": "cosine"},
        # The kernels on CPU tensors need Triton's interpreter (CI); GPU machines test them in bench_scale.
        **({"kernels": {"init": c0, "engine": "triton"}} if INTERPRETED else {}),
    }


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    x, w, c0 = _data()
    results = {}
    for name, kwargs in _scenarios(x, w, c0).items():
        kwargs = {**kwargs}
        if "sample_weight" in kwargs:
            kwargs["sample_weight"] = _shard(kwargs["sample_weight"], rank)
        engine = kwargs.pop("engine", "auto")
        os.environ["TORCHKM_ENGINE"] = engine
        out = torchkm.fit(_shard(x, rank), K, distributed=True, **kwargs)
        results[name] = {"centroids": out.centroids, "labels": out.labels, "inertia": out.inertia,
                         "n_iter": out.n_iter, "changed": [h.labels_changed for h in out.history]}
    os.environ["TORCHKM_ENGINE"] = "auto"
    # A rank whose input is bad raises its own error; the other must not hang waiting for it.
    bad = _shard(x, rank).clone()
    if rank == 1:
        bad[3, 2] = float("nan")
    try:
        torchkm.fit(bad, K, distributed=True, init=c0)
        results["bad_input"] = "no error"
    except (ValueError, RuntimeError) as err:
        results["bad_input"] = f"{type(err).__name__}: {err}"
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    # Both ranks reach the teardown together. Without the barrier a rank sometimes aborted at its
    # end ("terminate called without an active exception", gloo; 2 cores, 2026-12-04): once in a
    # full CI run, once in 37 runs of this file beside a busy core; with it, none in 30. A
    # barrier first is the usual guard against one rank closing its connections while the other
    # still uses them.
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _single(name: str) -> torchkm.KMeansResult:
    x, w, c0 = _data()
    kwargs = {**_scenarios(x, w, c0)[name]}
    kwargs.pop("engine", None)
    return torchkm.fit(x, K, **kwargs)


KERNELS = [pytest.param("kernels", marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1"))]


@pytest.mark.parametrize("name", ["kmeans++", "kmeans||", "random", "random_weighted", "given", "weights", "empty",
                                  "subsample", "cosine", *KERNELS])
def test_every_rank_ends_with_the_same_fit(ranks, name):
    first, second = ranks[0][name], ranks[1][name]
    assert torch.equal(first["centroids"], second["centroids"])
    assert first["inertia"] == second["inertia"] and first["n_iter"] == second["n_iter"]
    assert first["changed"] == second["changed"]
    assert first["labels"].shape[0] == 400 and second["labels"].shape[0] == N - 400


@pytest.mark.parametrize("name", ["given", "weights", "empty", "cosine", *KERNELS])
def test_sharded_fit_equals_the_single_process_fit(ranks, name, monkeypatch):
    if name == "kernels":
        monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    single = _single(name)
    mine = ranks[0][name]
    assert mine["n_iter"] == single.n_iter
    assert mine["changed"] == [h.labels_changed for h in single.history]
    torch.testing.assert_close(mine["centroids"], single.centroids, rtol=1e-5, atol=1e-4)
    assert torch.equal(torch.cat([ranks[0][name]["labels"], ranks[1][name]["labels"]]), single.labels)
    assert mine["inertia"] == pytest.approx(single.inertia, rel=1e-6)


@pytest.mark.parametrize("name", ["kmeans++", "kmeans||", "random"])
def test_sharded_initialisation_is_as_good_as_single_process(ranks, name):
    # The draws differ from a single process's (they are spread over ranks); the quality must not.
    single = _single(name)
    assert ranks[0][name]["inertia"] <= 1.05 * single.inertia


def test_subsample_covers_every_row_of_every_shard(ranks):
    x, _, _ = _data()
    centroids = ranks[0]["subsample"]["centroids"]
    labels = torch.cat([ranks[0]["subsample"]["labels"], ranks[1]["subsample"]["labels"]])
    expected, dist_sq = torchkm.assign(x, centroids)
    assert torch.equal(labels, expected)
    assert ranks[0]["subsample"]["inertia"] == pytest.approx(float(dist_sq.double().sum()), rel=1e-5)


def test_a_bad_shard_fails_every_rank_instead_of_hanging(ranks):
    assert ranks[1]["bad_input"].startswith("ValueError: x contains non-finite values")
    assert ranks[0]["bad_input"].startswith("RuntimeError: another rank of the process group rejected its input")


def test_distributed_without_a_process_group_says_how_to_start_one():
    with pytest.raises(RuntimeError, match="torchrun"):
        torchkm.fit(np.zeros((10, 2), dtype=np.float32), 2, distributed=True)
