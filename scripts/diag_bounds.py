"""The bounds engine pass by pass: rows searched, and the GPU time of the settle pass and the search.

For seed 000's data (d = 32) and each (k, sigma2): a pruned fit under torch.profiler; per pass the
share of rows the search took (1 - skipped_bound), the settle kernel's and the
search kernels' microseconds, and the search's nanoseconds per searched row, against the dense
pass's nanoseconds per row (a dense fit's mean ``_assign_kernel`` time over n). A compacted search
that costs more per row than the dense one is slower than its share of rows says.

    python scripts/diag_bounds.py [--n 3932160] [--ks 1024] [--sigma2 0.0125 0.05] [--every 5]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import run, seed000_data


def kernels_in_order(x, c0, algorithm: str, max_iter: int):
    """(fit result, [(kernel name, microseconds)] in launch order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out, _ = run(x, c0, algorithm, max_iter)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return out, [(e.name, e.time_range.elapsed_us()) for e in events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3_932_160)
    parser.add_argument("--ks", type=int, nargs="+", default=[1024])
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05])
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--every", type=int, default=5, help="print every this many passes")
    args = parser.parse_args()
    n = args.n
    for k in args.ks:
        for s2 in args.sigma2:
            x = seed000_data(n, 32, k, s2, 1234)
            g = torch.Generator(device="cuda").manual_seed(1235)
            c0 = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
            run(x, c0, "lloyd", 3)  # compile
            run(x, c0, "pruned", 3)
            dense, dense_kernels = kernels_in_order(x, c0, "lloyd", args.max_iter)
            searches = [us for name, us in dense_kernels if name.startswith("_assign_kernel")]
            # Each dense pass is a search launch and the re-search's epilogue launch: take the larger.
            dense_us = sorted(searches)[len(searches) // 2:]
            dense_ns_row = 1e3 * sum(dense_us) / len(dense_us) / n
            out, kernels = kernels_in_order(x, c0, "pruned", args.max_iter)
            settles = [i for i, (name, _) in enumerate(kernels) if name.startswith("_settle_kernel")]
            print(f"n={n} k={k} s2={s2}: dense {dense.n_iter} it, search {dense_ns_row:.3f} ns/row; "
                  f"pruned {out.n_iter} it")
            print("   pass  searched  settle_us  search_us  research_us  ns/searched row  vs dense")
            totals = [0.0, 0.0, 0.0]
            for p, start in enumerate(settles):
                stop = settles[p + 1] if p + 1 < len(settles) else len(kernels)
                window = kernels[start:stop]
                settle = window[0][1]
                search = sum(us for name, us in window if name.startswith("_assign_kernel"))
                research = sum(us for name, us in window if name.startswith("_research_kernel"))
                totals = [totals[0] + settle, totals[1] + search, totals[2] + research]
                stats = out.history[p + 1] if p + 1 < len(out.history) else None
                if stats is None:
                    continue
                share = 1.0 - stats.skipped_bound  # rows searched (and deferred) over n
                searched = max(1.0, share * n)
                if p % args.every == 0 or p == len(settles) - 1:
                    per_row = 1e3 * search / searched
                    print(f"  {p + 1:5d}  {100 * share:7.2f}%  {settle:9.1f}  {search:9.1f}  {research:11.1f}"
                          f"  {per_row:15.3f}  {per_row / dense_ns_row:8.2f}")
            passes = max(1, len(settles))
            print(f"  mean per settle pass: settle {totals[0] / passes:.1f} us, search {totals[1] / passes:.1f} us, "
                  f"research {totals[2] / passes:.1f} us")
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
