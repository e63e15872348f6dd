"""How many rows each lower-bound rule leaves to search, pass by pass, on seed 000's data (CPU).

Runs exact Lloyd (pure torch, float32 distances) from random rows and, alongside, the settle
test of several bound rules. Every rule settles a row when its exact distance to its own (moved)
centroid is below the row's lower bound on the distance to every other centroid; a row that
fails is searched and its bounds are taken afresh. The rules differ only in how the bound
decays as the centroids move:

- ``hamerly``: one bound per row, lowered every pass by the largest move of another centroid
  (the bounds engine today);
- ``drift``: one bound per row (the second-best distance when it was searched), lowered by the
  largest *total* move of another centroid since then (max of sums, not sum of maxes);
- ``groups G``: Yinyang's G group bounds per row (the best distance in each group of centroids,
  the row's own centroid left out), each lowered by its group's largest total move since the
  row was searched; ``local`` is the fraction of groups a failing row would still search;
- ``elkan``: one bound per (row, centroid), the limit of the idea.

    python scripts/diag_bound_rules.py [--n 245760] [--k 1024] [--sigma2 0.0125 0.05]

Prints, per sigma^2, the fraction of rows searched per pass by each rule and the mean over the
fit (the first pass, which searches every row under all rules, left out).
"""

from __future__ import annotations

import argparse

import torch


