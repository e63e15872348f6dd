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
move the rows that change cluster from that base. ``relocate_to_farthest`` applies scikit-learn's
empty-cluster relocation to the sums on the device (``move_rows_to_clusters`` for given pairs).
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
from .configs import float64_replicas, num_persistent_programs, update_config

__all__ = ["RELOCATE_MAX", "add_sorted_sums", "farthest_keys_reference", "float64_sums", "float64_sums_reference", "move_rows_to_clusters",
           "move_rows_to_clusters_reference", "relocate_to_farthest", "relocate_to_farthest_reference", "update",
           "update_reference"]


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
def _run_add(first_a, sum_a, first_b, sum_b):
    # A segmented sum's combine: a run restarts at a row flagged first.
    return first_a | first_b, tl.where(first_b, sum_b, sum_a + sum_b)


@triton.jit
def _sorted_sums_kernel(
    x_ptr, order_ptr, sorted_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr, control_ptr,
    n, d, stride_xn, stride_xd,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_CONTROL: tl.constexpr,
):
    """Program (i, j): the i-th block of BLOCK_N rows in label order (``order``, their labels
    ``sorted``) over features block j, each run of one label within the block summed by a segmented
    scan and added into its cluster's sums by one atomic a feature (counts: by the programs of
    feature block 0). Blocks are even whatever the clusters' sizes; a label's run crosses a block
    boundary as two atomics."""
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        ids = tl.arange(0, BLOCK_N)
        slots = tl.program_id(0).to(tl.int64) * BLOCK_N + ids
        live = slots < n
        rows = tl.load(order_ptr + slots, mask=live, other=0).to(tl.int64)
        labels = tl.load(sorted_ptr + slots, mask=live, other=-1).to(tl.int64)
        before = tl.load(sorted_ptr + slots - 1, mask=live & (slots > 0), other=-1).to(tl.int64)
        after = tl.load(sorted_ptr + slots + 1, mask=slots + 1 < n, other=-1).to(tl.int64)
        first = (ids == 0) | (labels != before)
        last = live & ((ids == BLOCK_N - 1) | (labels != after))
        w = tl.load(weight_ptr + rows, mask=live, other=0.0).to(tl.float32) if HAS_WEIGHT else live.to(tl.float32)
        scale = tl.load(scale_ptr + rows, mask=live, other=1.0) if HAS_SCALE else w
        dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        dim_mask = dims < d
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=live[:, None] & dim_mask[None, :],
                    other=0.0),
            live, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
        firsts = first[:, None] & (dims[None, :] >= 0)
        # (Named flags, not ``_``: Triton 3.6 rejects a name rebound to another shape in the branch.)
        row_flags, runs = tl.associative_scan((firsts, xr * w[:, None]), 0, _run_add)
        tl.atomic_add(sums_ptr + labels[:, None] * d + dims[None, :], runs, mask=last[:, None] & dim_mask[None, :],
                      sem="relaxed")
        if tl.program_id(1) == 0:
            count_flags, w_runs = tl.associative_scan((first, w), 0, _run_add)
            tl.atomic_add(counts_ptr + labels, w_runs, mask=last, sem="relaxed")


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
def _move_row(
    x_ptr, row, target, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr, d, stride_xn, stride_xd,
    BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """Row ``row`` (int64; transformed, times its weight) leaves its labelled cluster's sums and
    count (atomics: several rows may leave one cluster) and becomes the whole of cluster ``target``
    (a plain store: the targets are distinct and no moved row of positive weight is labelled with one)."""
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


@triton.jit
def _move_rows_kernel(
    x_ptr, rows_ptr, clusters_ptr, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr,
    d, stride_xn, stride_xd,
    BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """Program i: row ``rows[i]`` moves into cluster ``clusters[i]`` (``_move_row``); nothing where
    ``clusters[i]`` < 0."""
    target = tl.load(clusters_ptr + tl.program_id(0)).to(tl.int64)
    if target >= 0:
        row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
        _move_row(x_ptr, row, target, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr, d,
                  stride_xn, stride_xd, BLOCK_D, HAS_OFFSET, HAS_SCALE, HAS_WEIGHT)


@triton.jit
def _far_keys(scores_ptr, weight_ptr, rows, n, HAS_WEIGHT: tl.constexpr):
    """``farthest_keys_reference`` of ``rows`` (int64); -1 past ``n``."""
    live = rows < n
    s = tl.load(scores_ptr + rows, mask=live, other=0.0).to(tl.float32)
    level = tl.where(s > 0, s.to(tl.int32, bitcast=True), 0).to(tl.int64) + 1
    if HAS_WEIGHT:
        level = tl.where(tl.load(weight_ptr + rows, mask=live, other=0.0) > 0, level, 0)
    # (level << 32) | (2^32 - 1 - row): no literal of 32 bits (Triton would type it uint32)
    return tl.where(live, ((level + 1) << 32) - 1 - rows, -1)


@triton.jit
def _merge_largest(best, keys, M: tl.constexpr):
    """The ``M`` largest of the distinct keys ``best`` (M) and ``keys`` (any length), largest first
    (-1: none); both sets hold distinct keys, -1 pads."""
    slots = tl.arange(0, M)
    merged = tl.full((M,), -1, tl.int64)
    for j in range(M):
        top = tl.maximum(tl.max(best, axis=0), tl.max(keys, axis=0))
        merged = tl.where(slots == j, top, merged)
        best = tl.where(best == top, -1, best)
        keys = tl.where(keys == top, -1, keys)
    return merged


@triton.jit
def _farthest_candidates_kernel(
    scores_ptr, weight_ptr, n, cand_ptr, M: tl.constexpr, BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """Program p: the ``M`` largest keys of the rows of chunks p, p + P, ... (P programs) into
    ``cand[p M : (p + 1) M]``, largest first. A chunk whose largest key is below the M-th kept
    one costs one reduction."""
    best = tl.full((M,), -1, tl.int64)
    for chunk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        rows = tl.full((BLOCK,), chunk, tl.int64) * BLOCK + tl.arange(0, BLOCK)  # (64-bit: n may pass 2^31)
        keys = _far_keys(scores_ptr, weight_ptr, rows, n, HAS_WEIGHT)
        if tl.max(keys, axis=0) > tl.min(best, axis=0):
            best = _merge_largest(best, keys, M)
    tl.store(cand_ptr + tl.program_id(0) * M + tl.arange(0, M), best)


@triton.jit
def _relocate_farthest_kernel(
    cand_ptr, n_cand, x_ptr, labels_ptr, weight_ptr, offset_ptr, scale_ptr, sums_ptr, counts_ptr, k, d,
    stride_xn, stride_xd, max_moves,
    M: tl.constexpr, BLOCK_C: tl.constexpr, SCAN_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """One program: the ``M`` largest candidate keys (the farthest rows, farthest first), the first
    ``M`` clusters of no weight (index order), then for i < ``max_moves`` the i-th of those rows
    moves into the i-th of those clusters (``_move_row``)."""
    slots = tl.arange(0, M)
    best = tl.full((M,), -1, tl.int64)
    for c0 in range(0, n_cand, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        keys = tl.load(cand_ptr + offs, mask=offs < n_cand, other=-1)
        if tl.max(keys, axis=0) > tl.min(best, axis=0):
            best = _merge_largest(best, keys, M)
    targets = tl.full((M,), -1, tl.int64)
    found = 0
    # Wide chunks of the counts, and only those holding one of the first M empty clusters ranked
    # in narrow ones: one program reads all k counts.
    for k0 in range(0, k, SCAN_K):
        ids = k0 + tl.arange(0, SCAN_K)
        in_chunk = tl.sum(((tl.load(counts_ptr + ids, mask=ids < k, other=1.0) <= 0) & (ids < k)).to(tl.int32), axis=0)
        if (in_chunk > 0) & (found < M):
            for r0 in range(k0, k0 + SCAN_K, BLOCK_K):
                narrow = r0 + tl.arange(0, BLOCK_K)
                empty = (tl.load(counts_ptr + narrow, mask=narrow < k, other=1.0) <= 0) & (narrow < k)
                rank = found + tl.cumsum(empty.to(tl.int32), axis=0) - 1
                hit = empty[None, :] & (rank[None, :] == slots[:, None])
                targets = tl.where(tl.sum(hit.to(tl.int32), axis=1) > 0,
                                   tl.sum(tl.where(hit, narrow[None, :].to(tl.int64), 0), axis=1), targets)
                found += tl.sum(empty.to(tl.int32), axis=0)
        else:
            found += in_chunk
    # Every program's thread has read the counts before any of them is written.
    tl.debug_barrier()
    for i in range(M):
        target = tl.sum(tl.where(slots == i, targets, 0), axis=0)
        key = tl.sum(tl.where(slots == i, best, 0), axis=0)
        if (target >= 0) & (key >= 0) & (i < max_moves):
            row = (((key >> 32) + 1) << 32) - 1 - key
            _move_row(x_ptr, row, target, labels_ptr, weight_ptr, offset_ptr, scale_ptr,
                      sums_ptr, counts_ptr, d, stride_xn, stride_xd, BLOCK_D, HAS_OFFSET, HAS_SCALE, HAS_WEIGHT)


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


# Clusters the relocation kernels move in one call (``relocate_to_farthest``); more go through torch.topk.
RELOCATE_MAX = 32


def farthest_keys_reference(scores: torch.Tensor, sample_weight: torch.Tensor | None = None) -> torch.Tensor:
    """(n,) int64 keys that rank rows for an empty-cluster relocation: the farthest (largest
    ``scores``, as float32) first, rows of zero weight last, ties to the lower row. The keys are
    distinct, so any top-k of them has one order on every device: ``(level << 32) | (2^32 - 1 - row)``,
    level 0 for rows of zero weight, else 1 + the float32 bits of the score (0 for scores <= 0), which
    order as non-negative floats do."""
    s = scores.to(torch.float32).contiguous()
    level = torch.where(s > 0, s.view(torch.int32), 0).to(torch.int64) + 1
    if sample_weight is not None:
        level = torch.where(sample_weight > 0, level, 0)
    return ((level + 1) << 32) - 1 - torch.arange(s.numel(), device=s.device)


def _farthest_pairs(sq_distances, counts, max_moves, sample_weight):
    """(rows, clusters) of a relocation in torch ops (one host sync: the empty clusters)."""
    keys = farthest_keys_reference(sq_distances, sample_weight)
    rows = torch.topk(keys, min(max_moves, keys.numel())).indices
    clusters = (counts <= 0).nonzero().flatten()[:max_moves]
    count = min(rows.numel(), clusters.numel())
    return rows[:count], clusters[:count]


def _check_relocation(x, sq_distances, labels, sums, counts, max_moves):
    n, d = x.shape
    if sq_distances.shape != (n,) or labels.shape != (n,):
        raise ValueError(f"sq_distances and labels must have shape ({n},)")
    if sums.dim() != 2 or sums.shape[1] != d or counts.shape != sums.shape[:1]:
        raise ValueError(f"sums must be (k, {d}) and counts (k,)")
    if sums.dtype != torch.float32 or counts.dtype != torch.float32:
        raise ValueError("sums and counts must be float32")
    if max_moves < 0:
        raise ValueError(f"max_moves must be >= 0, got {max_moves}")
    if n >= 2**32:
        raise ValueError("the relocation ranks at most 2^32 rows")


def relocate_to_farthest(
    x: torch.Tensor,
    sq_distances: torch.Tensor,
    labels: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    max_moves: int,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> None:
    """scikit-learn's empty-cluster relocation applied to the sums, in place and with no host sync:
    the clusters of no weight (``counts <= 0``; the first ``max_moves`` of them in index order) each
    take one of the rows farthest from their centroids by ``sq_distances`` (n,), farthest first,
    ties to the lower row, rows of zero weight last (``farthest_keys_reference``); each moved row
    leaves its cluster's sums and count and is all its new cluster holds
    (``move_rows_to_clusters``). The labels are not changed (the next pass moves the rows).

    Two launches for up to ``RELOCATE_MAX`` moves (each program of the first keeps the farthest of
    its share of the rows, one program merges them, finds the empty clusters and moves the rows),
    where ``torch.nonzero_static``, ``torch.topk`` and the moves took eight or more launches, the
    host's time between two passes of a fit (H100, 2026-12-06: about 0.3 ms of launches before the
    moves at 245,760 x 32, k = 1,024). More moves go through ``torch.topk`` (one host sync)."""
    _check_relocation(x, sq_distances, labels, sums, counts, max_moves)
    n, d = x.shape
    if max_moves == 0 or n == 0:
        return
    if max_moves > RELOCATE_MAX:
        rows, clusters = _farthest_pairs(sq_distances, counts, max_moves, sample_weight)
        move_rows_to_clusters(x, rows, clusters, labels, sums, counts, sample_weight=sample_weight, offset=offset,
                              row_scale=row_scale)
        return
    transform = _transform_args(x, offset, row_scale, sample_weight, counts)
    block_d = min(256, max(16, triton.next_power_of_2(d)))
    m = triton.next_power_of_2(max_moves)
    block = 1024
    programs = min(triton.cdiv(n, block), num_persistent_programs(x.device))
    candidates = torch.empty(programs * m, dtype=torch.int64, device=x.device)
    launcher(_farthest_candidates_kernel)[(programs,)](
        sq_distances.contiguous(), transform["weight_ptr"], n, candidates, M=m, BLOCK=block, HAS_WEIGHT=sample_weight is not None)
    launcher(_relocate_farthest_kernel)[(1,)](
        candidates, candidates.numel(), x, labels, sums_ptr=sums, counts_ptr=counts, k=counts.numel(), d=d,
        max_moves=max_moves, M=m, BLOCK_C=1024, SCAN_K=4096, BLOCK_K=256, BLOCK_D=block_d, **transform,
    )


def relocate_to_farthest_reference(
    x: torch.Tensor,
    sq_distances: torch.Tensor,
    labels: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    max_moves: int,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> None:
    """Pure-torch reference of ``relocate_to_farthest`` (in place)."""
    _check_relocation(x, sq_distances, labels, sums, counts, max_moves)
    rows, clusters = _farthest_pairs(sq_distances, counts, max_moves, sample_weight)
    move_rows_to_clusters_reference(x, rows, clusters, labels, sums, counts, sample_weight=sample_weight,
                                    offset=offset, row_scale=row_scale)


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


def add_sorted_sums(
    x: torch.Tensor,
    labels: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    *,
    sample_weight: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    control: torch.Tensor | None = None,
) -> None:
    """Add the transformed rows' (weighted) sums and weights into float32 ``sums`` (k, d) and
    ``counts`` (k,), contiguous, by label (int32/int64 in [0, k)): the rows ordered by label
    (``torch.sort``), then one program a block of 128 of them adds each label's run with one atomic a
    feature (``_sorted_sums_kernel``), n / 128 + k atomics a feature instead of a row's each: the
    pass's sums where wide rows' atomics cost more than the sort (H100, 1M x 768 bf16, k = 8,192:
    0.89 ms by segments against 1.48 by atomics, 2.6 in the exact pass). Sums in the order of a
    scan, the runs across blocks in atomics' order (last bits vary between runs). ``control``: an
    int32 word; nothing is added unless it is 0 (a frozen iteration of a replayed block)."""
    n, d = x.shape
    if n == 0:
        return
    if sums.shape != (counts.shape[0], d) or not sums.is_contiguous() or labels.shape != (n,):
        raise ValueError(f"sums (k, {d}) contiguous with counts (k,) and labels ({n},), got {tuple(sums.shape)}, "
                         f"{tuple(counts.shape)}, {tuple(labels.shape)}")
    sorted_labels, order = torch.sort(labels.to(torch.int32))
    block_d = 64
    transform = _transform_args(x, offset, row_scale, sample_weight, counts)
    launcher(_sorted_sums_kernel)[(triton.cdiv(n, SORTED_BLOCK_N), triton.cdiv(d, block_d))](
        x, order, sorted_labels, sums_ptr=sums, counts_ptr=counts, control_ptr=counts if control is None else control,
        n=n, d=d, BLOCK_N=SORTED_BLOCK_N, BLOCK_D=block_d, HAS_CONTROL=control is not None, num_warps=4,
        **transform,
    )


SORTED_BLOCK_N = 128


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
