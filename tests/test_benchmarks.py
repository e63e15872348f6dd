"""The benchmark scripts' building blocks run (on the CPU, where the library uses its reference
engine), so that a change of an internal signature cannot break a GPU session's only benchmark call."""

from __future__ import annotations

import os
import sys
import time

import torch

import torchkm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import bench_lloyd
import bench_prune


def _kernel_device() -> str:
    """Where the Triton kernels run in this session: "cuda" on a GPU, "cpu" under
    ``TRITON_INTERPRET=1``; skips the test where neither."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    if not torch.cuda.is_available():
        import pytest

        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1")
    return "cuda"


def test_bench_prune_run_on_cpu() -> None:
    x = bench_prune.seed000_data(999, 5, 7, 0.01, seed=3, device="cpu")
    c0 = x[:7].clone()
    out, ms = bench_prune.run(x, c0, "lloyd", 20)
    assert out.labels.shape == (999,) and ms > 0
    data, offset = bench_lloyd.centred_view(x)
    torch.testing.assert_close(offset, x.double().mean(0).float(), rtol=0, atol=1e-6)
    tol, tol_ms = bench_prune.fit_tol(x)
    assert tol == bench_lloyd.default_tol(data) > 0 and tol_ms > 0
    # A tol given (main's, computed once per workload) is the one the fit stops by.
    never, _ = bench_prune.run(x, c0, "lloyd", 20, tol=-1.0)
    assert never.n_iter >= out.n_iter and not (never.converged and never.history[-1].labels_changed)


def test_bench_lloyd_torchkm_lloyd_on_cpu() -> None:
    x = torch.randn(500, 3, generator=torch.Generator().manual_seed(0))
    assert bench_lloyd.torchkm_lloyd(x, x[:4].clone(), 3, "exact") == (3, False)
    # Two well-separated blobs, started from one row of each: converged at iteration 2.
    blobs = torch.cat([torch.randn(50, 2) * 0.01, torch.randn(50, 2) * 0.01 + 10.0])
    assert bench_lloyd.torchkm_lloyd(blobs, blobs[[0, 50]].clone(), 20, "exact") == (2, True)


def test_bench_lloyd_selects_named_and_extra_workloads() -> None:
    names = [w[0] for w in bench_lloyd.WORKLOADS]
    assert [w[0] for w in bench_lloyd.select_workloads(None, [])] == names
    assert bench_lloyd.select_workloads(["seed000-B"], []) == [("seed000-B", 245_760, 32, 1024)]
    assert bench_lloyd.select_workloads(None, ["K64=1000,32,64"]) == [("K64", 1000, 32, 64)]
    assert bench_lloyd.select_workloads([], ["K64=1000,32,64"]) == [("K64", 1000, 32, 64)]
    assert bench_lloyd.select_workloads(["seed000-A"], ["K=5,3,2"]) == [("seed000-A", 245_760, 32, 32), ("K", 5, 3, 2)]


def test_bench_lloyd_mixed_rows_cluster_around_a_quarter_as_many_centres() -> None:
    x = bench_lloyd.mixed_rows(4000, 6, 40, torch.Generator().manual_seed(0), device="cpu")
    assert x.shape == (4000, 6) and x.dtype == torch.float32 and bool(torch.isfinite(x).all())
    # Ten centres, spreads of at most 0.2: every row within a few spreads of one of ten points.
    c = torchkm.fit(x, 10, random_state=0).centroids
    assert float(torch.cdist(x, c).min(dim=1).values.max()) < 1.5


def test_bench_lloyd_starts_from_distinct_rows() -> None:
    x = torch.arange(64.0).reshape(32, 2)  # every row distinct
    c0 = bench_lloyd.distinct_rows(x, 32, torch.Generator().manual_seed(1))
    assert c0.shape == (32, 2) and torch.equal(c0[:, 0].sort().values, x[:, 0])


def _timed_fake_fits(monkeypatch, converges_at):
    """``lloyd_per_iteration`` over a stand-in fit that sleeps 1 ms an iteration and converges at
    ``converges_at(n, repeat)`` (repeat: how many runs of n came before). Returns the timing, the
    block, and each run's (graph block, iterations asked)."""
    from torchkm import _loop

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    runs = []

    def run(n):
        stop = converges_at(n, sum(asked == n for _, asked in runs))
        runs.append((_loop._GRAPH_BLOCK, n))
        time.sleep(1e-3 * min(n, stop))
        return min(n, stop), n >= stop

    timing, block = bench_lloyd.lloyd_per_iteration(run, 10)
    assert _loop._GRAPH_BLOCK == 8  # restored
    return timing, block, runs


