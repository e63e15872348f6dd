"""A/B of ``assign``'s kept passes (``TORCHKM_REUSE_PASSES=1`` / ``0``): host and wall time of eager
calls that build an ``AssignPass`` each, alternating the setting within one process.

Cases: the VQ layer's eager training step (32,768 x 256, 8192 codes; fp32 and bf16 under autocast),
``torchkm.assign`` queries (the VQ size and a small one), and whole fits at seed 000's size
(245,760 x 32, k = 1024, sigma^2 = 0.0125; dense and pruned, the same start each time). Each
case first checks that both settings give the same labels on fresh random data.

    python scripts/diag_reuse.py [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_lloyd import centred_view, default_tol  # noqa: E402
from bench_prune import seed000_data  # noqa: E402
from bench_vq import host_and_wall_ms, make_layer, step_fn  # noqa: E402

import torchkm  # noqa: E402
from torchkm import _loop  # noqa: E402


def with_reuse(flag: str, fn):
    os.environ["TORCHKM_REUSE_PASSES"] = flag
    try:
        return fn()
    finally:
        os.environ.pop("TORCHKM_REUSE_PASSES", None)


def vq_case(precision: str, dtype: torch.dtype):
    n, dim, k = 32_768, 256, 8192
    layer = make_layer(f"torchkm-{precision}", torch.randn(k, dim, device="cuda"))
    x = torch.randn(n, dim, device="cuda", dtype=dtype).requires_grad_(True)
    step = step_fn(layer, x, dtype)

    def check():
        rows = torch.randn(n, dim, device="cuda")
        a = with_reuse("1", lambda: (torchkm.assign(rows, layer.codebook)[0], torchkm.assign(rows, layer.codebook)[0]))
        b = with_reuse("0", lambda: torchkm.assign(rows, layer.codebook)[0])
        return bool(torch.equal(a[0], b) and torch.equal(a[1], b))

    return step, 20, check


def assign_case(n: int, d: int, k: int):
    x = torch.randn(n, d, device="cuda")
    c = torch.randn(k, d, device="cuda")

    def check():
        rows = torch.randn(n, d, device="cuda")
        a = with_reuse("1", lambda: (torchkm.assign(rows, c)[0], torchkm.assign(rows, c)[0]))
        b = with_reuse("0", lambda: torchkm.assign(rows, c)[0])
        return bool(torch.equal(a[0], b) and torch.equal(a[1], b))

    return (lambda: torchkm.assign(x, c)), 50, check


def fit_case(algorithm: str):
    x = seed000_data(245_760, 32, 1024, 0.0125, seed=int(time.time()) % 100_000)
    data, offset = centred_view(x)
    c0 = x[torch.randperm(x.shape[0], device="cuda")[:1024]] - offset
    tol = default_tol(data)

    def fit():
        return _loop.lloyd(data, c0, sample_weight=None, max_iter=100, tol=tol, algorithm=algorithm)

    def check():
        a, b = with_reuse("1", fit), with_reuse("0", fit)
        return bool(torch.equal(a.labels, b.labels) and a.n_iter == b.n_iter)

    return fit, 5, check


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cases = {
        "vq step fp32 fast": lambda: vq_case("fast", torch.float32),
        "vq step fp32 exact": lambda: vq_case("exact", torch.float32),
        "vq step bf16 exact": lambda: vq_case("exact", torch.bfloat16),
        "assign 32768x256 k=8192": lambda: assign_case(32_768, 256, 8192),
        "assign 4096x64 k=512": lambda: assign_case(4096, 64, 512),
        "fit 245760x32 k=1024 lloyd": lambda: fit_case("lloyd"),
        "fit 245760x32 k=1024 pruned": lambda: fit_case("pruned"),
    }
    results = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, make in cases.items():
        fn, reps, check = make()
        same = check()
        times: dict[str, list] = {"1": [], "0": []}
        for _ in range(args.rounds):
            for flag in ("1", "0"):
                times[flag].append(with_reuse(flag, lambda: host_and_wall_ms(fn, reps, warmup=2)))
        row = {"case": name, "same_labels": same}
        for flag, label in (("1", "reuse"), ("0", "new")):
            row[f"{label}_host_ms"] = [round(h, 4) for h, _ in times[flag]]
            row[f"{label}_wall_ms"] = [round(w, 4) for _, w in times[flag]]
        results.append(row)
        print(f"{name:30s} labels equal: {same}; host ms reuse {statistics.mean(row['reuse_host_ms']):.3f} "
              f"new {statistics.mean(row['new_host_ms']):.3f}; wall ms reuse {statistics.mean(row['reuse_wall_ms']):.3f} "
              f"new {statistics.mean(row['new_wall_ms']):.3f}  (runs: {row['reuse_wall_ms']} / {row['new_wall_ms']})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
