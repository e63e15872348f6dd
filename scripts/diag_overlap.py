"""Does overlapping the running minimum with the next centroid tile's product pay? A stand-alone experiment.

The fast search spends each centroid tile in two phases, the tensor-core product and the
element-wise running minimum, and Triton waits for each product before the minimum starts, so
the two never overlap. This script times a bare nearest-centroid search (the transposed search
of ``triton_kernels/assign.py``: scores as centroids x rows, a lazy per-slot minimum, no
epilogue) in variants:

  ``plain``    one product per tile, then its minimum (what the fused pass does);
  ``overlap``  the product split in two halves of the features: the first half is synchronous
               (its wait also completes the previous tile's second half), the second half is
               left in flight while the CUDA cores take the previous tile's minimum;
  ``ws``       the plain loop with ``tl.range(..., warp_specialize=True)`` (if this Triton takes it);
  ``mma``      the products alone, chained into one accumulator (the tensor cores' pace here).

Each variant's labels are compared with a torch argmin over the same scores (rows whose best
two torch scores lie within 1e-3 relative of each other are not counted). Prints a table (ms,
TFLOP/s, PTX wait counts) and writes JSON.

    python scripts/diag_overlap.py [--n 1000000] [--d 128] [--k 4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

import torch
import triton
import triton.language as tl


@triton.jit
def _search(x_ptr, c_ptr, bias_ptr, labels_ptr, n, k,
            D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr,
            PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    HALF: tl.constexpr = D // 2
    half_dims = tl.arange(0, HALF)
    dims = tl.arange(0, D)
    slots = tl.arange(0, BLOCK_K)
    mma_dtype = c_ptr.dtype.element_ty
    best_t = tl.full((BLOCK_K, BLOCK_N), float("inf"), tl.float32)
    tile_t = tl.zeros((BLOCK_K, BLOCK_N), tl.int32)
    if MODE == 1 or MODE == 4:
        x_lo = tl.load(x_ptr + rows[:, None] * D + half_dims[None, :], mask=row_mask[:, None], other=0.0)
        x_hi = tl.load(x_ptr + rows[:, None] * D + HALF + half_dims[None, :], mask=row_mask[:, None], other=0.0)
        xt_lo = tl.trans(x_lo.to(mma_dtype))
        xt_hi = tl.trans(x_hi.to(mma_dtype))
        cols = slots
        col_mask = cols < k
        acc = tl.zeros((BLOCK_K, BLOCK_N), tl.float32) + tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))[:, None]
        c_offs = cols[:, None].to(tl.int64) * D + half_dims[None, :]
        acc = tl.dot(tl.load(c_ptr + c_offs, mask=col_mask[:, None], other=0.0), xt_lo, acc, input_precision=PRECISION)
        acc_next = tl.dot(tl.load(c_ptr + c_offs + HALF, mask=col_mask[:, None], other=0.0), xt_hi, acc,
                          input_precision=PRECISION)
        bias_next = tl.zeros((BLOCK_K,), tl.float32)
        if MODE == 4:
            # The bias is added by the minimum, not by the product: no register writes into a
            # product in flight (ptxas serialises the products otherwise).
            bias_next = tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))
            acc = tl.dot(tl.load(c_ptr + c_offs, mask=col_mask[:, None], other=0.0), xt_lo,
                         input_precision=PRECISION)
            acc_next = tl.dot(tl.load(c_ptr + c_offs + HALF, mask=col_mask[:, None], other=0.0), xt_hi, acc,
                              input_precision=PRECISION)
        for k0 in range(BLOCK_K, k, BLOCK_K):
            acc_cur = acc_next
            bias_cur = bias_next
            cols = k0 + slots
            col_mask = cols < k
            c_offs = cols[:, None].to(tl.int64) * D + half_dims[None, :]
            if MODE == 4:
                bias_next = tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))
                acc = tl.dot(tl.load(c_ptr + c_offs, mask=col_mask[:, None], other=0.0), xt_lo,
                             input_precision=PRECISION)
            else:
                acc = tl.zeros((BLOCK_K, BLOCK_N), tl.float32) + tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))[:, None]
                # Used by the next product: Triton waits for it (and for everything before it).
                acc = tl.dot(tl.load(c_ptr + c_offs, mask=col_mask[:, None], other=0.0), xt_lo, acc,
                             input_precision=PRECISION)
            # Only carried to the next iteration: left in flight.
            acc_next = tl.dot(tl.load(c_ptr + c_offs + HALF, mask=col_mask[:, None], other=0.0), xt_hi, acc,
                              input_precision=PRECISION)
            if MODE == 4:
                acc_cur = acc_cur + bias_cur[:, None]
            better = acc_cur < best_t
            best_t = tl.where(better, acc_cur, best_t)
            tile_t = tl.where(better, k0 - BLOCK_K, tile_t)
        last = ((k - 1) // BLOCK_K) * BLOCK_K
        if MODE == 4:
            acc_next = acc_next + bias_next[:, None]
        better = acc_next < best_t
        best_t = tl.where(better, acc_next, best_t)
        tile_t = tl.where(better, last, tile_t)
    else:
        x_once = tl.load(x_ptr + rows[:, None] * D + dims[None, :], mask=row_mask[:, None], other=0.0)
        xt = tl.trans(x_once.to(mma_dtype))
        if MODE == 3:
            total = tl.zeros((BLOCK_K, BLOCK_N), tl.float32)
            for k0 in range(0, k, BLOCK_K):
                cols = k0 + slots
                c_offs = cols[:, None].to(tl.int64) * D + dims[None, :]
                total = tl.dot(tl.load(c_ptr + c_offs, mask=(cols < k)[:, None], other=0.0), xt, total,
                               input_precision=PRECISION)
            best_t = total
        elif MODE == 2:
            for k0 in tl.range(0, k, BLOCK_K, warp_specialize=True):
                cols = k0 + slots
                col_mask = cols < k
                acc = tl.zeros((BLOCK_K, BLOCK_N), tl.float32) + tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))[:, None]
                c_offs = cols[:, None].to(tl.int64) * D + dims[None, :]
                acc = tl.dot(tl.load(c_ptr + c_offs, mask=col_mask[:, None], other=0.0), xt, acc,
                             input_precision=PRECISION)
                better = acc < best_t
                best_t = tl.where(better, acc, best_t)
                tile_t = tl.where(better, k0, tile_t)
        else:
            for k0 in range(0, k, BLOCK_K):
                cols = k0 + slots
                col_mask = cols < k
                acc = tl.zeros((BLOCK_K, BLOCK_N), tl.float32) + tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))[:, None]
                c_offs = cols[:, None].to(tl.int64) * D + dims[None, :]
                acc = tl.dot(tl.load(c_ptr + c_offs, mask=col_mask[:, None], other=0.0), xt, acc,
                             input_precision=PRECISION)
                better = acc < best_t
                best_t = tl.where(better, acc, best_t)
                tile_t = tl.where(better, k0, tile_t)
    best = tl.min(best_t, axis=0)
    index_t = tile_t + slots[:, None]
    label = tl.min(tl.where(best_t == best[None, :], index_t, 2147483647), axis=0)
    tl.store(labels_ptr + rows, label, mask=row_mask)


DUMP = os.environ.get("OUT")


def ptxas_warnings(ptx: str, name: str) -> list[str]:
    """ptxas's own words on the products (it serialises wgmma when their pipeline is ill-formed)."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not ptx or not os.path.exists(ptxas):
        return ["(no ptxas)"]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, name + ".ptx")
        with open(src, "w") as f:
            f.write(ptx)
        target = re.search(r"\.target\s+(\S+)", ptx).group(1)
        done = subprocess.run([ptxas, f"-arch={target}", "-v", src, "-o", os.path.join(tmp, "out.cubin")],
                              check=False, capture_output=True, text=True)
    return [line.strip() for line in (done.stdout + done.stderr).splitlines() if "arn" in line or "wgmma" in line]


