"""How many distances row bounds and Yinyang's group bounds would leave to compute, iteration by
iteration of an exact Lloyd fit on seed 000's data: counts only, no kernels, no timing.

Issue 4 asks for 2x the time to convergence of dense Lloyd at 245,760 x 32, k = 1024, sigma^2 <=
0.05. The bounds engine (``torchkm._kernels.prune``) keeps one upper and one lower bound per row:
after an update a row's upper bound grows by its centroid's move and its lower bound shrinks by the
largest move of another centroid; a row whose exact distance to its centroid stays within the lower
bound is settled, every other row is searched against all k centroids. Yinyang (Ding et al., ICML
2015) keeps one lower bound per group of centroids instead (groups from k-means on the first
centroids, about k / 10 of them): each shrinks by its own group's largest move, and a row that fails
the global test is searched only in the groups whose bound is below its upper bound.

Each iteration computes every distance (float64), takes the true labels from them, and applies both
rules exactly (without Yinyang's local filter inside a group), so both rules' labels are checked
against the true ones. Printed per iteration and in total: the fraction of the n k distances each
rule computes (searched rows or groups; the one distance a row's settle check or tightening takes
counted apart), and for Yinyang also at tensor-core granularity: the searching rows in order of
their label, in tiles of ``--tile`` rows that each search the union of their rows' groups. The fit
stops as ``fit`` does by default (shift at most 1e-4 of the mean feature variance, or no label
changed).

    python scripts/diag_bound_potential.py [--n 245760] [--k 1024] [--sigma2 0.05 0.0125] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import seed000_data  # noqa: E402


def group_centroids(c: torch.Tensor, groups: int, iters: int = 5, seed: int = 0) -> torch.Tensor:
    """Each centroid's group: a few Lloyd iterations over the centroids themselves (Yinyang's rule)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    centres = c[torch.randperm(c.shape[0], generator=g)[:groups].to(c.device)].clone()
    for _ in range(iters):
        member = torch.cdist(c, centres).argmin(1)
        for j in range(groups):
            rows = c[member == j]
            if rows.shape[0]:
                centres[j] = rows.mean(0)
    return torch.cdist(c, centres).argmin(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.05, 0.0125])
    parser.add_argument("--groups", type=int, default=None, help="Yinyang's groups (default k / 10)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--tile", type=int, default=64, help="rows a tile for the tile-level Yinyang count")
    args = parser.parse_args(argv)
    n, k = args.n, args.k
    groups = args.groups or max(1, k // 10)
    for sigma2 in args.sigma2:
        x = seed000_data(n, args.d, k, sigma2, args.seed, device=args.device).double()
        g = torch.Generator(device=args.device).manual_seed(args.seed + 1)
        c = x[torch.randperm(n, device=args.device, generator=g)[:k]].clone()
        tol = 1e-4 * float(x.var(0, unbiased=False).mean())
        member = group_centroids(c, groups, seed=args.seed)
        # Groups contiguous: centroid j of the permuted order is centroid order[j].
        order = torch.argsort(member, stable=True)
        c = c[order].contiguous()
        member = member[order]
        sizes = torch.bincount(member, minlength=groups).double()
        labels = torch.empty(n, dtype=torch.long, device=args.device)
        f64 = {"dtype": torch.float64, "device": args.device}
        upper_r = torch.empty(n, **f64)  # row bounds: upper, lower
        lower_r = torch.empty(n, **f64)
        upper_y = torch.empty(n, **f64)  # Yinyang: upper, one lower bound per group
        lower_y = torch.empty(n, groups, **f64)
        print(f"sigma2 {sigma2}: n {n} d {args.d} k {k}, {groups} groups of {int(sizes.min())}-{int(sizes.max())} "
              f"centroids, tol {tol:.3e}", flush=True)
        print(f"{'iter':>4} {'changed':>8} {'rows: searched %':>17} {'yinyang: searched %':>20} "
              f"{'in tiles %':>11} {'+ tightened rows %':>19}")
        totals = {"row": 0.0, "yinyang": 0.0, "tiles": 0.0, "tightened": 0.0, "passes": 0}
        need = torch.zeros(n, groups, dtype=torch.bool, device=args.device)
        for it in range(args.max_iter):
            searched_r = searched_y = tightened = 0.0
            changed = 0
            before = labels.clone()
            for s in range(0, n, args.chunk):
                xs = x[s:s + args.chunk]
                dist = torch.cdist(xs, c)
                vals, idx = dist.topk(2, dim=1, largest=False)
                new = idx[:, 0]
                masked = dist.clone()
                masked.scatter_(1, new[:, None], float("inf"))
                group_min = torch.full((xs.shape[0], groups), float("inf"), **f64)
                group_min.scatter_reduce_(1, member.expand(xs.shape[0], -1), masked, "amin")
                sl = slice(s, s + xs.shape[0])
                if it == 0:
                    labels[sl], upper_r[sl], lower_r[sl] = new, vals[:, 0], vals[:, 1]
                    upper_y[sl], lower_y[sl] = vals[:, 0], group_min
                    changed += xs.shape[0]
                    continue
                old = labels[sl]
                own = dist.gather(1, old[:, None]).squeeze(1)
                # Row bounds: settle where the exact own distance stays within the lower bound.
                settled = own <= lower_r[sl]
                search = ~settled
                assert bool((own[settled] <= vals[settled, 0]).all()), "row rule settled a row with a closer centroid"
                searched_r += float(search.sum()) * k
                upper_r[sl] = torch.where(search, vals[:, 0], own)
                lower_r[sl] = torch.where(search, vals[:, 1], lower_r[sl])
                # Yinyang: global test on the loose upper bound, then on the tightened one, then
                # the groups whose bound lies below it.
                floor = lower_y[sl].min(1).values
                loose_ok = upper_y[sl] <= floor
                tight_ok = ~loose_ok & (own <= floor)
                todo = ~(loose_ok | tight_ok)
                searched = todo[:, None] & (lower_y[sl] < own[:, None])
                need[sl] = searched
                searched_y += float((searched.double() * sizes).sum())
                tightened += float((~loose_ok).sum())
                # Labels: the best of the searched groups and the old centroid; unsearched groups'
                # bounds prove none of theirs is closer.
                in_searched = searched.gather(1, member.expand(xs.shape[0], -1))
                cand = torch.where(in_searched, dist, torch.full_like(dist, float("inf")))
                cand.scatter_(1, old[:, None], own[:, None])
                got = torch.where(todo, cand.argmin(1), old)
                got_d = dist.gather(1, got[:, None]).squeeze(1)
                assert bool((got_d <= vals[:, 0]).all()), "yinyang rule missed a closer centroid"
                # New bounds: searched groups exact (less the new label); the old centroid joins
                # its group's bound where the label moved away from it.
                lb = torch.where(searched, group_min, lower_y[sl])
                moved_away = got != old
                old_group = member[old]
                rows = torch.nonzero(moved_away & ~searched.gather(1, old_group[:, None]).squeeze(1)).squeeze(1)
                lb[rows, old_group[rows]] = torch.minimum(lb[rows, old_group[rows]], own[rows])
                lower_y[sl] = lb
                upper_y[sl] = torch.where(loose_ok, upper_y[sl], got_d)
                changed += int((new != old).sum())
                labels[sl] = new
            # At tensor-core granularity: the rows that search, in order of their label before the
            # search (rows of a cluster side by side), in tiles of ``--tile`` rows, each tile
            # searching the union of its rows' groups for all its rows.
            in_tiles = 0.0
            if it > 0:
                active = torch.nonzero(need.any(1)).squeeze(1)
                active = active[torch.argsort(before[active], stable=True)]
                pad = -active.numel() % args.tile
                tiles = torch.cat([need[active], need.new_zeros(pad, groups)]).view(-1, args.tile, groups).any(1)
                in_tiles = float(args.tile * (tiles.double() * sizes).sum())
            # The update, and the bounds moved by it.
            sums = torch.zeros_like(c).index_add_(0, labels, x)
            counts = torch.bincount(labels, minlength=k).double()
            new_c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
            moves = (new_c - c).norm(dim=1)
            shift = float(((new_c - c) ** 2).sum())
            c = new_c
            top2 = moves.topk(2)
            other = torch.where(labels == top2.indices[0], top2.values[1], top2.values[0])
            upper_r += moves[labels]
            lower_r -= other
            group_move = torch.zeros(groups, **f64).scatter_reduce_(0, member, moves, "amax")
            upper_y += moves[labels]
            lower_y -= group_move[None, :]
            if it > 0:
                totals["row"] += searched_r
                totals["yinyang"] += searched_y
                totals["tiles"] += in_tiles
                totals["tightened"] += tightened
                totals["passes"] += 1
                print(f"{it + 1:>4} {changed:>8} {100 * searched_r / (n * k):>17.2f} {100 * searched_y / (n * k):>20.2f} "
                      f"{100 * in_tiles / (n * k):>11.2f} {100 * tightened / n:>19.2f}", flush=True)
            if (it > 0 and changed == 0) or shift <= tol:
                break
        passes = max(1, totals["passes"])
        print(f"sigma2 {sigma2}: {it + 1} iterations; over iterations 2 on, of n k distances: rows searched "
              f"{100 * totals['row'] / (n * k * passes):.1f} %, Yinyang groups searched "
              f"{100 * totals['yinyang'] / (n * k * passes):.1f} % ({100 * totals['tiles'] / (n * k * passes):.1f} % "
              f"in tiles of {args.tile} rows), rows tightened "
              f"{100 * totals['tightened'] / (n * passes):.1f} % (one distance each)\n", flush=True)


if __name__ == "__main__":
    main()
