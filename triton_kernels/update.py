"""Centroid update: per-cluster (weighted) sums of the rows and per-cluster total weight, in fp32.

Two kernels behind one ``update``:
  default             one pass over the rows with atomics; a tile's rows are first reduced through
                      a one-hot product when k is small, so k = 2..64 does not serialise on atomics.
                      Fast; the fp32 summation order (and so the last bits) varies between runs.
  deterministic=True  rows are ordered by label (a stable sort), and one program per (cluster,
                      feature chunk) sums its segment in a fixed order (seed 002's sorted,
                      segmented reduction). Bit-identical reruns.
The fused assignment kernel (``assign(..., sums=, counts=)``) does the first while it reads x anyway.
``float64_sums`` (with ``float64_sums_reference`` in torch) takes the same sums in float64, for the
bounds engine and dense Lloyd's float64 moves (``configs.dense_moves``), whose later passes only
move the rows that change cluster from that base.
Rows are read transformed, ``(x - offset) * row_scale``, as in the assignment kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    UPDATE_ATOMIC,
    UPDATE_ONEHOT,
    accumulate_rows,
    launcher,
    onehot_max_k,
    onehot_width,
    transform_rows,
)
from .configs import float64_replicas, update_config

__all__ = ["float64_sums", "float64_sums_reference", "move_rows_to_clusters", "move_rows_to_clusters_reference",
           "update", "update_reference"]


@triton.jit
def _scatter_kernel(
    x_ptr, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr,
    n, k, d, stride_xn, stride_xd,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KP: tl.constexpr, MODE: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    w = tl.load(weight_ptr + rows, mask=row_mask, other=0.0) if HAS_WEIGHT else row_mask.to(tl.float32)
    scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else w
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dim_mask = dims < d
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
            row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
        accumulate_rows(sums_ptr, counts_ptr, labels, w, row_mask, xr, dims, dim_mask, d0 == 0, k, d, KP, MODE)


@triton.jit
def _segment_sum_kernel(
    x_ptr, order_ptr, starts_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr,
    d, stride_xn, stride_xd,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    cluster = tl.program_id(0).to(tl.int64)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dim_mask = dims < d
    start = tl.load(starts_ptr + cluster)
    stop = tl.load(starts_ptr + cluster + 1)
    acc = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    w_acc = tl.zeros((BLOCK_N,), tl.float32)
    for s in range(start, stop, BLOCK_N):
        slots = s + tl.arange(0, BLOCK_N)
        live = slots < stop
        rows = tl.load(order_ptr + slots, mask=live, other=0).to(tl.int64)
        w = tl.load(weight_ptr + rows, mask=live, other=0.0) if HAS_WEIGHT else live.to(tl.float32)
        scale = tl.load(scale_ptr + rows, mask=live, other=1.0) if HAS_SCALE else w
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=live[:, None] & dim_mask[None, :], other=0.0),
            live, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
        acc += xr * w[:, None]
        w_acc += w
    tl.store(sums_ptr + cluster * d + dims, tl.sum(acc, axis=0), mask=dim_mask)
    if tl.program_id(1) == 0:
        tl.store(counts_ptr + cluster, tl.sum(w_acc, axis=0))


@triton.jit
def _float64_sums_kernel(
    x_ptr, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr,
    n, k, d, stride_xn, stride_xd, replicas,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """A (rows x features) tile added into float64 ``sums`` and ``counts`` by its labels, each
    element by its own atomic, into copy ``program % replicas`` ((replicas, k, d) and (replicas,
    k)); rows labelled < 0 are left out. A row's value is the fp32 ``(x - offset) * row_scale * w``
    the passes' moves add and take away (``_common.move_rows``), in float64 from there."""
    copy = (tl.program_id(0) % replicas).to(tl.int64)
    sums_ptr += copy * k * d
    counts_ptr += copy * k
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    labels = tl.load(labels_ptr + rows, mask=rows < n, other=-1).to(tl.int64)
    row_mask = (rows < n) & (labels >= 0)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dim_mask = dims < d
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    else:
        w = row_mask.to(tl.float32)
    scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else w
    mask = row_mask[:, None] & dim_mask[None, :]
    xr = transform_rows(tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=mask, other=0.0),
                        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale,
                        HAS_OFFSET, HAS_SCALE)
    tl.atomic_add(sums_ptr + labels[:, None] * d + dims[None, :], (xr * w[:, None]).to(tl.float64), mask=mask,
                  sem="relaxed")
    if tl.program_id(1) == 0:
        tl.atomic_add(counts_ptr + labels, w.to(tl.float64), mask=row_mask, sem="relaxed")


