"""The benchmark scripts' building blocks run (on the CPU, where the library uses its reference
engine), so that a change of an internal signature cannot break a GPU session's only benchmark call."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import bench_lloyd
import bench_prune


def test_bench_prune_run_on_cpu() -> None:
    x = bench_prune.seed000_data(999, 5, 7, 0.01, seed=3, device="cpu")
    c0 = x[:7].clone()
    out, ms = bench_prune.run(x, c0, "lloyd", 20)
    assert out.labels.shape == (999,) and ms > 0
    data, offset = bench_lloyd.centred_view(x)
    torch.testing.assert_close(offset, x.double().mean(0).float(), rtol=0, atol=1e-6)
    assert bench_lloyd.default_tol(data) > 0


def test_bench_lloyd_torchkm_lloyd_on_cpu() -> None:
    x = torch.randn(500, 3)
    assert bench_lloyd.torchkm_lloyd(x, x[:4].clone(), 3, "exact") == 3


def test_bench_prune_report_prints_both_tables(capsys) -> None:
    entry = {"ms": 1.0, "n_iter": 3, "labels_exact": True, "skipped": 0.5, "skipped_bound": 0.6, "imbalance": 0.1,
             "decomposition_ms": {"ICD": 1.0, "settle pass (bounds)": 3.0}}
    rows = [{"data": "SIFT", "n": 10, "d": 128, "k": 4, "sigma2": None, "floor_ms": 0.1,
             "lloyd": dict(entry), "pruned": dict(entry)}]
    bench_prune.report(rows, ["lloyd", "pruned"])
    out = capsys.readouterr().out
    assert "SIFT" in out and "Table I" in out and "75.0" in out
