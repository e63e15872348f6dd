"""Why a search over a row list costs more per row than the dense pass: the same exact pass (the
bounds engine's, with lower bounds, from centroids a few Lloyd iterations on) timed over all rows, over a list of all rows, and over lists of
a share of the rows (contiguous, sorted random, shuffled), in nanoseconds per searched row.

    python scripts/diag_rowlist.py [--n 3932160] [--k 1024] [--share 0.12]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import torchkm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import graph_ms
from bench_prune import seed000_data
from torchkm._kernels.assign import AssignPass
from torchkm._kernels.configs import assign_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3_932_160)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, default=0.0125)
    parser.add_argument("--share", type=float, default=0.12)
    parser.add_argument("--iterations", type=int, default=10, help="Lloyd iterations from random rows")
    parser.add_argument("--configs", nargs="*", default=[], help="TORCHKM_ASSIGN_CONFIG strings to try as well")
    args = parser.parse_args()
    n, k, d = args.n, args.k, 32
    x = seed000_data(n, d, k, args.sigma2, 1234)
    g = torch.Generator(device="cuda").manual_seed(1235)
    c = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
    if args.iterations:  # centroids a few Lloyd iterations on, as the bounds engine sees them
        c = torchkm.fit(x, k, init=c, max_iter=args.iterations, tol=0.0).centroids.float().contiguous()
    norms = x.norm(dim=1)
    labels = torch.zeros(n, dtype=torch.int32, device="cuda")
    sq = torch.empty(n, device="cuda")
    lower = torch.empty(n, device="cuda")
    m = int(args.share * n)
    lists = {
        "all rows, no list": None,
        "list of all rows": torch.arange(n, dtype=torch.int32, device="cuda"),
        f"{args.share:.0%} contiguous": torch.arange(m, dtype=torch.int32, device="cuda"),
        f"{args.share:.0%} sorted random": torch.randperm(n, device="cuda", generator=g)[:m].sort().values.int(),
        f"{args.share:.0%} shuffled": torch.randperm(n, device="cuda", generator=g)[:m].int(),
    }
    for spec in [None, *args.configs]:
        if spec:
            os.environ["TORCHKM_ASSIGN_CONFIG"] = spec
        cfg = assign_config(n, k, d, x.dtype, "exact", transposed=False)
        p = AssignPass(x, k, "exact", update=True, lower_bounds=True, moves=True, config=cfg)
        print(f"config {cfg}")
        for name, rows in lists.items():
            for moves in (False, True):
                if rows is None and moves:
                    continue
                count = torch.tensor([n if rows is None else rows.numel()], dtype=torch.int32, device="cuda")

                def call(p=p, rows=rows, count=count, moves=moves):
                    p(x, c, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=labels,
                      labels=labels, sq_dist=sq, lower=lower, rows=None if rows is None else (rows, count),
                      moves=moves)

                ms = graph_ms(call, calls=5)
                searched = n if rows is None else rows.numel()
                print(f"  {name:>22} {'moves' if moves else 'adds ':>5}: {ms:8.3f} ms, "
                      f"{1e6 * ms / searched:7.3f} ns/row", flush=True)
        os.environ.pop("TORCHKM_ASSIGN_CONFIG", None)


if __name__ == "__main__":
    main()
