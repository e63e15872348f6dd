"""Where the search's time goes at GEMM-sized workloads: stand-alone search kernels, timed side by side.

The fused pass of ``triton_kernels/assign.py`` carries many features; these kernels keep only the
search (scores on the tensor cores, running argmin) so that tile shapes and the orientation of the
product can be compared with the GEMM alone (no argmin) and with cuBLAS on the same shapes:

- ``rows``: a row tile (BN x d) stays resident, centroid tiles (BK x d) stream: acc (BN, BK).
- ``swap``: the product transposed, centroid tiles as the left operand and the resident row tile
  as the right one: acc (BK, BN), reduced over the centroid axis (per column: no cross-thread
  reductions until the end).
- ``epi``: ``lazy`` per-element running minimum and tile index (reduced once at the end), ``eager``
  per-row minimum and index after every tile, ``none`` a running minimum only (no index: the GEMM
  plus the cheapest epilogue, a lower bound).

    python scripts/diag_search.py [--n 1000000] [--d 128] [--k 4096] [--dtypes float32 bfloat16]

Every variant's labels are checked against torch (agreement outside near-ties) before it is timed.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl


@triton.jit
def _search_kernel(x_ptr, c_ptr, bias_ptr, labels_ptr, n, k,
                   D: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr, EPI: tl.constexpr,
                   PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BN + tl.arange(0, BN)
    row_mask = rows < n
    dims = tl.arange(0, D)
    tile = tl.arange(0, BK)
    if SWAP:
        xt = tl.load(x_ptr + rows[None, :] * D + dims[:, None], mask=row_mask[None, :], other=0.0)
        best_t = tl.full((BK, BN), float("inf"), tl.float32)
        idx_t = tl.zeros((BK, BN), tl.int32)
    else:
        xr = tl.load(x_ptr + rows[:, None] * D + dims[None, :], mask=row_mask[:, None], other=0.0)
        if EPI == 1:
            best = tl.full((BN,), float("inf"), tl.float32)
            label = tl.zeros((BN,), tl.int32)
        else:
            best_t = tl.full((BN, BK), float("inf"), tl.float32)
            idx_t = tl.zeros((BN, BK), tl.int32)
    for k0 in range(0, k, BK):
        cols = k0 + tile
        col_mask = cols < k
        bias = tl.load(bias_ptr + cols, mask=col_mask, other=float("inf"))
        c = tl.load(c_ptr + cols[:, None].to(tl.int64) * D + dims[None, :], mask=col_mask[:, None], other=0.0)
        if SWAP:
            acc = tl.dot(c, xt, tl.zeros((BK, BN), tl.float32) + bias[:, None], input_precision=PRECISION)
            if EPI == 2:
                best_t = tl.minimum(best_t, acc)
            else:
                better = acc < best_t
                best_t = tl.where(better, acc, best_t)
                idx_t = tl.where(better, k0, idx_t)
        else:
            acc = tl.dot(xr, tl.trans(c), tl.zeros((BN, BK), tl.float32) + bias[None, :], input_precision=PRECISION)
            if EPI == 1:
                m = tl.min(acc, axis=1)
                j = tl.min(tl.where(acc == m[:, None], tile[None, :], BK), axis=1)
                better = m < best
                best = tl.where(better, m, best)
                label = tl.where(better, k0 + j, label)
            elif EPI == 2:
                best_t = tl.minimum(best_t, acc)
            else:
                better = acc < best_t
                best_t = tl.where(better, acc, best_t)
                idx_t = tl.where(better, k0, idx_t)
    if SWAP:
        best = tl.min(best_t, axis=0)
        if EPI == 2:
            label = tl.min(tl.where(best_t == best[None, :], tile[:, None], BK), axis=0)
        else:
            label = tl.min(tl.where(best_t == best[None, :], idx_t + tile[:, None], 2147483647), axis=0)
    elif EPI != 1:
        best = tl.min(best_t, axis=1)
        if EPI == 2:
            label = tl.min(tl.where(best_t == best[:, None], tile[None, :], BK), axis=1)
        else:
            label = tl.min(tl.where(best_t == best[:, None], idx_t + tile[None, :], 2147483647), axis=1)
    tl.store(labels_ptr + rows, label, mask=row_mask)


def search(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, *, bn: int, bk: int, swap: bool, epi: str,
           warps: int = 8, stages: int = 2) -> torch.Tensor:
    """Labels of the rows of ``x`` (n, d), d a power of two >= 16, under scores ``bias + x @ c_mma.T``."""
    n, d = x.shape
    labels = torch.empty(n, dtype=torch.int32, device=x.device)
    _search_kernel[(triton.cdiv(n, bn),)](
        x, c_mma, bias, labels, n, c_mma.shape[0], D=d, BN=bn, BK=bk, SWAP=swap,
        EPI={"lazy": 0, "eager": 1, "none": 2}[epi], PRECISION="tf32" if x.dtype == torch.float32 else "ieee",
        num_warps=warps, num_stages=stages)
    return labels


def operands(c: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor-core operands: -2 c in x's dtype, and ||c||^2, so the product is the score."""
    return (-2.0 * c).to(dtype).contiguous(), c.pow(2).sum(1).contiguous()