def seed000_data(n: int, d: int, k: int, sigma2: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(k, d, generator=g)
    x = centres[torch.arange(n) % k] + sigma2**0.5 * torch.randn(n, d, generator=g)
    return x[torch.randperm(n, generator=g)].contiguous()


def distances(x: torch.Tensor, c: torch.Tensor, chunk: int = 16384):
    """Yield (row slice, (chunk, k) Euclidean distances)."""
    c_sq = (c * c).sum(1)
    for s in range(0, x.shape[0], chunk):
        xs = x[s:s + chunk]
        sq = (xs * xs).sum(1, keepdim=True) - 2 * xs @ c.T + c_sq
        yield slice(s, s + chunk), sq.clamp_min(0).sqrt()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05])
    parser.add_argument("--groups", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    n, k = args.n, args.k
    for s2 in args.sigma2:
        x = seed000_data(n, args.d, k, s2, args.seed)
        g = torch.Generator().manual_seed(args.seed + 1)
        c = x[torch.randperm(n, generator=g)[:k]].clone()
        # Groups: contiguous blocks of centroids after ordering the starting centroids along
        # their first principal direction, a cheap stand-in for Yinyang's clustering of them.
        centred = c - c.mean(0)
        order = torch.argsort(centred @ torch.linalg.svd(centred, full_matrices=False).Vh[0])
        group_of = {G: torch.empty(k, dtype=torch.long) for G in args.groups}
        for G in args.groups:
            group_of[G][order] = torch.arange(k) * G // k
        rules = ["hamerly", "drift"] + [f"groups {G}" for G in args.groups] + ["elkan"]
        searched = {r: [] for r in rules}
        local = {G: [] for G in args.groups}
        changed_frac = []
        labels = None
        total_move = torch.zeros(1, k)  # cumulative moves per centroid, one row per pass
        # Per-row state: pass index when last searched, and the bounds taken then.
        t0 = {r: torch.zeros(n, dtype=torch.long) for r in rules}
        second = {r: torch.zeros(n) for r in ("hamerly", "drift")}
        group_lower = {G: torch.zeros(n, G) for G in args.groups}
        elkan_lower = None
        for it in range(args.max_iter):
            new_labels = torch.empty(n, dtype=torch.long)
            best2 = torch.empty(n, 2)
            group_best = {G: torch.empty(n, G) for G in args.groups}
            fails = {r: torch.zeros(n, dtype=torch.bool) for r in rules}
            elkan_new = torch.empty(n, k) if elkan_lower is None else elkan_lower
            # Moves since each pass: total_move[-1] - total_move[t].
            since = total_move[-1] - total_move  # (passes so far, k)
            for rows, dist in distances(x, c):
                b = torch.topk(dist, 2, largest=False)
                best2[rows] = b.values
                new_labels[rows] = b.indices[:, 0]
                if labels is None:
                    for r in rules:
                        fails[r][rows] = True
                    for G in args.groups:
                        gb = torch.full((dist.shape[0], G), float("inf"))
                        own = dist.clone()
                        own.scatter_(1, b.indices[:, :1], float("inf"))
                        gb.scatter_reduce_(1, group_of[G].expand(dist.shape[0], k), own, "amin")
                        group_best[G][rows] = gb
                    elkan_new[rows] = dist
                    continue
                lab = labels[rows]
                u = dist.gather(1, lab[:, None])[:, 0]
                others = lambda m: m.scatter(1, lab[:, None], float("-inf"))  # noqa: E731
                fails["hamerly"][rows] = u >= second["hamerly"][rows]
                moved = others(since[t0["drift"][rows]]).amax(1)
                fails["drift"][rows] = u >= second["drift"][rows] - moved
                for G in args.groups:
                    mv = others(since[t0[f"groups {G}"][rows]])
                    gm = torch.full((dist.shape[0], G), float("-inf"))
                    gm.scatter_reduce_(1, group_of[G].expand(dist.shape[0], k), mv, "amax")
                    lower = group_lower[G][rows] - gm
                    fails[f"groups {G}"][rows] = u >= lower.amin(1)
                    local[G].append(((u[:, None] >= lower).float().sum(1)[u >= lower.amin(1)] / G))
                    own = dist.clone()
                    own.scatter_(1, b.indices[:, :1], float("inf"))
                    gb = torch.full((dist.shape[0], G), float("inf"))
                    gb.scatter_reduce_(1, group_of[G].expand(dist.shape[0], k), own, "amin")
                    group_best[G][rows] = gb
                el = elkan_lower[rows] - since[t0["elkan"][rows]]
                el.scatter_(1, lab[:, None], float("inf"))
                fails["elkan"][rows] = u >= el.amin(1)
                elkan_new[rows] = torch.where(fails["elkan"][rows][:, None], dist, elkan_lower[rows])
            if labels is not None:
                changed_frac.append((new_labels != labels).float().mean().item())
                # A row that changes label must have failed every rule (the bounds are valid).
                for r in rules:
                    assert not ((new_labels != labels) & ~fails[r]).any(), r
            for r in rules:
                f = fails[r]
                searched[r].append(f.float().mean().item())
                t0[r][f] = it
            second["hamerly"][fails["hamerly"]] = best2[fails["hamerly"], 1]
            second["drift"][fails["drift"]] = best2[fails["drift"], 1]
            for G in args.groups:
                f = fails[f"groups {G}"]
                group_lower[G][f] = group_best[G][f]
            elkan_lower = elkan_new
            # Update; empty clusters keep their centroid.
            sums = torch.zeros(k, x.shape[1]).index_add_(0, new_labels, x)
            counts = torch.bincount(new_labels, minlength=k).float()
            new_c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
            move = (new_c - c).norm(dim=1)
            # Hamerly lowers its stored bound now, by the largest move of another centroid.
            top = torch.topk(move, 2)
            lab_moved = torch.where(new_labels == top.indices[0], top.values[1], top.values[0])
            second["hamerly"] = second["hamerly"] - lab_moved
            total_move = torch.cat([total_move, total_move[-1:] + move])
            c, labels = new_c, new_labels
            if it > 0 and changed_frac[-1] == 0:
                break
        print(f"\nsigma2={s2}: {it + 1} passes; rows searched per pass (fraction), labels changed")
        print("pass " + " ".join(f"{r:>10}" for r in rules) + "    changed")
        for i in range(len(searched["hamerly"])):
            ch = changed_frac[i - 1] if i > 0 else 1.0
            print(f"{i:4d} " + " ".join(f"{searched[r][i]:10.4f}" for r in rules) + f" {ch:10.4f}")
        print("mean " + " ".join(f"{sum(searched[r][1:]) / max(1, len(searched[r]) - 1):10.4f}" for r in rules)
              + f" {sum(changed_frac) / max(1, len(changed_frac)):10.4f}")
        for G in args.groups:
            frac = torch.cat(local[G]).mean().item() if local[G] else 0.0
            print(f"groups {G}: a failing row's groups that fail, mean {frac:.3f}")


if __name__ == "__main__":
    main()
