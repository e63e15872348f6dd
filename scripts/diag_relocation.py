"""A relocated centroid's effect on the bounds engine: pruned fits with ``TORCHKM_RELOCATED_BOUNDS``
alternating 1 (the jump left out of the moves, bounds capped at the relocated centroids) and 0 (every
bound lowered by the jump), in one process on the same data, with the dense fit beside them.
Prints each setting's median fit time, iterations, empty-cluster relocations and searched rows.

    python scripts/diag_relocation.py [--n 245760] [--k 1024] [--sigma2 0.0125 0.05] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import run, seed000_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    arms = [("pruned", "1"), ("pruned", "0"), ("lloyd", "1")]
    for s2 in args.sigma2:
        x = seed000_data(args.n, 32, args.k, s2, args.seed)
        g = torch.Generator(device="cuda").manual_seed(args.seed + 1)
        c0 = x[torch.randperm(args.n, device="cuda", generator=g)[: args.k]].clone()
        times: dict[tuple, list[float]] = {arm: [] for arm in arms}
        facts: dict[tuple, tuple] = {}
        for arm in arms:  # compile and warm
            os.environ["TORCHKM_RELOCATED_BOUNDS"] = arm[1]
            run(x, c0, arm[0], 100)
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[: r % len(arms)]:
                os.environ["TORCHKM_RELOCATED_BOUNDS"] = arm[1]
                out, ms = run(x, c0, arm[0], 100)
                times[arm].append(ms)
                searched = sum(1.0 - h.skipped_bound for h in out.history[1:]) if arm[0] == "pruned" else float("nan")
                facts[arm] = (out.n_iter, sum(h.empty_clusters for h in out.history), searched)
        for arm in arms:
            n_iter, empties, searched = facts[arm]
            print(f"sigma2 {s2} {arm[0]:>6} RELOCATED_BOUNDS={arm[1]}: median {statistics.median(times[arm]):7.2f} ms "
                  f"(min {min(times[arm]):6.2f}), {n_iter} iterations, {empties} empty clusters relocated, "
                  f"searched {searched:.3f} dense passes after the first", flush=True)


if __name__ == "__main__":
    main()
