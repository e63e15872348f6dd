"""CPU simulation: how many rows the exact mode defers, and how many of those centroid neighbour
lists of each length would settle. It models the decision, not the kernels: float64 distances
stand in for the fast pass's scores.

A row is deferred when its third-nearest centroid lies inside the rounding bound of the pass over
fp32 rows, ``1.25 * 2 (2^-10 + d 2^-22) ||x|| max||c||``. A list of the ``L`` nearest other
centroids of the row's winner ``w`` settles it when the ``L+1``-th is farther from ``c_w`` than
``2 sqrt(D)``, ``D`` the row's distance to ``c_w``: the true nearest is within that reach.

2026-12-03, this machine's CPU, torch 2.13.0+cpu, 245,760 x 128, k = 1,024, mixed rows
(``bench_lloyd.mixed_rows``, 15 Lloyd iterations from random rows): 69.8 % deferred; left
unsettled with L = 4, 8, 16, 32, 64: 45.6, 15.9, 1.1, 0.7, 0.4 %. N(0, 1) rows (100,000 x 128,
10 iterations): 0.17 % deferred, 0.05 % of all rows settled by any list (BENCHMARKS.md,
"centroid neighbour lists" entry).

    python scripts/sim_neighbours.py [--n 245760] [--d 128] [--k 1024] [--data mixed] [--iters 15]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_lloyd import mixed_rows  # noqa: E402


def lloyd(x: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """fp32 Lloyd iterations from ``k`` random rows (empty clusters keep their centroid)."""
    c = x[torch.randperm(x.shape[0], generator=generator)[:k]].clone()
    for _ in range(iters):
        labels = torch.cat([(c.pow(2).sum(1)[None] - 2 * part @ c.T).argmin(1) for part in x.split(8192)])
        counts = torch.bincount(labels, minlength=k).float()
        sums = torch.zeros_like(c).index_add_(0, labels, x)
        kept = counts > 0
        c[kept] = sums[kept] / counts[kept, None]
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--data", choices=["mixed", "normal"], default="mixed")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--lengths", type=int, nargs="*", default=[4, 8, 16, 32, 64])
    args = parser.parse_args()
    g = torch.Generator().manual_seed(1)
    if args.data == "mixed":
        x = mixed_rows(args.n, args.d, args.k, g, "cpu")
    else:
        x = torch.randn(args.n, args.d, generator=g)
    c = lloyd(x, args.k, args.iters, g).double()
    x64 = x.double()
    c_sq = c.pow(2).sum(1)
    best, third, winner = [], [], []
    for part in x64.split(4096):
        dist = (part.pow(2).sum(1)[:, None] + c_sq[None] - 2 * part @ c.T).clamp_min(0)
        low, at = dist.topk(3, largest=False)
        best.append(low[:, 0])
        third.append(low[:, 2])
        winner.append(at[:, 0])
    best, third, winner = torch.cat(best), torch.cat(third), torch.cat(winner)
    bound = 1.25 * 2 * (2.0**-10 + args.d * 2.0**-22) * x64.norm(dim=1) * c_sq.sqrt().max()
    deferred = third - bound <= best
    print(f"{args.n} x {args.d}, k = {args.k}, {args.data} rows: {float(deferred.double().mean()):.1%} deferred")
    between = torch.cdist(c, c)
    between.fill_diagonal_(float("inf"))
    ordered = between.sort(1).values
    for length in args.lengths:
        if length >= args.k - 1:
            settled = torch.ones_like(deferred)
        else:
            settled = ordered[winner, length] > 2 * best.sqrt() * 1.001
        print(f"  L = {length:3d}: deferred and not settled {float((deferred & ~settled).double().mean()):.2%}"
              f" of the rows; settled by the list {float(settled.double().mean()):.2%} of all rows")


if __name__ == "__main__":
    main()
