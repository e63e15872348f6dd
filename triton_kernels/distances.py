"""Squared distances computed from the differences (no expansion).

``sq_distances``: k-means++ adds one centroid at a time and needs, for a handful of candidates,
the distance of every row to each: an (n, m) output with m small. One program reads BLOCK_N rows
(once from memory, then from cache for each point) and writes their m distances.

``labelled_sq_distances``: each row's distance to the one centroid a label names, which a fit
relocating empty clusters ranks rows by. One read of the rows; the centroid rows it gathers stay
in cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import launcher, transform_rows

__all__ = ["labelled_sq_distances", "labelled_sq_distances_reference", "sq_distances", "sq_distances_reference"]


@triton.jit
def _sq_distances_kernel(
    x_ptr, p_ptr, offset_ptr, scale_ptr, out_ptr,
    n, m, d, stride_xn, stride_xd,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else row_mask.to(tl.float32)
    for j in range(m):
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            dim_mask = dims < d
            xr = transform_rows(
                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
            p = tl.load(p_ptr + j * d + dims, mask=dim_mask, other=0.0)
            diff = tl.where(dim_mask[None, :], xr - p[None, :], 0.0)
            acc += tl.sum(diff * diff, axis=1)
        tl.store(out_ptr + rows * m + j, acc, mask=row_mask)


@triton.jit
def _labelled_sq_distances_kernel(
    x_ptr, c_ptr, labels_ptr, offset_ptr, scale_ptr, out_ptr,
    n, d, stride_xn, stride_xd,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else row_mask.to(tl.float32)
    own = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dim_mask = dims < d
        tile_mask = row_mask[:, None] & dim_mask[None, :]
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=tile_mask, other=0.0),
            row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
        c = tl.load(c_ptr + own[:, None] * d + dims[None, :], mask=tile_mask, other=0.0)
        diff = xr - c
        acc += tl.sum(diff * diff, axis=1)
    tl.store(out_ptr + rows, acc, mask=row_mask)


def labelled_sq_distances(
    x: torch.Tensor,
    centroids: torch.Tensor,
    labels: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """(n,) float32 ``||(x_i - offset) * row_scale_i - centroids[labels_i]||^2`` (into ``out``, where given).

    ``labels`` int32 or int64, each in ``[0, k)`` (not checked: a wrong label reads out of bounds).
    """
    if x.dim() != 2 or centroids.dim() != 2 or x.shape[1] != centroids.shape[1]:
        raise ValueError(f"expected x (n, d) and centroids (k, d), got {tuple(x.shape)} and {tuple(centroids.shape)}")
    if labels.shape != (x.shape[0],):
        raise ValueError(f"expected labels ({x.shape[0]},), got {tuple(labels.shape)}")
    n, d = x.shape
    c = centroids.to(torch.float32).contiguous()
    if out is None:
        out = torch.empty(n, dtype=torch.float32, device=x.device)
    elif out.shape != (n,) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of shape ({n},)")
    if n == 0:
        return out
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    # 4K elements a program over eight warps (16 a thread from the rows, 16 from the centroids): at
    # 8K over four warps a d = 128 program took 254 registers (Triton 3.6, sm_90), for a pass that
    # only streams the rows.
    block_n = max(16, min(128, 4096 // block_d))
    launcher(_labelled_sq_distances_kernel)[(triton.cdiv(n, block_n),)](
        x, c, labels.contiguous(),
        offset.to(torch.float32).contiguous() if offset is not None else c,
        row_scale if row_scale is not None else c,
        out, n, d, x.stride(0), x.stride(1),
        BLOCK_N=block_n, BLOCK_D=block_d, HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None,
        num_warps=8,
    )
    return out


def _rows_reference(x, offset, row_scale) -> torch.Tensor:
    """The rows as the kernels transform them, ``(x - offset) * row_scale``, in float64."""
    rows = x.double()
    if offset is not None:
        rows = rows - offset.double()
    if row_scale is not None:
        rows = rows * row_scale.double()[:, None]
    return rows


def labelled_sq_distances_reference(x, centroids, labels, *, offset=None, row_scale=None) -> torch.Tensor:
    """Pure-torch reference (float64, returned as float32)."""
    rows = _rows_reference(x, offset, row_scale)
    return ((rows - centroids.double()[labels.long()]) ** 2).sum(-1).float()


def sq_distances(
    x: torch.Tensor,
    points: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """(n, m) float32 ``||(x_i - offset) * row_scale_i - p_j||^2``."""
    if x.dim() != 2 or points.dim() != 2 or x.shape[1] != points.shape[1]:
        raise ValueError(f"expected x (n, d) and points (m, d), got {tuple(x.shape)} and {tuple(points.shape)}")
    n, d = x.shape
    m = points.shape[0]
    p = points.to(torch.float32).contiguous()
    out = torch.empty(n, m, dtype=torch.float32, device=x.device)
    if n == 0 or m == 0:
        return out
    block_n = 128
    launcher(_sq_distances_kernel)[(triton.cdiv(n, block_n),)](
        x, p,
        offset.to(torch.float32).contiguous() if offset is not None else p,
        row_scale if row_scale is not None else p,
        out, n, m, d, x.stride(0), x.stride(1),
        BLOCK_N=block_n, BLOCK_D=min(64, max(16, triton.next_power_of_2(d))),
        HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None,
    )
    return out


def sq_distances_reference(x, points, *, offset=None, row_scale=None) -> torch.Tensor:
    """Pure-torch reference (float64, returned as float32)."""
    rows = _rows_reference(x, offset, row_scale)
    return ((rows[:, None, :] - points.double()[None, :, :]) ** 2).sum(-1).float()
