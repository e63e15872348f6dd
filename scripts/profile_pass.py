"""One fused assignment pass (labels and per-cluster sums) per mode, for Nsight Compute: what
limits each of its kernels, the Hopper search's epilogue (``_assign_kernel``) above all.

    ncu --clock-control none --kernel-name regex:_assign_kernel --launch-skip 2 --launch-count 2 \
        --set full python3 scripts/profile_pass.py --modes exact

Each mode runs ``--passes`` passes (the first compiles); the rows are N(0, 1), the centroids rows
of them, centred as ``fit`` centres them (bench_lloyd's SIFT-like workload by default; ``--raw``:
not centred); ``--centroids means``: each the mean of a random group of rows, as a fit's centroids
over such rows end up (near ties everywhere: bench_lloyd's exact pass re-searches more rows).

``--kernels``: no Nsight needed; one more pass per mode under torch.profiler, its CUDA kernels'
times printed (where a pass's time goes: search, epilogue, re-search, sums).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    from torchkm._kernels.assign import assign

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--modes", nargs="*", default=["exact", "fast"])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--raw", action="store_true", help="rows not centred (no ``offset``), to compare")
    parser.add_argument("--centroids", default="rows", choices=["rows", "means"])
    parser.add_argument("--kernels", action="store_true", help="print each mode's kernel times (torch.profiler)")
    args = parser.parse_args()
    x = torch.randn(args.n, args.d, device="cuda").to(getattr(torch, args.dtype))
    offset = None if args.raw else x.float().mean(0)
    if args.centroids == "rows":
        c = x[torch.randint(0, args.n, (args.k,), device="cuda")].float()
    else:
        groups = torch.randint(0, args.k, (args.n,), device="cuda")
        c = torch.zeros(args.k, args.d, device="cuda").index_add_(0, groups, x.float())
        c /= torch.bincount(groups, minlength=args.k).clamp(min=1)[:, None]
    c = c - (0 if args.raw else offset)
    sums = torch.zeros(args.k, args.d, device="cuda")
    counts = torch.zeros(args.k, device="cuda")
    labels = torch.zeros(args.n, dtype=torch.int32, device="cuda")
    for mode in args.modes:
        for _ in range(args.passes):
            assign(x, c, precision=mode, offset=offset, sums=sums, counts=counts, labels=labels, prev_labels=labels,
                   store_sq_dist=False)
    torch.cuda.synchronize()
    print("launched", args, flush=True)
    if args.kernels:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        for mode in args.modes:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                assign(x, c, precision=mode, offset=offset, sums=sums, counts=counts, labels=labels,
                       prev_labels=labels, store_sq_dist=False)
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
            total = sum(e.self_device_time_total for e in events) / 1e3
            print(f"{mode}: {total:.3f} ms of kernels", flush=True)
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:12]:
                print(f"  {e.self_device_time_total / 1e3:9.3f} ms  x{e.count:<3d} {e.key[:110]}", flush=True)


if __name__ == "__main__":
    main()