MODES = {"plain": 0, "overlap": 1, "ws": 2, "mma": 3, "overlap0": 4}


def run_variant(x, c_mma, bias, mode, block_n, block_k, warps, stages):
    n, d = x.shape
    k = c_mma.shape[0]
    labels = torch.full((n,), -1, dtype=torch.int32, device=x.device)
    precision = "tf32" if x.dtype == torch.float32 else "ieee"
    grid = (triton.cdiv(n, block_n),)

    def launch():
        return _search[grid](x, c_mma, bias, labels, n, k, D=d, BLOCK_N=block_n, BLOCK_K=block_k,
                             MODE=MODES[mode], PRECISION=precision, num_warps=warps, num_stages=stages)

    compiled = launch()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(launch, warmup=25, rep=200)
    ptx = compiled.asm.get("ptx", "")
    serialised = ptxas_warnings(ptx, f"{mode}_{x.dtype}_{block_n}x{block_k}_{warps}w{stages}s")
    info = {"wait0": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)),
            "wait_other": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+[1-9]", ptx)),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "registers": getattr(compiled, "n_regs", None), "spills": getattr(compiled, "n_spills", None),
            "shared": getattr(compiled, "metadata", None) and compiled.metadata.shared,
            "ptxas_warnings": serialised}
    if DUMP:
        with open(os.path.join(DUMP, f"{mode}_{x.dtype}_{block_n}x{block_k}_{warps}w{stages}s.ttgir"), "w") as f:
            f.write(compiled.asm.get("ttgir", ""))
    return ms, labels, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    print(f"{'dtype':5} {'mode':8} {'tile':>10} {'w':>2} {'s':>2} {'ms':>8} {'TFLOP/s':>8} {'off%':>6} "
          f"{'wait0':>5} {'waitN':>5} {'regs':>5} {'spill':>5} {'smem':>7}")
    for dtype_name in args.dtypes:
        dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
        x = torch.randn(args.n, args.d, device="cuda").to(dtype)
        c = torch.randn(args.k, args.d, device="cuda").to(dtype)
        c_mma = (-2.0 * c).contiguous()  # exact: a power of two
        bias = c.float().pow(2).sum(1).contiguous()
        # Reference scores on a sample of rows, from the same rounded operands.
        sample = torch.randint(0, args.n, (4096,), device="cuda")
        scores = bias[None, :] - 2.0 * (x[sample].double() @ c.double().T).float()
        top2 = scores.topk(2, dim=1, largest=False)
        near_tie = (top2.values[:, 1] - top2.values[:, 0]) <= 1e-3 * top2.values[:, 0].abs().clamp_min(1.0)
        want = top2.indices[:, 0]
        flops = 2.0 * args.n * args.k * args.d
        if dtype == torch.float32:
            grid_configs = [("plain", 256, 64, 8, 3), ("plain", 128, 64, 8, 3), ("overlap", 128, 64, 8, 3),
                            ("overlap0", 128, 64, 8, 3), ("overlap0", 128, 64, 8, 2), ("overlap0", 256, 64, 8, 2),
                            ("overlap0", 128, 128, 8, 2), ("mma", 256, 64, 8, 3)]
        else:
            grid_configs = [("plain", 256, 64, 8, 3), ("plain", 128, 64, 4, 2), ("plain", 128, 64, 8, 3),
                            ("overlap", 128, 64, 8, 3), ("overlap0", 128, 64, 8, 3), ("overlap0", 128, 64, 8, 2),
                            ("overlap0", 128, 128, 8, 3), ("mma", 256, 64, 8, 3), ("mma", 128, 64, 4, 2)]
        for mode, bn, bk, warps, stages in grid_configs:
            row = {"dtype": dtype_name, "mode": mode, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps,
                   "num_stages": stages, "n": args.n, "d": args.d, "k": args.k}
            try:
                ms, labels, info = run_variant(x, c_mma, bias, mode, bn, bk, warps, stages)
            except Exception as error:  # noqa: BLE001 (an experiment: report and go on)
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                print(f"{dtype_name:5} {mode:8} {bn:>4}x{bk:<5} {warps:>2} {stages:>2} failed: {row['error'][:120]}")
                results.append(row)
                continue
            got = labels[sample].long()
            off = ((got != want) & ~near_tie).float().mean().item() * 100 if mode != "mma" else float("nan")
            row.update(ms=ms, tflops=flops / ms / 1e9, off_percent=off, **info)
            results.append(row)
            print(f"{dtype_name:5} {mode:8} {bn:>4}x{bk:<5} {warps:>2} {stages:>2} {ms:8.3f} {flops / ms / 1e9:8.1f} "
                  f"{off:6.3f} {info['wait0']:>5} {info['wait_other']:>5} {info['registers']!s:>5} "
                  f"{info['spills']!s:>5} {info['shared']!s:>7}")
            for line in info["ptxas_warnings"]:
                print("      ptxas:", line[:200])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
