"""Seed 000 section V on the GPU: dense Lloyd against the pruned engines and the hybrid, side by side.

Data as in the paper: k centres uniform in the unit cube, n / k rows around each with Gaussian noise
of variance sigma^2; n = 245,760 (the paper's size) and 16 times that, d = 32, k = 32 (group A) and
k = 1024 (group B). Fresh data every run (``--seed``, default from the clock). Every algorithm starts
from the same centroids (random rows) and runs as ``fit`` does by default: until the centroids' total
shift is at most 1e-4 of the data's mean feature variance, or no label changes, or ``--max-iter``.
That ``tol`` is computed once per workload and its time reported apart (``tol_ms``): a fit's time is
its iterations to convergence, from the starting centroids.

Correctness first: each algorithm's labels, iteration count and per-iteration changed-label counts
must equal dense Lloyd's (exact mode) before its time counts. Reported per workload and algorithm:
time to convergence, iterations, time per iteration, the fraction of the dense pass's distance
computations skipped (what the hardware spent: a warp or tile runs as long as its slowest row) next
to the rule's row-by-row upper bound (seed 000 Figs. 3 and 5) and the imbalance ratio R (eq. 2),
averaged over iterations after the first; plus flash-kmeans' time per iteration on the same data
and the floor of a dense iteration (2nkd FLOPs at the measured tf32 rate, or reading x once).

Plus real 128-d SIFT descriptors (``--sift``: the file ``benchmarks/sift_data.py`` writes) with
``--sift-k`` clusters. Times are medians of ``--repeats`` fits (three times as many for fits under
50 ms) after an untimed one that compiles (one timed fit where a second untimed one still took over
2 s); the algorithms take turns, repeat by repeat, in a rotating order. Each algorithm's time against
dense Lloyd's is also given paired: the median of the ratios within a round, which cancels drift of
the GPU's clocks between rounds (H200: 9-11 ms fits drifted by 17 % over 15 rounds).
Fits of the same rows restart the engines an earlier fit kept (``torchkm._workspace``): the timed
fits skip the set-up the untimed first one paid; ``--cold`` times fits that set up afresh.
``--decompose`` adds seed 000's Table I: where a fit's GPU time goes, kernel by kernel
(torch.profiler), grouped into labeling, inter-centroid distances (ICD), their ranking (RID), the
bounds' settle pass, the update, reordering and the rest.

``--algorithms ... lloyd-moves`` adds dense Lloyd with float64 moves (``TORCHKM_DENSE_MOVES=1``, see
``torchkm._kernels.configs.dense_moves``: ``lloyd``'s default for rows of at most 32 features), whose
sums are the bounds engine's: ``labels_differ_from_moves_runs`` then counts each run's final labels
against its last run's. ``lloyd-sums``: dense Lloyd with fresh fp32 sums every pass
(``TORCHKM_DENSE_MOVES=0``, ``lloyd``'s default for wider rows).

    python benchmarks/bench_prune.py --json out/bench_prune.json [--sizes 1 16] [--sigma2 0.0125 0.05 0.3] \
        [--sift .data/sift.npy --sift-k 4096] [--repeats 3] [--decompose]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from unittest import mock

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_lloyd import ceilings, centred_view, default_tol, flash, per_iteration
from torchkm._kernels.assign import assign as kernel_assign

from torchkm import _loop

ALGORITHMS = ("lloyd", "pruned", "triangle", "auto", "lloyd-moves", "lloyd-sums")
DEFAULT_ALGORITHMS = ("lloyd", "pruned", "triangle", "auto")
BASE_N = 245_760


def seed000_data(n: int, d: int, k: int, sigma2: float, seed: int, device: str = "cuda") -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    centres = torch.rand(k, d, device=device, generator=g)
    x = centres[torch.arange(n, device=device) % k] + sigma2**0.5 * torch.randn(n, d, device=device, generator=g)
    return x[torch.randperm(n, device=device, generator=g)].contiguous()


def paired_ratio(times: list[float], reference: list[float]) -> float:
    """The median over rounds of ``times[i] / reference[i]`` (round i's fits of two algorithms)."""
    return statistics.median(t / r for t, r in zip(times, reference))


def synchronize(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def fit_tol(x: torch.Tensor) -> tuple[float, float]:
    """``fit``'s default ``tol`` for these rows (``default_tol``) and the milliseconds it took."""
    data, _ = centred_view(x)
    synchronize(x)
    t0 = time.perf_counter()
    tol = default_tol(data)
    return tol, (time.perf_counter() - t0) * 1e3


def run(x: torch.Tensor, c0: torch.Tensor, algorithm: str, max_iter: int,
        tol: float | None = None) -> tuple[_loop.KMeansResult, float]:
    """One fit from ``c0`` to ``tol`` (default ``fit_tol``'s: a pass over the rows, the same for every
    algorithm, so ``main`` computes it once per workload and times it apart), timed from its first
    iteration's launch to its result; the result's centroids are in the data's centred space (see
    ``offset``)."""
    data, offset = centred_view(x)
    if tol is None:
        tol = default_tol(data)
    forced = {"lloyd-moves": "1", "lloyd-sums": "0"}.get(algorithm)
    # (Read when an engine is built; the kept engines are keyed by the environment too.)
    with mock.patch.dict(os.environ, {} if forced is None else {"TORCHKM_DENSE_MOVES": forced}):
        synchronize(x)
        t0 = time.perf_counter()
        out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=max_iter, tol=tol,
                          algorithm="lloyd" if forced is not None else algorithm)
        synchronize(x)
    return out, (time.perf_counter() - t0) * 1e3


# Kernel names (substrings, lower case) -> seed 000 Table I's components, first match wins.
COMPONENTS = (
    ("labeling: tensor-core search", ("_assign_kernel", "_assign_small_d_kernel")),
    ("labeling: triangle scan", ("_scan_kernel",)),
    ("settle pass (bounds)", ("_settle_kernel",)),
    ("ICD", ("cdist",)),
    ("RID", ("sort", "radix")),
    ("update", ("_prepare_kernel", "_finish_kernel")),
    ("reorder / scatter", ("index", "gather", "scatter", "copy")),
)


def decompose(x: torch.Tensor, c0: torch.Tensor, algorithm: str, max_iter: int,
              tol: float | None = None) -> dict[str, float]:
    """GPU milliseconds of one fit by component (``COMPONENTS``; the rest is "other")."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(x, c0, algorithm, max_iter, tol)
    out: dict[str, float] = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0.0)
        if not us:
            continue
        name = event.key.lower()
        part = next((label for label, keys in COMPONENTS if any(key in name for key in keys)), "other")
        out[part] = out.get(part, 0.0) + us * 1e-3
    return out


def workloads(args, seed: int):
    """(name, x, k, sigma2 or None) for each workload, the data made on the GPU when needed."""
    for d in args.dims:
        for size in args.sizes:
            for k in args.ks:
                for s2 in args.sigma2:
                    yield (f"seed000 {BASE_N * size}x{d}",
                           lambda n=BASE_N * size, d=d, k=k, s2=s2: seed000_data(n, d, k, s2, seed), k, s2)
    if args.sift:
        import numpy as np

        for k in args.sift_k:
            yield "SIFT", lambda: torch.from_numpy(np.load(args.sift)).cuda().float(), k, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="out/bench_prune.json")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 16], help="multiples of 245,760 rows")
    parser.add_argument("--ks", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--dims", type=int, nargs="+", default=[32], help="features (seed 000: 32; 2 or 3: the box engine)")
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05, 0.1, 0.2, 0.3])
    parser.add_argument("--sift", default=None, help="a .npy of SIFT descriptors (benchmarks/sift_data.py)")
    parser.add_argument("--sift-k", type=int, nargs="+", default=[4096])
    parser.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decompose", action="store_true", help="seed 000 Table I: GPU time by component")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-flash", action="store_true")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the rows' dtype (seed 000's data is made in float32, then cast)")
    parser.add_argument("--cold", action="store_true",
                        help="every fit sets its engines up afresh (TORCHKM_REUSE_ENGINES=0), as a first fit of its rows "
                             "does; by default the timed fits restart the engines the untimed first fit kept")
    args = parser.parse_args()
    if args.cold:
        os.environ["TORCHKM_REUSE_ENGINES"] = "0"
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    info = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "seed": seed,
        "repeats": args.repeats, "engines_reused": not args.cold, "dtype": args.dtype,
    }
    try:
        import flash_kmeans

        info["flash_kmeans"] = getattr(flash_kmeans, "__version__", "?")
    except ImportError:
        args.no_flash = True
    info["ceilings"] = ceil = ceilings()
    print(json.dumps(info))
    rows = []
    for name, make, k, s2 in workloads(args, seed):
        x = make().to(getattr(torch, args.dtype))
        n, d = x.shape
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        c0 = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
        rate = ceil["tf32_TFLOPs"] if x.dtype == torch.float32 else ceil["bf16_TFLOPs"]
        floor = max(2 * n * k * d / (rate * 1e12), n * d * x.element_size() / (ceil["copy_TBps"] * 1e12)) * 1e3
        # The same tol for every algorithm, as ``fit`` would set it by default; its pass over the rows
        # (a few chunked float64 reductions and a host sync) is timed apart, not inside each fit (until
        # 2026-12-04 it was inside: the same time added to every algorithm's fit).
        fit_tol(x)  # untimed: its first reductions set up kernels and the allocator
        tol, tol_ms = fit_tol(x)
        row = {"data": name, "n": n, "d": d, "k": k, "sigma2": s2, "floor_ms": floor, "tol": tol, "tol_ms": tol_ms}
        ref = None
        first_ms = {}
        for alg in args.algorithms:
            _, first_ms[alg] = run(x, c0, alg, args.max_iter, tol)  # compiles every kernel this algorithm may use
            if first_ms[alg] > 2000:  # compilation, or a slow fit: see which
                _, first_ms[alg] = run(x, c0, alg, args.max_iter, tol)
        # The repeats take turns between the algorithms, in an order that rotates each round, so that
        # neither a drift of the GPU's clocks nor what the previous fit left behind favours one
        # algorithm. Fits under 50 ms spread by 10-20 % from run to run: three times the repeats.
        # Fits of seconds (the scalar triangle scan at large k) are timed once.
        runs = {alg: [] for alg in args.algorithms}
        repeats = args.repeats * (3 if max(first_ms.values()) < 50 else 1)
        for repeat in range(repeats):
            turn = repeat % len(args.algorithms)
            for alg in args.algorithms[turn:] + args.algorithms[:turn]:
                if repeat == 0 or first_ms[alg] < 2000:
                    runs[alg].append(run(x, c0, alg, args.max_iter, tol))
        for alg in args.algorithms:
            timed = runs[alg]
            total = statistics.median(ms for _, ms in timed)
            out = timed[-1][0]
            if ref is None:
                ref = out
            # Exactness: the labels are the dense exact pass's for the run's own centroids
            # (atomic fp32 sums make whole trajectories of any two runs drift apart in the
            # last bits, so runs are compared to themselves, and to dense in iterations).
            dense = kernel_assign(x, out.centroids, precision="exact", offset=centred_view(x)[1],
                                  raw_norms=torch.linalg.vector_norm(x.float(), dim=1)).labels
            off = int((dense != out.labels).sum())
            later = out.history[1:] or out.history
            kernels = [h.kernel for h in out.history]
            row[alg] = {
                "ms": total, "ms_runs": [ms for _, ms in timed], "n_iter": out.n_iter, "ms_per_iter": total / out.n_iter,
                # Per run: atomic fp32 sums make runs of overlapping clusters converge after different
                # iteration counts, so the time per iteration compares the algorithms' work too.
                "iters_runs": [o.n_iter for o, _ in timed],
                "ms_per_iter_median": statistics.median(ms / o.n_iter for o, ms in timed),
                "kernels_runs": [{kname: [h.kernel for h in o.history].count(kname)
                                  for kname in dict.fromkeys(h.kernel for h in o.history)} for o, _ in timed],
                "paired_to_lloyd": paired_ratio([ms for _, ms in timed], [ms for _, ms in runs["lloyd"]])
                if "lloyd" in runs else float("nan"),
                "labels_exact": off == 0, "labels_off": off, "same_iterations_as_lloyd": out.n_iter == ref.n_iter,
                "same_labels_as_lloyd": bool(torch.equal(out.labels, ref.labels)),
                # Rows whose final label differs from the last dense run's, run by run: set beside
                # the dense runs' own (fp32 atomic sums: two dense runs may differ as well).
                "labels_differ_from_lloyd_runs": [int((o.labels != ref.labels).sum()) for o, _ in timed],
                # ... and from the last run of dense Lloyd with float64 moves, where it ran.
                **({"labels_differ_from_moves_runs": [int((o.labels != runs["lloyd-moves"][-1][0].labels).sum())
                                                      for o, _ in timed]} if "lloyd-moves" in runs else {}),
                "skipped": sum(h.skipped for h in later) / len(later),
                "skipped_bound": sum(h.skipped_bound for h in later) / len(later),
                "imbalance": sum(h.imbalance for h in later) / len(later),
                "kernels": {kname: kernels.count(kname) for kname in dict.fromkeys(kernels)},
            }
            if args.decompose and not alg.startswith("lloyd"):
                row[alg]["decomposition_ms"] = decompose(x, c0, alg, args.max_iter, tol)
            if off:
                print(f"MISMATCH {alg} {name} k={k} sigma2={s2}: {off} labels are not the nearest centroid's", flush=True)
        if not args.no_flash:
            row["flash_ms_per_iter"] = per_iteration(lambda m, x=x, c0=c0: flash(x, c0, m), 20).ms
        rows.append(row)
        print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    report(rows, args.algorithms)


def report(rows: list[dict], algorithms: list[str]) -> None:
    nan = float("nan")
    print(f"\n{'data':>17} {'k':>5} {'s2':>6} | {'iters':>5} | " + " ".join(f"{a + ' ms':>12}" for a in algorithms)
          + " | " + " ".join(f"{a[:5] + ' it':>8}" for a in algorithms)
          + f" | {'flash/it':>8} {'floor/it':>8} | {'pruned skip':>11} {'bound':>6} | {'tri skip':>8} {'bound':>6} {'R':>5} | exact")
    for r in rows:
        times = " ".join(f"{r[a]['ms']:12.2f}" for a in algorithms)
        p = r.get("pruned", {})
        t = r.get("triangle", {})
        same = all(r[a]["labels_exact"] for a in algorithms)
        iters = " ".join(f"{r[a]['n_iter']:>8}" for a in algorithms)
        first = r[algorithms[0]]["n_iter"]
        s2 = "-" if r["sigma2"] is None else r["sigma2"]
        print(f"{r['data']:>17} {r['k']:>5} {s2:>6} | {first:>5} | {times} | {iters} | "
              f"{r.get('flash_ms_per_iter', nan):8.3f} {r['floor_ms']:8.3f} | "
              f"{p.get('skipped', nan):11.3f} {p.get('skipped_bound', nan):6.3f} | "
              f"{t.get('skipped', nan):8.3f} {t.get('skipped_bound', nan):6.3f} "
              f"{t.get('imbalance', nan):5.2f} | {same}")
    if "lloyd" in algorithms and "auto" in algorithms:
        print("\nauto / dense: medians of the fits' times, of the ratios within a round (paired), and of their times "
              "per iteration (runs whose iteration counts differ)")
        for r in rows:
            a, d_ = r["auto"], r["lloyd"]
            s2 = "-" if r["sigma2"] is None else r["sigma2"]
            print(f"{r['data']:>17} {r['k']:>5} {s2:>6} | time {a['ms'] / d_['ms']:6.3f} | paired "
                  f"{a.get('paired_to_lloyd', float('nan')):6.3f} | per iteration "
                  f"{a['ms_per_iter_median'] / d_['ms_per_iter_median']:6.3f} | iterations auto {a['iters_runs']} "
                  f"dense {d_['iters_runs']} | auto ran {a['kernels_runs']}")
    if "lloyd" in algorithms:
        print("\nrows whose final label differs from the last dense run's, run by run (the dense runs' own spread "
              "first: fp32 atomic sums)")
        for r in rows:
            s2 = "-" if r["sigma2"] is None else r["sigma2"]
            print(f"{r['data']:>17} {r['k']:>5} {s2:>6} | " + " | ".join(
                f"{a} {r[a].get('labels_differ_from_lloyd_runs')} it {r[a].get('iters_runs')}" for a in algorithms))
    if "lloyd-moves" in algorithms:
        print("\nrows whose final label differs from the last run of dense Lloyd with float64 moves, run by run")
        for r in rows:
            s2 = "-" if r["sigma2"] is None else r["sigma2"]
            print(f"{r['data']:>17} {r['k']:>5} {s2:>6} | " + " | ".join(
                f"{a} {r[a].get('labels_differ_from_moves_runs')}" for a in algorithms))
    parts = [label for label, _ in COMPONENTS] + ["other"]
    decomposed = [(r, a) for r in rows for a in algorithms if "decomposition_ms" in r.get(a, {})]
    if decomposed:
        print("\nGPU time by component, % of the fit's GPU time (seed 000 Table I)")
        print(f"{'data':>17} {'k':>5} {'s2':>6} {'algorithm':>9} | " + " | ".join(f"{p[:12]:>12}" for p in parts))
        for r, a in decomposed:
            dec = r[a]["decomposition_ms"]
            total = sum(dec.values()) or 1.0
            s2 = "-" if r["sigma2"] is None else r["sigma2"]
            print(f"{r['data']:>17} {r['k']:>5} {s2:>6} {a:>9} | "
                  + " | ".join(f"{100 * dec.get(p, 0.0) / total:12.1f}" for p in parts))


if __name__ == "__main__":
    main()
