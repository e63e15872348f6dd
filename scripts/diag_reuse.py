"""A/B/C of ``assign``'s kept passes: host and wall time of eager calls with the defaults (a kept
pass per shape, queries replayed as CUDA graphs), with kept passes run eagerly
(``TORCHKM_REPLAY_QUERIES=0``) and with a new ``AssignPass`` per call (``TORCHKM_REUSE_PASSES=0``),
alternating the settings within one process.

``TORCHKM_REPLAY_QUERIES=0`` also stops the VQ layer replaying its whole training step, while
``TORCHKM_REUSE_PASSES=0`` does not (the step's graph holds its own pass): for the layer, the
columns read "whole step replayed / eager with kept passes / whole step replayed" (since
2026-11-22's replayed training steps).

Cases: the VQ layer's eager training step (32,768 x 256, 8192 codes; fp32 and bf16 under autocast),
``torchkm.assign`` queries (the VQ size and a small one), and whole fits at seed 000's size
(245,760 x 32, k = 1024, sigma^2 = 0.0125; dense and pruned, the same start each time). Each
case first checks that the defaults give the labels of new passes on fresh random data (three
queries, or the fit's labels and iterations); the VQ cases also print how far three training steps
from one codebook end apart, replayed against new passes and new passes against themselves.

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

SETTINGS = {"replay": {}, "reuse": {"TORCHKM_REPLAY_QUERIES": "0"}, "new": {"TORCHKM_REUSE_PASSES": "0"}}


def with_reuse(setting: str, fn):
    """``fn()`` under one of ``SETTINGS`` ("1" and "0": "replay" and "new")."""
    env = SETTINGS[{"1": "replay", "0": "new"}.get(setting, setting)]
    os.environ.update(env)
    try:
        return fn()
    finally:
        for name in env:
            os.environ.pop(name, None)


def vq_case(precision: str, dtype: torch.dtype):
    n, dim, k = 32_768, 256, 8192
    layer = make_layer(f"torchkm-{precision}", torch.randn(k, dim, device="cuda"))
    x = torch.randn(n, dim, device="cuda", dtype=dtype).requires_grad_(True)
    step = step_fn(layer, x, dtype)

    def check():
        rows = torch.randn(n, dim, device="cuda")
        a = with_reuse("1", lambda: [torchkm.assign(rows, layer.codebook)[0] for _ in range(3)])
        b = with_reuse("0", lambda: torchkm.assign(rows, layer.codebook)[0])
        # The layer's EMA statistics after three training steps (the fused sums) from one start.
        start = layer.codebook.detach().clone()
        batches = [torch.randn(n, dim, device="cuda", dtype=dtype) for _ in range(3)]

        def train():
            twin = make_layer(f"torchkm-{precision}", start)
            for batch in batches:
                step_fn(twin, batch.requires_grad_(True), dtype)()
            return twin.codebook.detach().clone(), twin.cluster_size.detach().clone()

        # Replayed against new passes, and new passes against themselves (the sums' atomics make
        # training steps differ in their last bits from run to run, which near-ties can amplify).
        trained, again, twice = with_reuse("1", train), with_reuse("0", train), with_reuse("0", train)
        for name, (p, q) in (("replayed vs new", (trained, again)), ("new vs new", (again, twice))):
            print(f"  {precision} {dtype}: three training steps, {name}: codebook max diff "
                  f"{float((p[0] - q[0]).abs().max()):.3g}, code sizes max diff {float((p[1] - q[1]).abs().max()):.3g}")
        return all(torch.equal(labels, b) for labels in a)

    return step, 20, check


def assign_case(n: int, d: int, k: int):
    x = torch.randn(n, d, device="cuda")
    c = torch.randn(k, d, device="cuda")

    def check():
        rows = torch.randn(n, d, device="cuda")
        a = with_reuse("1", lambda: [torchkm.assign(rows, c)[0] for _ in range(3)])
        b = with_reuse("0", lambda: torchkm.assign(rows, c)[0])
        return all(torch.equal(labels, b) for labels in a)

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
    parser.add_argument("--cases", nargs="*", default=None, help="names of the cases to run (default: all)")
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
        if args.cases and name not in args.cases:
            continue
        fn, reps, check = make()
        same = check()
        times: dict[str, list] = {setting: [] for setting in SETTINGS}
        for _ in range(args.rounds):
            for setting in SETTINGS:
                times[setting].append(with_reuse(setting, lambda: host_and_wall_ms(fn, reps, warmup=2)))
        row = {"case": name, "same_labels": same}
        for setting in SETTINGS:
            row[f"{setting}_host_ms"] = [round(h, 4) for h, _ in times[setting]]
            row[f"{setting}_wall_ms"] = [round(w, 4) for _, w in times[setting]]
        results.append(row)
        print(f"{name:30s} labels equal: {same}; wall ms " + ", ".join(
            f"{setting} {statistics.mean(row[setting + '_wall_ms']):.3f} {row[setting + '_wall_ms']}" for setting in SETTINGS)
            + "; host ms " + ", ".join(f"{setting} {statistics.mean(row[setting + '_host_ms']):.3f}" for setting in SETTINGS),
            flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