def test_bench_lloyd_times_a_converging_fit_with_smaller_blocks(monkeypatch) -> None:
    """A fit that converges at iteration 14, inside the runs of 1 + 8 and 1 + 8 (1 + m) iterations,
    is timed again with blocks of 4: runs of 5 and 9 iterations, both clear of convergence, so the
    time is a difference again. The loop's block is restored."""
    timing, block, runs = _timed_fake_fits(monkeypatch, lambda n, repeat: 14)
    assert block == 4 and timing.converged_at is None and timing.ms > 0
    assert max(n for b, n in runs if b == 4) == 9 <= 14 - 2
    assert {b for b, _ in runs} == {8, 4}


def test_bench_lloyd_does_not_difference_a_fit_that_converged_at_its_last_iteration(monkeypatch) -> None:
    """A fit that converges at iteration 9 runs all 9 iterations of the shorter timed run (1 + 8)
    but skips the final assignment the others run: that run counts as converged, and blocks of 2
    (runs of 3 and 7) time it. One repeat converging is enough: repeats differ by roundings."""
    # every other repeat of a run one iteration later
    timing, block, runs = _timed_fake_fits(monkeypatch, lambda n, repeat: 10 if repeat % 2 else 9)
    assert block == 2 and timing.converged_at is None and timing.ms > 0
    assert max(n for b, n in runs if b == 2) == 7


def test_bench_lloyd_checks_the_box_engine() -> None:
    """bench_lloyd's check of ``algorithm="pruned"`` at d <= 8 (the box engine's kernels)."""
    device = _kernel_device()
    x = torch.randn(300, 2, generator=torch.Generator().manual_seed(0)).to(device)
    out = bench_lloyd.check_pruned(x, x[:5].clone())
    assert out["pruned_labels_off_beyond_ties_pct"] == 0.0 and out["pruned_sums_rel_err"] < 1e-5
    assert out["pruned_counts_abs_err"] == 0.0 and out["pruned_changed_first"] == 300


def test_bench_lloyd_checks_the_bounds_engine() -> None:
    """bench_lloyd's check of ``algorithm="pruned"`` at d > 8 (the bounds engine): labels and the
    updated centroids, which it compares with float64 means of the labels (the labels alone had
    passed a pruned fit with wrong sums)."""
    device = _kernel_device()
    g = torch.Generator().manual_seed(0)
    centres = torch.rand(20, 17, generator=g)
    x = (centres[torch.arange(600) % 20] + 0.05 * torch.randn(600, 17, generator=g)).to(device)
    out = bench_lloyd.check_bounds(x, 20, passes=4)
    assert out["pruned_passes_checked"] >= 1 and out["pruned_labels_off_beyond_ties_pct"] == 0.0
    assert out["pruned_centroids_rel_err"] < 1e-5


def test_bench_prune_report_prints_both_tables(capsys) -> None:
    entry = {"ms": 1.0, "n_iter": 3, "labels_exact": True, "skipped": 0.5, "skipped_bound": 0.6, "imbalance": 0.1,
             "decomposition_ms": {"ICD": 1.0, "settle pass (bounds)": 3.0}}
    rows = [{"data": "SIFT", "n": 10, "d": 128, "k": 4, "sigma2": None, "floor_ms": 0.1,
             "lloyd": dict(entry), "pruned": dict(entry)}]
    bench_prune.report(rows, ["lloyd", "pruned"])
    out = capsys.readouterr().out
    assert "SIFT" in out and "Table I" in out and "75.0" in out


def test_bench_prune_pairs_rounds_and_reports_auto_against_dense(capsys) -> None:
    # Round i's fits of two algorithms are compared with each other: a drift between rounds cancels.
    assert bench_prune.paired_ratio([2.0, 8.0, 9.0], [1.0, 8.0, 3.0]) == 2.0
    assert bench_prune.paired_ratio([5.0], [2.0, 3.0]) == 2.5  # a slow algorithm timed once
    entry = {"ms": 2.0, "n_iter": 3, "labels_exact": True, "ms_per_iter_median": 0.5, "iters_runs": [3, 4],
             "kernels_runs": [{"lloyd": 3}], "paired_to_lloyd": 1.25, "labels_differ_from_lloyd_runs": [0, 17]}
    rows = [{"data": "seed000 100x32", "n": 100, "d": 32, "k": 4, "sigma2": 0.05, "floor_ms": 0.1,
             "lloyd": dict(entry, paired_to_lloyd=1.0), "auto": entry}]
    bench_prune.report(rows, ["lloyd", "auto"])
    out = capsys.readouterr().out
    assert "paired  1.250" in out and "time  1.000" in out
    assert "auto [0, 17] it [3, 4]" in out  # rows off the last dense run's labels, run by run


