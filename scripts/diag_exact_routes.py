"""The two routes of an exact pass over few clusters and short rows, side by side: the dense one
(3xTF32 products for every row, ``configs.exact_as_tf32x3``) and the bounds engine's full pass,
which needs lower bounds and so keeps the best two of tf32 products and re-searches the close
calls. Both are exact up to ties within fp32 rounding, so they may part only on such rows.

The data are like those of ``tests/test_pruned.py``'s group-bounds test, whose histories parted
on an H200 (2026-12-02: labels changed at the second iteration 9 against dense Lloyd's 8, with the
same final labels, for the per-row and the group bounds engines alike; the CPU interpreter's fits
agreed). That was not these routes but the fused pass's undercount of changed labels, fixed on
2026-12-03 (BENCHMARKS.md: with the fix, 12 such fits at shifts 50 and 5 kept dense Lloyd's
histories for each engine; with the old kernels the per-row engine's parted in 11 of 12, the
group-bounds engine's in none). Cosine rows (scaled by 1 / ||x||) with sample weights,
shifted off the origin by ``--shift`` (at 50 the rows are nearly parallel and many are close
calls). Prints, per route, the rows re-searched and the sums' and counts' largest errors against
float64 from its own labels; then the rows whose labels differ between the routes, with the
float64 gap between the two labels' distances. Runs on a GPU, or on the CPU under
``TRITON_INTERPRET=1``.

CPU interpreter, 2026-12-02, 10 centroid draws of 32 rows: at shift 50 the routes part on 15 of
2,560 rows, each route the one off float64 on some of them, all gaps 3e-8 to 2e-7 against unit
rows (ties by ``tests/helpers.tie_tolerance``, 2e-5 here): both routes settle those rows from
products (the engine's close calls all go to the 3xTF32 re-search under the gap bound of scaled
rows), whose rounding is relative to the rows' norms. The sums match each route's labels. At
shift 5, 2, 0.5 and 0: no row parts. (Not run on a GPU.)

    python scripts/diag_exact_routes.py [--n 256] [--d 17] [--k 32] [--shift 50] [--seeds 1]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    from torchkm._kernels.assign import AssignPass
    from torchkm._kernels.configs import assign_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--d", type=int, default=17)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--shift", type=float, default=50.0, help="added to every feature of the rows")
    parser.add_argument("--seeds", type=int, default=1, help="centroid draws (rows sampled), each checked")
    args = parser.parse_args()
    n, d, k = args.n, args.d, args.k
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(6)
    centres = torch.rand(k, d, generator=g)
    x = (centres[torch.arange(n) % k] + 0.02**0.5 * torch.randn(n, d, generator=g) + args.shift).to(device)
    w = torch.rand(n, generator=torch.Generator().manual_seed(2)).to(device)
    norms = x.norm(dim=1)
    scale = 1.0 / norms
    xs = x.double() * scale.double()[:, None]
    routes = {
        "dense": AssignPass(x, k, "exact", update=True, scaled=True),
        "lower bounds": AssignPass(x, k, "exact", update=True, scaled=True, lower_bounds=True, moves=True,
                                   config=assign_config(n, k, d, x.dtype, "exact", transposed=False, row_list=True)),
    }
    parted = 0
    for seed in range(args.seeds):
        c = xs[torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].to(device)].float().contiguous()
        got = {}
        for name, p in routes.items():
            labels = torch.full((n,), -1, dtype=torch.int64, device=device)
            lower = torch.zeros(n, device=device) if name == "lower bounds" else None
            p(x, c, offset=None, row_scale=scale, raw_norms=norms, sample_weight=w, prev_labels=None, labels=labels,
              lower=lower)
            ref_sums = torch.zeros(k, d, dtype=torch.float64, device=device).index_add_(
                0, labels, xs * w.double()[:, None])
            ref_counts = torch.zeros(k, dtype=torch.float64, device=device).index_add_(0, labels, w.double())
            sums, counts = p.acc_sums.double().sum(0), p.acc_counts.double().sum(0)
            got[name] = labels
            print(f"seed {seed} {name:<13} re-searched {int(p.flag_count[0]):>4} | sums max error "
                  f"{float((sums - ref_sums).abs().max()):.3e} (of {float(ref_sums.abs().max()):.3e}), counts max "
                  f"error {float((counts - ref_counts).abs().max()):.3e}", flush=True)
        a, b = got["dense"], got["lower bounds"]
        dist = torch.cdist(xs, c.double()) ** 2
        for row in (a != b).nonzero().flatten().tolist():
            da, db = float(dist[row, a[row]]), float(dist[row, b[row]])
            print(f"  row {row}: dense {int(a[row])} ({da:.9e}), lower bounds {int(b[row])} ({db:.9e}): gap "
                  f"{abs(da - db):.2e}, {abs(da - db) / max(da, db, 1e-30):.2e} of the distance; float64 best "
                  f"{int(dist[row].argmin())}")
        parted += int((a != b).sum())
    print(f"shift {args.shift}: labels differ on {parted} of {n * args.seeds} rows")


if __name__ == "__main__":
    main()