VARIANTS = [  # (bn, bk, swap, epi, warps, stages)
    (128, 128, False, "lazy", 8, 2), (128, 128, False, "eager", 8, 2), (128, 128, False, "none", 8, 2),
    (128, 64, False, "lazy", 4, 3), (128, 64, False, "eager", 4, 3),
    (256, 64, False, "eager", 8, 2), (256, 128, False, "eager", 8, 2), (128, 256, False, "eager", 8, 2),
    (256, 64, True, "lazy", 8, 2), (256, 64, True, "none", 8, 2), (128, 64, True, "lazy", 4, 2),
    (128, 128, True, "lazy", 8, 2), (256, 128, True, "lazy", 8, 2), (256, 128, True, "none", 8, 2),
    (256, 64, True, "lazy", 8, 3),
]


def main() -> None:
    from triton.testing import do_bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    n, d, k = args.n, args.d, args.k
    x32 = torch.randn(n, d, device="cuda")
    c = x32[torch.randperm(n, device="cuda")[:k]].clone()
    out = {"n": n, "d": d, "k": k, "device": torch.cuda.get_device_name(), "rows": []}
    for name in args.dtypes:
        dtype = getattr(torch, name)
        x = x32.to(dtype)
        c_mma, bias = operands(c, dtype)
        # cuBLAS on the same product, in slices so the scores fit memory: the GEMM's own rate.
        torch.backends.cuda.matmul.allow_tf32 = True
        s = 1 << 17
        score = torch.empty(s, k, device="cuda", dtype=torch.float32 if dtype == torch.float32 else dtype)
        def product(x=x, c_mma=c_mma, score=score, s=s):
            for i in range(0, n, s):
                torch.mm(x[i:i + s], c_mma.T, out=score[: min(s, n - i)])

        gemm_ms = do_bench(product, rep=100, return_mode="median")
        flops = 2.0 * n * k * d
        print(f"{name}: cuBLAS product in slices {gemm_ms:.3f} ms ({flops / gemm_ms / 1e9:.0f} TFLOP/s)", flush=True)
        out["rows"].append({"dtype": name, "variant": "cublas_mm", "ms": gemm_ms})
        sample = torch.randperm(n, device="cuda")[:4096]
        ref_scores = bias[None, :].double() + x[sample].double() @ c_mma.double().T
        ref = ref_scores.argmin(1)
        top2 = ref_scores.topk(2, dim=1, largest=False).values
        near_tie = (top2[:, 1] - top2[:, 0]) <= 1e-2 * ref_scores.abs().max()
        for bn, bk, swap, epi, warps, stages in VARIANTS:
            tag = f"{'swap' if swap else 'rows'} bn={bn} bk={bk} {epi} w={warps} s={stages}"
            try:
                labels = search(x, c_mma, bias, bn=bn, bk=bk, swap=swap, epi=epi, warps=warps, stages=stages)
                torch.cuda.synchronize()
                off = ((labels[sample].long() != ref) & ~near_tie).float().mean().item()
                kw = {"bn": bn, "bk": bk, "swap": swap, "epi": epi, "warps": warps, "stages": stages}
                t = do_bench(lambda x=x, c_mma=c_mma, bias=bias, kw=kw: search(x, c_mma, bias, **kw), rep=100,
                             return_mode="median")
            except Exception as e:  # noqa: BLE001 - out of resources: not a candidate
                print(f"{name} {tag}: {type(e).__name__} {str(e)[:120]}", flush=True)
                continue
            print(f"{name} {tag}: {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s) off={100 * off:.3f}%", flush=True)
            out["rows"].append({"dtype": name, "variant": tag, "ms": t, "off_pct": 100 * off})
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