def test_bench_prune_runs_dense_lloyd_with_float64_moves(monkeypatch, capsys) -> None:
    """``--algorithms ... lloyd-moves`` / ``lloyd-sums``: dense Lloyd with ``TORCHKM_DENSE_MOVES=1`` /
    ``0`` for that fit only (the environment restored after it; ``lloyd`` takes the default, moves
    at 17 features), and its table of label differences."""
    device = _kernel_device()
    from torchkm._kernels import lloyd

    monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    monkeypatch.delenv("TORCHKM_DENSE_MOVES", raising=False)
    engines = []
    init = lloyd.LloydEngine.__init__
    monkeypatch.setattr(lloyd.LloydEngine, "__init__", lambda self, *a, **kw: init(self, *a, **kw) or engines.append(self))
    x = bench_prune.seed000_data(400, 17, 70, 0.01, seed=5, device=device)
    moved, _ = bench_prune.run(x, x[:70].clone(), "lloyd-moves", 6)
    plain, _ = bench_prune.run(x, x[:70].clone(), "lloyd-sums", 6)
    default, _ = bench_prune.run(x, x[:70].clone(), "lloyd", 6)
    assert [e.moves for e in engines] == [True, False, True] and "TORCHKM_DENSE_MOVES" not in os.environ
    assert torch.equal(moved.labels, plain.labels) and moved.n_iter == plain.n_iter
    assert torch.equal(moved.labels, default.labels) and torch.equal(moved.centroids, default.centroids)
    entry = {"ms": 2.0, "n_iter": 3, "labels_exact": True, "labels_differ_from_moves_runs": [0, 0]}
    rows = [{"data": "seed000 400x17", "n": 400, "d": 17, "k": 70, "sigma2": 0.01, "floor_ms": 0.1,
             "pruned": entry, "lloyd-moves": entry}]
    bench_prune.report(rows, ["pruned", "lloyd-moves"])
    assert "pruned [0, 0] | lloyd-moves [0, 0]" in capsys.readouterr().out


def test_diag_search_kernels_find_the_nearest_centroid() -> None:
    """scripts/diag_search.py's stand-alone kernels (whose times BENCHMARKS.md quotes) agree with
    torch, in every orientation and epilogue but the index-free one."""
    device = _kernel_device()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import diag_search

    g = torch.Generator().manual_seed(0)
    x, c = torch.randn(150, 16, generator=g).to(device), torch.randn(90, 16, generator=g).to(device)
    c_mma, bias = diag_search.operands(c, torch.float32)
    sq = torch.cdist(x.double(), c.double()) ** 2
    best = sq.min(1).values
    for swap, epi in [(False, "lazy"), (False, "eager"), (True, "lazy")]:
        labels = diag_search.search(x, c_mma, bias, bn=64, bk=32, swap=swap, epi=epi, warps=4).long()
        # Exact under the interpreter; on a GPU the products are tf32, so near-ties may go either way.
        gap = sq.gather(1, labels[:, None])[:, 0] - best
        assert (gap <= (0.0 if device == "cpu" else 0.1)).all(), (swap, epi)


def test_bench_lloyd_profile_runs(monkeypatch) -> None:
    """The differential kernel profile runs (on the CPU it sees no GPU kernels) and restores the block."""
    from torchkm import _loop

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    x = torch.randn(300, 3, generator=torch.Generator().manual_seed(1))
    out = bench_lloyd.profile(x, x[:4].clone(), "exact", 2)
    assert isinstance(out, dict) and all(isinstance(v, float) for v in out.values())
    assert _loop._GRAPH_BLOCK == 8


def test_diag_bound_potential_counts_both_rules_exactly(capsys) -> None:
    """scripts/diag_bound_potential.py (whose counts BENCHMARKS.md quotes) runs a small fit to the
    end; its assertions hold both rules' labels to the true argmin at every iteration."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import diag_bound_potential

    dtype = torch.get_default_dtype()
    diag_bound_potential.main(["--n", "3000", "--d", "5", "--k", "40", "--sigma2", "0.01", "--chunk", "700"])
    assert torch.get_default_dtype() == dtype
    out = capsys.readouterr().out
    assert "4 groups" in out and "Yinyang groups searched" in out and "rows searched" in out


def test_bench_lloyd_check_reports_both_recheck_fractions() -> None:
    """``check`` (the benchmark's correctness step) runs the exact pass in raw coordinates and in
    the fit's centred ones; over-split rows off the origin re-search fewer rows centred."""
    device = _kernel_device()
    # (On a GPU the kernels take CUDA tensors only; the rows are drawn on the CPU either way.)
    g = torch.Generator().manual_seed(1)
    x = bench_lloyd.mixed_rows(600, 40, 64, g, device="cpu")
    c = bench_lloyd.distinct_rows(x, 64, g)
    r = bench_lloyd.check(x.to(device), c.to(device))
    assert r["labels_off_beyond_ties_pct"] == 0.0 and r["counts_rel_err"] == 0.0
    assert 0.0 < r["fit_rechecked_pct"] < r["rechecked_pct"]
