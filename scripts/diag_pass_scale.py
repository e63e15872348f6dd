"""The fused dense pass at seed 000's size and at 16 times its rows: does the tile config chosen at
245,760 rows hold at 3.9M? ``bench_lloyd.sweep`` (CUDA-graph timed, search + sums, and search only)
on seed 000's data with centroids a few Lloyd iterations on, for the configs given.

    python scripts/diag_pass_scale.py [--n 245760 3932160] [--ks 32 1024] [--precisions exact fast]
        [--configs 64,32,32,4,2,0 128,32,32,4,2,0]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import torchkm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_lloyd
from bench_prune import seed000_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[245_760, 3_932_160])
    parser.add_argument("--ks", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--sigma2", type=float, default=0.05)
    parser.add_argument("--precisions", nargs="+", default=["exact", "fast"])
    parser.add_argument("--configs", nargs="*", default=["64,32,32,4,2,0", "128,32,32,4,2,0"])
    parser.add_argument("--iterations", type=int, default=5, help="Lloyd iterations from random rows")
    args = parser.parse_args()
    for n in args.n:
        for k in args.ks:
            x = seed000_data(n, 32, k, args.sigma2, 1234)
            g = torch.Generator(device="cuda").manual_seed(1235)
            c = x[torch.randperm(n, device="cuda", generator=g)[:k]].clone()
            c = torchkm.fit(x, k, init=c, max_iter=args.iterations, tol=0.0).centroids.float().contiguous()
            name = f"scale-{n}-{k}"
            bench_lloyd.SWEEP[name] = list(args.configs)
            for precision in args.precisions:
                base, res = bench_lloyd.sweep(name, x, c, precision)
                cells = ", ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                                  for key, value in res.items())
                print(f"n={n} k={k} {precision} (default {base}): {cells}", flush=True)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
