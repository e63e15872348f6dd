"""Where a pruned or dense fit's time goes: wall time against the GPU's kernel time, kernel by kernel.

For each workload (seed 000's generator, d = 32) and algorithm: the fit's wall time, its iteration
count, the sum of its kernels' device time (torch.profiler), the share of the wall time the GPU was
busy, the top kernels, and the per-iteration history (kernel chosen, skipped fraction, seconds) of
``auto``. A fit whose GPU is busy for a small share of its wall time is bound by the host (launches
and synchronisations), not by the kernels.

    python scripts/diag_prune.py [--n 245760] [--ks 32 1024] [--sigma2 0.05 0.3] [--algorithms lloyd pruned auto]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import run, seed000_data


def kernel_times(x, c0, algorithm: str, max_iter: int) -> tuple[float, list[tuple[str, float, int]]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(x, c0, algorithm, max_iter)
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = getattr(event, "self_cuda_time_total", 0.0)
        if us:
            rows.append((event.key[:60], us * 1e-3, event.count))
    rows.sort(key=lambda r: -r[1])
    return sum(r[1] for r in rows), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[245_760])
    parser.add_argument("--ks", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.05, 0.3])
    parser.add_argument("--algorithms", nargs="+", default=["lloyd", "pruned", "auto"])
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--history", action="store_true", help="print auto's per-iteration history")
    parser.add_argument("--host-profile", action="store_true", help="print each fit's top host functions (cProfile)")
    args = parser.parse_args()
    for n in args.n:
        for k in args.ks:
            for s2 in args.sigma2:
                x = seed000_data(n, 32, k, s2, 1234)
                g = torch.Generator(device="cuda").manual_seed(1235)
                c0 = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
                for alg in args.algorithms:
                    run(x, c0, alg, args.max_iter)
                    walls = sorted(run(x, c0, alg, args.max_iter)[1] for _ in range(3))
                    out, _ = run(x, c0, alg, args.max_iter)
                    gpu, rows = kernel_times(x, c0, alg, args.max_iter)
                    wall = walls[1]
                    print(f"n={n} k={k} s2={s2} {alg:>7}: {wall:7.2f} ms wall, {out.n_iter} it, "
                          f"{wall / out.n_iter:.3f} ms/it; GPU kernels {gpu:7.2f} ms ({100 * gpu / wall:.0f} % busy)")
                    for name, ms, count in rows[: args.top]:
                        print(f"      {ms:8.3f} ms {count:5d}x  {name}")
                    if args.host_profile:
                        import cProfile
                        import pstats

                        profiler = cProfile.Profile()
                        profiler.enable()
                        run(x, c0, alg, args.max_iter)
                        profiler.disable()
                        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
                    if args.history and alg == "auto":
                        print("      " + " ".join(f"{h.kernel[0]}{h.skipped_bound:.2f}/{h.seconds * 1e3:.2f}"
                                                   for h in out.history))
                del x
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
