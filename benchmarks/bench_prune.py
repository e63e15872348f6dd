"""Seed 000 section V on the GPU: dense Lloyd against the pruned engines and the hybrid, side by side.

Data as in the paper: k centres uniform in the unit cube, n / k rows around each with Gaussian noise
of variance sigma^2; n = 245,760 (the paper's size) and 16 times that, d = 32, k = 32 (group A) and
k = 1024 (group B). Fresh data every run (``--seed``, default from the clock). Every algorithm starts
from the same centroids (random rows) and runs until no label changes (``tol=0``) or ``--max-iter``.

Correctness first: each algorithm's labels, iteration count and per-iteration changed-label counts
must equal dense Lloyd's (exact mode) before its time counts. Reported per workload and algorithm:
time to convergence, iterations, time per iteration, the fraction of the dense pass's distance
computations skipped (what the hardware spent: a warp or tile runs as long as its slowest row) next
to the rule's row-by-row upper bound (seed 000 Figs. 3 and 5) and the imbalance ratio R (eq. 2),
averaged over iterations after the first; plus flash-kmeans' time per iteration on the same data
and the floor of a dense iteration (2nkd FLOPs at the measured tf32 rate, or reading x once).

    python benchmarks/bench_prune.py --json out/bench_prune.json [--sizes 1 16] [--sigma2 0.0125 0.05 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_lloyd import ceilings, flash, per_iteration
from torchkm._kernels.assign import assign as kernel_assign

from torchkm import _loop
from torchkm._reference import DataView

ALGORITHMS = ("lloyd", "pruned", "triangle", "auto")
BASE_N = 245_760


def seed000_data(n: int, d: int, k: int, sigma2: float, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    centres = torch.rand(k, d, device="cuda", generator=g)
    x = centres[torch.arange(n, device="cuda") % k] + sigma2**0.5 * torch.randn(n, d, device="cuda", generator=g)
    return x[torch.randperm(n, device="cuda", generator=g)].contiguous()


def run(x: torch.Tensor, c0: torch.Tensor, algorithm: str, max_iter: int) -> tuple[_loop.KMeansResult, float]:
    """One fit from ``c0``; the result's centroids are in the data's centred space (see ``offset``)."""
    offset = _loop._data_mean(x, torch.float32, None)
    data = DataView(x, torch.float32, offset, False, "exact")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tol = 1e-4 * _loop._feature_variance_mean(data, None)  # the library's default tol
    out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=max_iter, tol=tol, algorithm=algorithm)
    torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="out/bench_prune.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16], help="multiples of 245,760 rows")
    parser.add_argument("--ks", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05, 0.1, 0.2, 0.3])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-flash", action="store_true")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    info = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "seed": seed,
    }
    try:
        import flash_kmeans

        info["flash_kmeans"] = getattr(flash_kmeans, "__version__", "?")
    except ImportError:
        args.no_flash = True
    info["ceilings"] = ceil = ceilings()
    print(json.dumps(info))
    d = 32
    rows = []
    for size in args.sizes:
        n = BASE_N * size
        for k in args.ks:
            for s2 in args.sigma2:
                x = seed000_data(n, d, k, s2, seed)
                g = torch.Generator(device="cuda").manual_seed(seed + 1)
                c0 = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
                floor = max(2 * n * k * d / (ceil["tf32_TFLOPs"] * 1e12), n * d * 4 / (ceil["copy_TBps"] * 1e12)) * 1e3
                row = {"n": n, "d": d, "k": k, "sigma2": s2, "floor_ms": floor}
                ref = None
                for alg in args.algorithms:
                    run(x, c0, alg, args.max_iter)  # compile every kernel this algorithm may use
                    out, total = run(x, c0, alg, args.max_iter)
                    if ref is None:
                        ref = out
                    # Exactness: the labels are the dense exact pass's for the run's own centroids
                    # (atomic fp32 sums make whole trajectories of any two runs drift apart in the
                    # last bits, so runs are compared to themselves, and to dense in iterations).
                    dense = kernel_assign(x, out.centroids, precision="exact", offset=_loop._data_mean(x, torch.float32, None),
                                          raw_norms=torch.linalg.vector_norm(x.float(), dim=1)).labels
                    off = int((dense != out.labels).sum())
                    same = off == 0
                    later = out.history[1:] or out.history
                    kernels = [h.kernel for h in out.history]
                    row[alg] = {
                        "ms": total, "n_iter": out.n_iter, "ms_per_iter": total / out.n_iter, "labels_exact": same,
                        "labels_off": off, "same_iterations_as_lloyd": out.n_iter == ref.n_iter,
                        "same_labels_as_lloyd": bool(torch.equal(out.labels, ref.labels)),
                        "skipped": sum(h.skipped for h in later) / len(later),
                        "skipped_bound": sum(h.skipped_bound for h in later) / len(later),
                        "imbalance": sum(h.imbalance for h in later) / len(later),
                        "kernels": {kname: kernels.count(kname) for kname in dict.fromkeys(kernels)},
                    }
                    if not same:
                        print(f"MISMATCH {alg} n={n} k={k} sigma2={s2}: {off} labels are not the nearest "
                              "centroid's", flush=True)
                if not args.no_flash:
                    row["flash_ms_per_iter"] = per_iteration(lambda m, x=x, c0=c0: flash(x, c0, m), 20)
                rows.append(row)
                print(json.dumps(row), flush=True)
                del x
                torch.cuda.empty_cache()
    print(f"\n{'n':>9} {'k':>5} {'s2':>6} | {'iters':>5} | " + " ".join(f"{a + ' ms':>12}" for a in args.algorithms)
          + " | " + " ".join(f"{a[:5] + ' it':>8}" for a in args.algorithms)
          + f" | {'flash/it':>8} {'floor/it':>8} | {'pruned skip':>11} {'bound':>6} | {'tri skip':>8} {'bound':>6} {'R':>5} | exact")
    for r in rows:
        times = " ".join(f"{r[a]['ms']:12.2f}" for a in args.algorithms)
        p = r.get("pruned", {})
        t = r.get("triangle", {})
        same = all(r[a]["labels_exact"] for a in args.algorithms)
        iters = " ".join(f"{r[a]['n_iter']:>8}" for a in args.algorithms)
        print(f"{r['n']:>9} {r['k']:>5} {r['sigma2']:>6} | {r['lloyd']['n_iter']:>5} | {times} | {iters} | "
              f"{r.get('flash_ms_per_iter', float('nan')):8.3f} {r['floor_ms']:8.3f} | "
              f"{p.get('skipped', float('nan')):11.3f} {p.get('skipped_bound', float('nan')):6.3f} | "
              f"{t.get('skipped', float('nan')):8.3f} {t.get('skipped_bound', float('nan')):6.3f} "
              f"{t.get('imbalance', float('nan')):5.2f} | {same}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