@triton.jit
def _move_rows_kernel(
    x_ptr, rows_ptr, clusters_ptr, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr,
    d, stride_xn, stride_xd,
    BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """Program i: row ``rows[i]`` (transformed, times its weight) leaves its labelled cluster's sums
    and count (atomics: several rows may leave one cluster) and becomes the whole of cluster
    ``clusters[i]`` (a plain store: the targets are distinct and no moved row is labelled with
    one); nothing where ``clusters[i]`` < 0."""
    target = tl.load(clusters_ptr + tl.program_id(0)).to(tl.int64)
    if target >= 0:
        row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
        old = tl.load(labels_ptr + row).to(tl.int64)
        single = tl.zeros((1,), tl.int64)  # a one-element axis, for the vector loads and atomics
        w = tl.load(weight_ptr + row + single).to(tl.float32) if HAS_WEIGHT else tl.full((1,), 1.0, tl.float32)
        scale = tl.load(scale_ptr + row + single) if HAS_SCALE else w
        tl.atomic_add(counts_ptr + old + single, -w, sem="relaxed")
        tl.store(counts_ptr + target + single, w)
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            dim_mask = dims < d
            live = single == 0
            xr = transform_rows(
                tl.load(x_ptr + (row + single)[:, None] * stride_xn + dims[None, :] * stride_xd,
                        mask=dim_mask[None, :], other=0.0),
                live, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
            moved = xr * w[:, None]
            tl.atomic_add(sums_ptr + (old + single)[:, None] * d + dims[None, :], -moved, mask=dim_mask[None, :],
                          sem="relaxed")
            tl.store(sums_ptr + (target + single)[:, None] * d + dims[None, :], moved, mask=dim_mask[None, :])


def move_rows_to_clusters(
    x: torch.Tensor,
    rows: torch.Tensor,
    clusters: torch.Tensor,
    labels: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> None:
    """An empty-cluster relocation's change to the sums, in one launch and in place: each row
    ``rows[i]`` (transformed as the kernels read it, times its weight) leaves the sums and count of
    its cluster ``labels[rows[i]]`` and is all that cluster ``clusters[i]`` then holds; pairs whose
    cluster is negative are skipped (``torch.nonzero_static``'s padding). The clusters must be
    distinct, and none the label of a moved row of positive weight (they are empty). ``sums``
    (k, d) and ``counts`` (k,) float32; the labels are not changed (the next pass moves the rows).

    What scikit-learn's relocation does to the sums; in torch it is about a dozen launches
    (``move_rows_to_clusters_reference``), each a few microseconds of host time in a fit's loop."""
    if rows.shape != clusters.shape or rows.dim() != 1:
        raise ValueError("rows and clusters must be 1-D tensors of the same length")
    if sums.dtype != torch.float32 or counts.dtype != torch.float32:
        raise ValueError("sums and counts must be float32")
    if rows.numel() == 0:
        return
    d = x.shape[1]
    transform = _transform_args(x, offset, row_scale, sample_weight, counts)
    launcher(_move_rows_kernel)[(rows.numel(),)](
        x, rows, clusters, labels, sums_ptr=sums, counts_ptr=counts, d=d,
        BLOCK_D=min(256, max(16, triton.next_power_of_2(d))), **transform,
    )


def move_rows_to_clusters_reference(
    x: torch.Tensor,
    rows: torch.Tensor,
    clusters: torch.Tensor,
    labels: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> None:
    """Pure-torch reference of ``move_rows_to_clusters`` (in place)."""
    keep = clusters >= 0
    rows, clusters = rows[keep].long(), clusters[keep].long()
    moved = x[rows].float()
    if offset is not None:
        moved = moved - offset.float()
    if row_scale is not None:
        moved = moved * row_scale[rows, None]
    w = torch.ones(rows.numel(), dtype=torch.float32, device=x.device) if sample_weight is None \
        else sample_weight[rows].float()
    moved = moved * w[:, None]
    old = labels[rows].long()
    sums.index_add_(0, old, -moved)
    counts.index_add_(0, old, -w)
    sums[clusters] = moved
    counts[clusters] = w


def _transform_args(x, offset, row_scale, sample_weight, dummy):
    return dict(
        weight_ptr=dummy if sample_weight is None else sample_weight,
        offset_ptr=dummy if offset is None else offset.to(torch.float32).contiguous(),
        scale_ptr=dummy if row_scale is None else row_scale,
        stride_xn=x.stride(0), stride_xd=x.stride(1),
        HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None, HAS_WEIGHT=sample_weight is not None,
    )


def update(
    x: torch.Tensor,
    labels: torch.Tensor,
    n_clusters: int,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sums (k, d) float32, counts (k,) float32)`` of the transformed rows per label.

    ``deterministic=False``: atomics (last bits vary between runs); ``True``: a stable sort by
    label, then a fixed-order sum per segment (bit-identical reruns).
    """
    if x.dim() != 2:
        raise ValueError(f"x must be (n, d), got shape {tuple(x.shape)}")
    if labels.shape != (x.shape[0],) or labels.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"labels must be int32/int64 of shape ({x.shape[0]},)")
    if n_clusters < 1:
        raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
    n, d = x.shape
    sums = torch.zeros(n_clusters, d, dtype=torch.float32, device=x.device)
    counts = torch.zeros(n_clusters, dtype=torch.float32, device=x.device)
    if n == 0:
        return sums, counts
    cfg = update_config(d)
    transform = _transform_args(x, offset, row_scale, sample_weight, counts)
    if deterministic:
        sorted_labels, order = torch.sort(labels, stable=True)
        bounds = torch.arange(n_clusters + 1, device=x.device, dtype=sorted_labels.dtype)
        starts = torch.searchsorted(sorted_labels, bounds)
        launcher(_segment_sum_kernel)[(n_clusters, triton.cdiv(d, cfg["BLOCK_D"]))](
            x, order, starts, sums_ptr=sums, counts_ptr=counts, d=d, **transform, **cfg,
        )
        return sums, counts
    mode = UPDATE_ONEHOT if n_clusters <= onehot_max_k(d) else UPDATE_ATOMIC
    launcher(_scatter_kernel)[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, labels, sums_ptr=sums, counts_ptr=counts, n=n, k=n_clusters, d=d,
        KP=onehot_width(n_clusters) if mode == UPDATE_ONEHOT else 16, MODE=mode, **transform, **cfg,
    )
    return sums, counts


def _float64_out(out, n_clusters: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's float64 ``(sums, counts)``, or new ones."""
    if out is not None:
        return out
    return (torch.empty(n_clusters, d, dtype=torch.float64, device=device),
            torch.empty(n_clusters, dtype=torch.float64, device=device))


def float64_sums(
    x: torch.Tensor,
    labels: torch.Tensor,
    n_clusters: int,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cluster sums and counts (total weights) of the rows as the kernels transform them,
    ``(x - offset) * row_scale`` times the weight (in fp32, as the passes' moves take each row, so
    that such a base and later moves cancel exactly), added in float64: one launch of float64
    atomics into ``configs.float64_replicas`` copies, then their sum; no float64 copy of the rows
    (``float64_sums_reference``: about ten torch launches a chunk of 16 MB). Rows labelled < 0 are
    left out. The order of the additions varies between runs, in float64, where it rounds: sums of
    fp32 values of similar size come out exact, in any order.

    ``out``: float64 ``(sums, counts)`` to write into (e.g. buffers a CUDA graph replays)."""
    n, d = x.shape
    sums, counts = _float64_out(out, n_clusters, d, x.device)
    replicas = float64_replicas(n_clusters, d) if n > 0 else 1
    if replicas > 1:
        copies = torch.zeros(replicas * n_clusters * (d + 1), dtype=torch.float64, device=x.device)
        copy_sums, copy_counts = copies[:replicas * n_clusters * d], copies[replicas * n_clusters * d:]
    else:
        sums.zero_()
        counts.zero_()
        copy_sums, copy_counts = sums, counts
    if n > 0:
        cfg = update_config(d)
        transform = _transform_args(x, offset, row_scale, sample_weight, counts)
        launcher(_float64_sums_kernel)[(triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(d, cfg["BLOCK_D"]))](
            x, labels, sums_ptr=copy_sums, counts_ptr=copy_counts, n=n, k=n_clusters, d=d, replicas=replicas,
            **transform, **cfg,
        )
    if replicas > 1:
        torch.sum(copy_sums.view(replicas, n_clusters, d), 0, out=sums)
        torch.sum(copy_counts.view(replicas, n_clusters), 0, out=counts)
    return sums, counts


def float64_sums_reference(
    x: torch.Tensor,
    labels: torch.Tensor,
    n_clusters: int,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference of ``float64_sums``: the rows transformed in fp32, then float64, in
    chunks of at most 16 MB."""
    n, d = x.shape
    sums, counts = _float64_out(out, n_clusters, d, x.device)
    sums.zero_()
    counts.zero_()
    shift = None if offset is None else offset.float()
    chunk = max(1, (1 << 21) // max(1, d))
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        lab = labels[start:end].long()
        kept = lab >= 0
        rows = x[start:end].float()
        if shift is not None:
            rows = rows - shift
        if row_scale is not None:
            rows = rows * row_scale[start:end, None].float()
        if sample_weight is not None:
            w = sample_weight[start:end].float()
            rows = rows * w[:, None]
        else:
            w = torch.ones(end - start, dtype=torch.float32, device=x.device)
        sums.index_add_(0, lab[kept], rows[kept].double())
        counts.index_add_(0, lab[kept], w[kept].double())
    return sums, counts


def update_reference(
    x: torch.Tensor,
    labels: torch.Tensor,
    n_clusters: int,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference (float64 sums, returned as float32)."""
    sums, counts = float64_sums_reference(x, labels, n_clusters, sample_weight=sample_weight, offset=offset,
                                          row_scale=row_scale)
    return sums.float(), counts.float()
