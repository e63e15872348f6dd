"""Why a search over a row list costs more per row than the dense pass: the same exact pass (the
bounds engine's, with lower bounds, from centroids a few Lloyd iterations on) timed over all rows, over a list of all rows, and over lists of
a share of the rows (contiguous, sorted random, shuffled), in nanoseconds per searched row.

    python scripts/diag_rowlist.py [--n 3932160] [--k 1024] [--share 0.12] [--dtype bfloat16]

``--shares S...``: instead, lists of each share of the rows (sorted random, as the settle pass
appends them tile by tile) with the search as the bounds engine runs it (rows moving between the
sums), on the engine's row-list tiles, the dense pass's tiles and each of ``--configs``; ``--json``
writes the table.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--shares", nargs="*", type=float, default=[], help="list shares to time (see above)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="the rows' dtype")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    n, k, d = args.n, args.k, 32
    x = seed000_data(n, d, k, args.sigma2, 1234).to(getattr(torch, args.dtype))
    g = torch.Generator(device="cuda").manual_seed(1235)
    c = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
    if args.iterations:  # centroids a few Lloyd iterations on, as the bounds engine sees them
        c = torchkm.fit(x, k, init=c, max_iter=args.iterations, tol=0.0).centroids.float().contiguous()
    norms = x.float().norm(dim=1)
    labels = torch.zeros(n, dtype=torch.int32, device="cuda")
    sq = torch.empty(n, device="cuda")
    lower = torch.empty(n, device="cuda")
    if args.shares:
        shares(x, c, norms, labels, sq, lower, args, g)
        return
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


def shares(x, c, norms, labels, sq, lower, args, g) -> None:
    """ms of the engine's search (moves) over sorted random lists of each share, per tile config."""
    n, d = x.shape
    k = c.shape[0]
    configs = {"row-list": assign_config(n, k, d, x.dtype, "exact", transposed=False, row_list=True),
               "dense": assign_config(n, k, d, x.dtype, "exact", transposed=False)}
    for spec in args.configs:
        os.environ["TORCHKM_ASSIGN_CONFIG"] = spec
        configs[spec] = assign_config(n, k, d, x.dtype, "exact", transposed=False, row_list=True)
        os.environ.pop("TORCHKM_ASSIGN_CONFIG")
    order = torch.randperm(n, device="cuda", generator=g)
    table: dict[str, dict[str, float]] = {}
    print(f"{n} x {d}, k = {k}: ms of the search (moves) over sorted random lists; no list = every row, adds")
    print(f"{'config':>24} | no list | " + " | ".join(f"{s:7.0%}" for s in args.shares))
    for name, cfg in configs.items():
        p = AssignPass(x, k, "exact", update=True, lower_bounds=True, moves=True, config=cfg, fixed_rows=True)
        row = {}
        for share in [None, *args.shares]:
            rows = None if share is None else order[:max(1, int(share * n))].sort().values.int()
            count = torch.tensor([n if rows is None else rows.numel()], dtype=torch.int32, device="cuda")

            def call(p=p, rows=rows, count=count):
                p(x, c, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=labels,
                  labels=labels, sq_dist=sq, lower=lower, rows=None if rows is None else (rows, count),
                  moves=rows is not None)

            row["none" if share is None else str(share)] = graph_ms(call, calls=10)
        table[name] = {"config": cfg, "ms": row}
        print(f"{name:>24} | " + " | ".join(f"{v:7.4f}" for v in row.values()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "d": d, "k": k, "dtype": str(x.dtype), "sigma2": args.sigma2, "iterations": args.iterations,
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
