"""A/B of dense Lloyd's sums on the GPU: fresh fp32 sums every pass (the default) against float64
sums kept across passes, which each pass changes by the rows whose label changed
(``TORCHKM_DENSE_MOVES=1``, ``configs.dense_moves``: more than 64 clusters, d > 8), with the bounds
engine (``algorithm="pruned"``) beside them.

Per workload (fresh data from a fixed seed, a start of distinct random rows, fits to ``fit``'s
default tolerance, at most ``--max-iter`` iterations), alternating variants round by round:
  - each variant's median fit time and the median of the paired ratios to the fp32 sums;
  - its iteration counts, and the rows whose final labels differ from its own first fit (the fp32
    sums' atomics change the last bits of the centroids from run to run) and from the first pruned
    fit (float64 moves should give both the same steps);
  - time per iteration at a fixed count, ``(fit of 1 + m iterations - fit of 1 iteration) / m``
    with ``tol=-1`` (the first pass, which adds every row once by an unreplicated float64 atomic
    under moves, apart), and that first iteration's fit time.

This is an A/B of one switch, for choosing its default; the per-iteration comparison with the torch
baseline, flash-kmeans and the floor is ``benchmarks/bench_lloyd.py``, run with and without
``TORCHKM_DENSE_MOVES=1``.

    python scripts/diag_dense_moves.py [--only seed000-B ...] [--rounds 5] [--json out.json]

``--tiny`` runs every workload at 600 rows of 17 features, k = 80 (a smoke test of the script; on a
machine without a GPU with ``TORCHKM_ENGINE=triton TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, mixed_rows
from bench_prune import run, seed000_data

from torchkm import _loop

# (name, n, d, k, sigma2 or None for bench_lloyd's mixed rows, dtype)
WORKLOADS = [
    ("seed000-B s0.0125", 245_760, 32, 1024, 0.0125, torch.float32),
    ("seed000-B s0.05", 245_760, 32, 1024, 0.05, torch.float32),
    ("seed000-B16 s0.0125", 3_932_160, 32, 1024, 0.0125, torch.float32),
    ("seed000-B16 s0.05", 3_932_160, 32, 1024, 0.05, torch.float32),
    ("SIFT-like mixed fp32", 1_000_000, 128, 4096, None, torch.float32),
    ("SIFT-like mixed bf16", 1_000_000, 128, 4096, None, torch.bfloat16),
]
VARIANTS = {"fp32 sums": ("lloyd", "0"), "float64 moves": ("lloyd", "1"), "pruned": ("pruned", "1")}


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _set(moves: str) -> None:
    os.environ["TORCHKM_DENSE_MOVES"] = moves  # read when an engine is built; a workspace per setting


def fixed_iterations_ms(x: torch.Tensor, c0: torch.Tensor, iterations: int) -> float:
    """Time of a dense fit of exactly ``iterations`` iterations (``tol=-1``), final pass included."""
    data, offset = centred_view(x)
    _sync()
    t0 = time.perf_counter()
    _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=iterations, tol=-1.0, algorithm="lloyd")
    _sync()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="workload name prefixes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--per-iteration", type=int, default=16, help="m of the fixed-count fits")
    parser.add_argument("--json", default=None)
    parser.add_argument("--tiny", action="store_true", help="600 x 17, k = 80 (a smoke test)")
    args = parser.parse_args()
    rows = []
    for name, n, d, k, sigma2, dtype in WORKLOADS:
        if args.only and not any(name.startswith(p) for p in args.only):
            continue
        if args.tiny:
            n, d, k = 600, 17, 80
        g = torch.Generator(device=DEVICE).manual_seed(11)
        x = seed000_data(n, d, k, sigma2, 7, DEVICE) if sigma2 is not None else mixed_rows(n, d, k, g, DEVICE)
        x = x.to(dtype).contiguous()
        c0 = x[torch.randperm(n, device=DEVICE, generator=g)[:k]].float()
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        fits: dict[str, list] = {v: [] for v in VARIANTS}
        order = list(VARIANTS)
        for rnd in range(args.rounds + 1):
            for variant in (order if rnd % 2 else order[::-1]):
                algorithm, moves = VARIANTS[variant]
                _set(moves)
                out, ms = run(x, c0, algorithm, args.max_iter)
                if rnd:  # the first round compiles and captures
                    times[variant].append(ms)
                    fits[variant].append(out)
        reference = fits["pruned"][0].labels
        summary = {}
        for variant in VARIANTS:
            first = fits[variant][0].labels
            summary[variant] = {
                "median_ms": statistics.median(times[variant]),
                "runs_ms": times[variant],
                "paired_over_fp32": statistics.median(t / u for t, u in zip(times[variant], times["fp32 sums"])),
                "iterations": [f.n_iter for f in fits[variant]],
                "labels_off_own_first": [int((f.labels != first).sum()) for f in fits[variant]],
                "labels_off_pruned": [int((f.labels != reference).sum()) for f in fits[variant]],
                "inertia": [f.inertia for f in fits[variant]],
            }
        per_iteration = {}
        for variant in ("fp32 sums", "float64 moves"):
            _set(VARIANTS[variant][1])
            fixed_iterations_ms(x, c0, 1 + args.per_iteration)  # compile, capture
            one = min(fixed_iterations_ms(x, c0, 1) for _ in range(3))
            many = min(fixed_iterations_ms(x, c0, 1 + args.per_iteration) for _ in range(3))
            per_iteration[variant] = {"first_fit_ms": one, "per_iteration_ms": (many - one) / args.per_iteration}
        _set("0")
        row = {"workload": name, "n": n, "d": d, "k": k, "sigma2": sigma2, "dtype": str(dtype).replace("torch.", ""),
               "variants": summary, "fixed_count": per_iteration}
        rows.append(row)
        print(f"{name} ({n} x {d}, k = {k}, {row['dtype']}):", flush=True)
        for variant, s in summary.items():
            print(f"  {variant:14s} {s['median_ms']:9.3f} ms (paired / fp32 {s['paired_over_fp32']:.3f}) "
                  f"iterations {s['iterations']} labels off own first {s['labels_off_own_first']} "
                  f"off pruned {s['labels_off_pruned']}", flush=True)
        for variant, s in per_iteration.items():
            print(f"  {variant:14s} per iteration {s['per_iteration_ms']:.4f} ms, fit of one iteration "
                  f"{s['first_fit_ms']:.3f} ms", flush=True)
        del x
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
