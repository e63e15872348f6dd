"""Fused distance + argmin: the nearest centroid of every row, never an n x k matrix in memory.

One program owns BLOCK_N rows, streams centroid tiles of BLOCK_K through ``tl.dot`` (tensor
cores), loops over the features in BLOCK_D chunks, and keeps a running best score, its index and
(optionally) the second-best score in registers. The score of centroid j is ``||c_j||^2 - 2 x.c_j``:
the squared distance minus ``||x||^2``, which does not change the argmin. Ties go to the lowest
index, as in numpy, faiss and scikit-learn.

Precision: fp16/bf16 inputs run natively with fp32 accumulation. For fp32 inputs,
``input_precision="ieee"`` gives fp32 products (the oracle's arithmetic, slow on tensor cores) and
``"tf32"`` the tensor-core rate with ~5e-4 relative error per product; the second-best score lets a
caller find the rows whose best-two gap is within that error and re-check them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["assign", "assign_reference"]


@triton.jit
def _assign_kernel(
    # pointers
    x_ptr, c_ptr, c_sq_ptr, labels_ptr, best_ptr, second_ptr,
    # sizes
    n, k, d,
    # strides
    stride_xn, stride_xd, stride_ck, stride_cd,
    # meta-parameters
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    WITH_SECOND: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    # 64-bit row offsets: n * stride can pass 2^31 elements.
    rows = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    best = tl.full((BLOCK_N,), float("inf"), tl.float32)
    second = tl.full((BLOCK_N,), float("inf"), tl.float32)
    best_idx = tl.zeros((BLOCK_N,), tl.int64)
    tile_cols = tl.arange(0, BLOCK_K)
    for k0 in range(0, k, BLOCK_K):
        cols = k0 + tile_cols
        col_mask = cols < k
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            dim_mask = dims < d
            x_tile = tl.load(
                x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0,
            )
            c_tile = tl.load(
                c_ptr + cols[:, None].to(tl.int64) * stride_ck + dims[None, :] * stride_cd,
                mask=col_mask[:, None] & dim_mask[None, :], other=0.0,
            )
            acc = tl.dot(x_tile, tl.trans(c_tile), acc, input_precision=INPUT_PRECISION)
        c_sq = tl.load(c_sq_ptr + cols, mask=col_mask, other=0.0)
        scores = tl.where(col_mask[None, :], c_sq[None, :] - 2.0 * acc, float("inf"))
        tile_best = tl.min(scores, axis=1)
        tile_arg = tl.argmin(scores, axis=1, tie_break_left=True)
        if WITH_SECOND:
            others = tl.where(tile_cols[None, :] == tile_arg[:, None], float("inf"), scores)
            # The second best of old-and-tile candidates: the better of the two seconds and the
            # worse of the two bests.
            second = tl.minimum(tl.minimum(second, tl.min(others, axis=1)), tl.maximum(best, tile_best))
        # Strictly better only: an equal score in a later tile keeps the lower index.
        better = tile_best < best
        best_idx = tl.where(better, k0 + tile_arg.to(tl.int64), best_idx)
        best = tl.where(better, tile_best, best)
    tl.store(labels_ptr + rows, best_idx, mask=row_mask)
    tl.store(best_ptr + rows, best, mask=row_mask)
    if WITH_SECOND:
        tl.store(second_ptr + rows, second, mask=row_mask)


def _block_d(d: int) -> int:
    return min(64, max(16, triton.next_power_of_2(d)))


def assign(
    x: torch.Tensor,
    centroids: torch.Tensor,
    *,
    with_second: bool = False,
    input_precision: str = "ieee",
    block_n: int = 64,
    block_k: int = 64,
    block_d: int | None = None,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Nearest centroid of each row of ``x`` (n, d) among ``centroids`` (k, d).

    ``centroids`` are cast to ``x``'s dtype (fp16/bf16 inputs multiply in that dtype); squared
    norms of the cast centroids are taken in fp32. Returns ``(labels int64, best fp32, second fp32 or
    None)`` where ``best``/``second`` are scores ``||c||^2 - 2 x.c``; add ``||x||^2`` for distances.
    """
    if x.dim() != 2 or centroids.dim() != 2 or x.shape[1] != centroids.shape[1]:
        raise ValueError(f"expected x (n, d) and centroids (k, d), got {tuple(x.shape)} and {tuple(centroids.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.device != centroids.device:
        raise ValueError(f"x is on {x.device} but centroids are on {centroids.device}")
    if input_precision not in ("ieee", "tf32"):
        raise ValueError(f"input_precision must be 'ieee' or 'tf32', got {input_precision!r}")
    n, d = x.shape
    k = centroids.shape[0]
    c = centroids.to(x.dtype).contiguous()
    c_sq = c.float().pow(2).sum(1)
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    best = torch.empty(n, dtype=torch.float32, device=x.device)
    second = torch.empty(n, dtype=torch.float32, device=x.device) if with_second else best
    if n == 0 or k == 0:
        return labels, best, (second if with_second else None)
    grid = (triton.cdiv(n, block_n),)
    _assign_kernel[grid](
        x, c, c_sq, labels, best, second,
        n, k, d,
        x.stride(0), x.stride(1), c.stride(0), c.stride(1),
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d or _block_d(d),
        WITH_SECOND=with_second, INPUT_PRECISION=input_precision,
        num_warps=num_warps,
    )
    return labels, best, (second if with_second else None)


def assign_reference(x: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch reference of :func:`assign` (float64 scores of the same cast inputs; small sizes only)."""
    c = centroids.to(x.dtype).double()
    scores = c.pow(2).sum(1)[None, :] - 2.0 * x.double() @ c.T
    top = torch.topk(scores, min(2, scores.shape[1]), dim=1, largest=False, sorted=True)
    labels = scores.argmin(1)  # argmin: first index on ties, like the kernel
    second = top.values[:, 1] if scores.shape[1] > 1 else torch.full_like(top.values[:, 0], float("inf"))
    return labels, top.values[:, 0], second
