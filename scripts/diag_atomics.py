"""Per-row atomic sums on their own: how fast, and how far from float64, rows scatter into R
copies of (k, d) fp32 (or float64) accumulators by random labels, as the fused pass's sums do
where there are more clusters than ``onehot_max_k`` (``configs.atomic_replicas``).

Rows N(0, 1), centred on their fp32 mean as a fit passes them; the error is the largest
difference from a float64 ``index_add_``, relative to the largest sum. Each setting is timed as 10
launches (with the clearing of the accumulators) replayed in a CUDA graph, median of five.

    python scripts/diag_atomics.py [--shapes 3932160,32,128 245760,32,1024] [--replicas 1 4 16 64]
        [--float64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl


@triton.jit
def _scatter_kernel(x_ptr, labels_ptr, offset_ptr, sums_ptr, counts_ptr, n, d, k, n_replicas,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    copy = pid % n_replicas
    sums_ptr += copy * k * d
    counts_ptr += copy * k
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dim_mask = dims < d
        mask = row_mask[:, None] & dim_mask[None, :]
        xr = tl.load(x_ptr + rows.to(tl.int64)[:, None] * d + dims[None, :], mask=mask, other=0.0).to(tl.float32)
        xr -= tl.load(offset_ptr + dims, mask=dim_mask, other=0.0)[None, :]
        tl.atomic_add(sums_ptr + labels[:, None] * d + dims[None, :], xr.to(sums_ptr.dtype.element_ty), mask=mask,
                      sem="relaxed")
    ones = tl.full((BLOCK_N,), 1.0, tl.float32).to(counts_ptr.dtype.element_ty)
    tl.atomic_add(counts_ptr + labels, ones, mask=row_mask, sem="relaxed")


def measure(n: int, d: int, k: int, dtype: torch.dtype, acc_dtype: torch.dtype, n_replicas: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
    labels = torch.randint(0, k, (n,), device="cuda", generator=g).to(torch.int32)
    offset = x.float().mean(0)
    sums = torch.zeros(n_replicas, k, d, device="cuda", dtype=acc_dtype)
    counts = torch.zeros(n_replicas, k, device="cuda", dtype=acc_dtype)
    grid = (triton.cdiv(n, 128),)

    def launch():
        sums.zero_()
        counts.zero_()
        _scatter_kernel[grid](x, labels, offset, sums, counts, n, d, k, n_replicas, BLOCK_N=128,
                              BLOCK_D=min(64, triton.next_power_of_2(d)))

    launch()
    torch.cuda.synchronize()
    ref = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, labels.long(), x.double() - offset.double())
    err = float((sums.double().sum(0) - ref).abs().max() / ref.abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            launch()
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / 10)
    return {"n": n, "d": d, "k": k, "dtype": str(dtype).split(".")[-1], "acc": str(acc_dtype).split(".")[-1],
            "replicas": n_replicas, "ms": sorted(runs)[2], "rel_err": err}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=["3932160,32,128", "3932160,32,1024", "245760,32,1024",
                                                        "245760,32,128", "1000000,128,4096", "3932160,32,256",
                                                        "1000000,64,128"], metavar="N,D,K")
    parser.add_argument("--replicas", nargs="*", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--float64", action="store_true", help="also float64 accumulators (one copy)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = []
    for shape in args.shapes:
        n, d, k = (int(v) for v in shape.split(","))
        for dtype in (torch.float32, torch.bfloat16):
            settings = [(torch.float32, r) for r in args.replicas] + ([(torch.float64, 1)] if args.float64 else [])
            for acc_dtype, n_replicas in settings:
                row = measure(n, d, k, dtype, acc_dtype, n_replicas)
                out.append(row)
                print(f"{n}x{d}x{k} {row['dtype']:<9} {row['acc']:<8} R={n_replicas:<3} {row['ms']:.4f} ms  "
                      f"rel err {row['rel_err']:.2e}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()
