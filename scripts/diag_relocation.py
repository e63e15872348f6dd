"""A/B of an empty cluster's relocation in pruned fits: the farthest rows found from the bounds engine's
own distances (``BoundsEngine.sq_distances``) or from one more assignment pass (as before, and as the
dense engine still does). Alternating fits on the same data and start (seed 000's generator,
random rows as the start, so some clusters empty in the first pass); prints each variant's median
fit time, its relocations, and whether both variants' fits agree (labels and iteration counts).

    python scripts/diag_relocation.py [--n 245760] [--k 1024] [--sigma2 0.0125 0.05] [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import run, seed000_data
from torchkm._kernels import prune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    own = prune.BoundsEngine.sq_distances
    variants = {"engine distances": own, "extra assignment": property(lambda self: None)}
    for s2 in args.sigma2:
        x = seed000_data(args.n, 32, args.k, s2, 7)
        c0 = x[torch.randperm(args.n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))[:args.k]]
        times: dict[str, list[float]] = {name: [] for name in variants}
        fits = {}
        for rep in range(args.repeats + 1):
            for name, prop in (variants.items() if rep % 2 else reversed(variants.items())):
                prune.BoundsEngine.sq_distances = prop
                out, ms = run(x, c0, "pruned", 100)
                if rep:  # the first round compiles
                    times[name].append(ms)
                fits[name] = out
        prune.BoundsEngine.sq_distances = own
        a, b = fits.values()
        same = a.n_iter == b.n_iter and bool(torch.equal(a.labels, b.labels))
        relocations = [(h.iteration, h.empty_clusters) for h in a.history if h.empty_clusters]
        print(f"n={args.n} k={args.k} s2={s2}: " + ", ".join(
            f"{name} {statistics.median(t):.2f} ms (min {min(t):.2f})" for name, t in times.items())
            + f" | {a.n_iter} iterations, relocations {relocations}, same fits {same}", flush=True)


if __name__ == "__main__":
    main()
