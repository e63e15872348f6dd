"""One launch of the Hopper search per mode, for Nsight Compute (the counters say what limits it).

    ncu --clock-control none --kernel-name regex:_search_kernel --set full \
        python3 scripts/profile_hopper_search.py [--n 262144] [--d 128] [--k 4096] [--dtype float32]

Each mode is launched twice (a warm-up, then the one to read: ``--launch-skip 1`` per mode or read
the second of each pair).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    from torchkm._kernels import hopper_search
    from torchkm._kernels.centroids import prepare_centroids

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=262_144)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--modes", nargs="*", default=["fast", "exact"])
    args = parser.parse_args()
    x = torch.randn(args.n, args.d, device="cuda").to(getattr(torch, args.dtype))
    c = x[torch.randint(0, args.n, (args.k,), device="cuda")].float()
    prepared = prepare_centroids(c, None, x.dtype, fast=True, split=False, exact=False)
    out = torch.empty(hopper_search.record_rows(True), args.n, device="cuda")
    for mode in args.modes:
        for _ in range(2):
            hopper_search.search(x, prepared.c_mma, prepared.bias, out, check=mode == "exact")
    torch.cuda.synchronize()
    print("launched", args, flush=True)


if __name__ == "__main__":
    main()
