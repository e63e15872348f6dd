"""Lloyd iterations for rows of at most 8 features that search each tile of rows over a short list.

The dense small-d pass (``assign._assign_small_d_kernel``) computes every (row, centroid) distance
on the CUDA cores: at 100M x 2, k = 32 it issues about 15 instructions per pair and cannot go
below about 1.4 ms a pass on an H200 (BENCHMARKS.md, kernels v22). Low-dimensional rows allow far
less. ``BoxEngine`` sorts the rows once per fit along a Z-order (Morton) curve over their bounding
box, so that a tile of ``BLOCK_N`` consecutive sorted rows lies in a small box. Before each pass,
``_candidates_kernel`` lists for every tile the centroids that can be nearest to some point of its
box: centroid j is left out when its nearest point of the box is farther, by more than the
rounding of an fp32 distance, than the farthest point of the box from some other centroid (then
every row of the tile is strictly nearer to that other centroid, in fp32 as in exact arithmetic).
A tile whose list holds one centroid, which every row of the tile already holds, is settled:
``_candidates_kernel`` adds its sums, weight and inertia from the tile's moments (weighted mean,
weight, scatter, computed once per fit) and its rows are not read at all. The other tiles go on
a work list, and ``_box_pass_kernel`` searches each of their rows over the tile's list only, in
increasing centroid order with the dense pass's distance arithmetic, so ties go to the lowest
index and the labels are the dense small-d pass's; the rows of a tile that share a label are
summed together.

The kernels serve up to 8 features; the API runs the engine for at most 3 (``torchkm._ops.BOX_MAX_D``),
where the boxes of 128-row tiles exclude most centroids (``scripts/diag_box_lists.py``).

The engine keeps a float32 copy of the transformed rows in curve order (``n * d * 4`` bytes, at
most 32 per row), the order itself and each tile's moments (``8 (d + 2)`` bytes a tile); labels stay in curve order inside, and ``labels`` gives
them in the caller's order.
"""

from __future__ import annotations

import functools
import math
import os
import time

import torch
import triton
import triton.language as tl

from ._common import launcher, transform_rows, unused
from .centroids import block_frozen, finish_update
from .lloyd import ReplayedEngine, device_tol, launch_key
from .prune import PassInfo, distance_margin

__all__ = ["BoxEngine", "box_launch", "box_pass", "candidate_programs", "candidates", "candidates_reference",
           "curve_keys", "curve_keys_reference", "setup_seconds", "sorted_tiles", "tile_boxes", "tile_moments"]

MAX_D = 8
# Candidate slots per tile: a tile with more candidates searches every centroid.
MAX_CANDIDATES = 8
# Bits of the curve key (an int32 that stays non-negative).
KEY_BITS = 30


def key_bits_per_feature(d: int) -> int:
    return KEY_BITS // d


# ----------------------------------------------------------------------------------------------
# Curve order (once per fit).


@triton.jit
def _curve_keys_kernel(x_ptr, offset_ptr, scale_ptr, lo_ptr, inv_ptr, keys_ptr, n, d, stride_xn, stride_xd,
                       BLOCK: tl.constexpr, DP: tl.constexpr, BITS: tl.constexpr,
                       HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row_mask = rows < n
    dims = tl.arange(0, DP)
    dim_mask = dims < d
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
    else:
        scale = tl.full((BLOCK,), 1.0, tl.float32)
    xr = transform_rows(
        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
    lo = tl.load(lo_ptr + dims, mask=dim_mask, other=0.0)
    inv = tl.load(inv_ptr + dims, mask=dim_mask, other=0.0)
    cells = tl.minimum(tl.maximum((xr - lo[None, :]) * inv[None, :], 0.0), (1 << BITS) - 1.0).to(tl.int32)
    cells = tl.where(dim_mask[None, :], cells, 0)
    key = tl.zeros((BLOCK,), tl.int32)
    for b in tl.static_range(BITS):
        # Bit b of feature i goes to bit b * d + i (features past d hold 0 and shift by 0).
        at = tl.where(dim_mask, b * d + dims, 0)
        key = key | tl.sum(((cells >> b) & 1) << at[None, :], axis=1)
    tl.store(keys_ptr + rows, key, mask=row_mask)


def _key_grid(x: torch.Tensor, offset: torch.Tensor | None, row_scale: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, inv)`` of the key grid: the transformed rows' lower corner and cells per unit, per
    feature. Only the order depends on it (any grid gives correct labels)."""
    d = x.shape[1]
    if row_scale is not None:  # normalised rows lie in [-1, 1]
        lo = torch.full((d,), -1.0, device=x.device)
        hi = torch.full((d,), 1.0, device=x.device)
    else:
        lo, hi = (v.float() for v in torch.aminmax(x, dim=0))
        if offset is not None:
            lo, hi = lo - offset, hi - offset
    span = hi - lo
    top = float(2 ** key_bits_per_feature(d) - 1)
    inv = torch.where(span > 0, top / torch.where(span > 0, span, 1.0), 0.0)
    return lo.contiguous(), inv.contiguous()


# (rows per program, warps) of ``curve_keys`` and warps of ``sorted_tiles``; module constants so
# that scripts/diag_box_setup.py can time others.
CURVE_KEYS_LAUNCH = (256, 4)
SORTED_TILES_WARPS = 4


def curve_keys(x: torch.Tensor, offset: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
               lo: torch.Tensor | None = None, inv: torch.Tensor | None = None) -> torch.Tensor:
    """int32 Z-order keys of the transformed rows ``(x - offset) * row_scale`` (d <= 8) on a grid
    of ``2^(30 // d)`` cells per feature over their bounding box (or ``lo``/``inv``, see ``_key_grid``)."""
    n, d = x.shape
    if not 1 <= d <= MAX_D:
        raise ValueError(f"curve keys are for 1 to {MAX_D} features, got {d}")
    if lo is None or inv is None:
        lo, inv = _key_grid(x, offset, row_scale)
    keys = torch.empty(n, dtype=torch.int32, device=x.device)
    if n == 0:
        return keys
    block, warps = CURVE_KEYS_LAUNCH
    launcher(_curve_keys_kernel)[(triton.cdiv(n, block),)](
        x, unused(x.device) if offset is None else offset, unused(x.device) if row_scale is None else row_scale,
        lo, inv, keys, n, d, x.stride(0), x.stride(1),
        BLOCK=block, DP=triton.next_power_of_2(d), BITS=key_bits_per_feature(d),
        HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None, num_warps=warps,
    )
    return keys


def curve_keys_reference(x_t: torch.Tensor, lo: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Pure-torch ``curve_keys`` of already transformed float32 rows."""
    d = x_t.shape[1]
    bits = key_bits_per_feature(d)
    cells = ((x_t - lo) * inv).clamp(0, 2**bits - 1).to(torch.int64)
    key = torch.zeros(x_t.shape[0], dtype=torch.int64, device=x_t.device)
    for b in range(bits):
        for i in range(d):
            key |= ((cells[:, i] >> b) & 1) << (b * d + i)
    return key.to(torch.int32)


def tile_boxes(rows: torch.Tensor, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` (tiles, d): each feature's least and greatest value over each tile of
    ``block_n`` consecutive rows (the last tile may be short)."""
    n, d = rows.shape
    tiles = triton.cdiv(n, block_n)
    lo = torch.empty(tiles, d, dtype=torch.float32, device=rows.device)
    hi = torch.empty_like(lo)
    whole = n // block_n
    if whole:
        lo[:whole], hi[:whole] = torch.aminmax(rows[: whole * block_n].view(whole, block_n, d), dim=1)
    if whole < tiles:
        lo[whole], hi[whole] = torch.aminmax(rows[whole * block_n:], dim=0)
    return lo, hi


@triton.jit
def _sorted_tiles_kernel(x_ptr, order_ptr, offset_ptr, scale_ptr, w_ptr, labels_ptr,
                         rows_ptr, w_out_ptr, labels_out_ptr, lo_ptr, hi_ptr, moments_ptr,
                         n, d, stride_xn, stride_xd,
                         BLOCK_N: tl.constexpr, DP: tl.constexpr, HAS_OFFSET: tl.constexpr,
                         HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_LABELS: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = pos < n
    src = tl.load(order_ptr + pos, mask=row_mask, other=0).to(tl.int64)
    dims = tl.arange(0, DP)
    dim_mask = dims < d
    mask = row_mask[:, None] & dim_mask[None, :]
    if HAS_SCALE:
        scale = tl.load(scale_ptr + src, mask=row_mask, other=1.0)
    else:
        scale = tl.full((BLOCK_N,), 1.0, tl.float32)
    xr = transform_rows(
        tl.load(x_ptr + src[:, None] * stride_xn + dims[None, :] * stride_xd, mask=mask, other=0.0),
        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
    tl.store(rows_ptr + pos[:, None] * d + dims[None, :], xr, mask=mask)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + src, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(w_out_ptr + pos, w, mask=row_mask)
    else:
        w = row_mask.to(tl.float32)
    if HAS_LABELS:
        tl.store(labels_out_ptr + pos, tl.load(labels_ptr + src, mask=row_mask, other=0).to(tl.int32), mask=row_mask)
    # The box spans every row of the tile, weighted or not (a row of no weight still gets a label).
    tl.store(lo_ptr + tile * d + dims, tl.min(tl.where(mask, xr, float("inf")), axis=0), mask=dim_mask)
    tl.store(hi_ptr + tile * d + dims, tl.max(tl.where(mask, xr, float("-inf")), axis=0), mask=dim_mask)
    x64 = xr.to(tl.float64)
    w64 = w.to(tl.float64)
    total = tl.sum(w64, axis=0)
    mean = tl.sum(x64 * w64[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    diff = tl.where(mask, x64 - mean[None, :], 0.0)
    scatter = tl.sum(tl.sum(diff * diff, axis=1) * w64, axis=0)
    out = moments_ptr + tile * (d + 2)
    tl.store(out + dims, mean, mask=dim_mask)
    tl.store(out + d, total)
    tl.store(out + d + 1, scatter)


def sorted_tiles(x: torch.Tensor, order: torch.Tensor, block_n: int, *, offset: torch.Tensor | None = None,
                 row_scale: torch.Tensor | None = None, sample_weight: torch.Tensor | None = None,
                 labels: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
    """The engine's once-per-fit tiles in one pass over ``order``: ``rows``, the transformed rows
    ``(x - offset) * row_scale`` in that order (float32, as the kernels see them), ``weight`` and
    ``labels`` in that order (float32 and int32; None where not given), and per tile of ``block_n``
    rows its box ``lo``/``hi`` (``tile_boxes``) and ``moments`` (``tile_moments``, float64).
    Replaces a gather, the transform, two gathers and the tiles' reductions (at 100M x 2 on an
    H200: 18.7 ms of set-up, of which those took 12.4; this launch takes 6.1-6.3 ms)."""
    n, d = x.shape
    device = x.device
    tiles = triton.cdiv(n, block_n)
    out: dict[str, torch.Tensor | None] = {
        "rows": torch.empty(n, d, dtype=torch.float32, device=device),
        "weight": None if sample_weight is None else torch.empty(n, dtype=torch.float32, device=device),
        "labels": None if labels is None else torch.empty(n, dtype=torch.int32, device=device),
        "lo": torch.empty(tiles, d, dtype=torch.float32, device=device),
        "hi": torch.empty(tiles, d, dtype=torch.float32, device=device),
        "moments": torch.empty(tiles, d + 2, dtype=torch.float64, device=device),
    }
    if n == 0:
        return out
    launcher(_sorted_tiles_kernel)[(tiles,)](
        x, order, unused(device) if offset is None else offset, unused(device) if row_scale is None else row_scale,
        unused(device) if sample_weight is None else sample_weight, unused(device, torch.int32) if labels is None else labels,
        out["rows"], unused(device) if out["weight"] is None else out["weight"],
        unused(device, torch.int32) if out["labels"] is None else out["labels"], out["lo"], out["hi"], out["moments"],
        n, d, x.stride(0), x.stride(1),
        BLOCK_N=block_n, DP=triton.next_power_of_2(d), HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None,
        HAS_WEIGHT=sample_weight is not None, HAS_LABELS=labels is not None, num_warps=SORTED_TILES_WARPS,
    )
    return out


# ----------------------------------------------------------------------------------------------
# Candidate lists and settled tiles (every pass).


@triton.jit
def _box_far(lo_ptr, hi_ptr, tiles, tile_mask, c_ptr, cols, col_mask, d, TB: tl.constexpr, KC: tl.constexpr):
    """Squared distances from each centroid to the farthest point of each tile's box (TB x KC); a
    padded centroid is at +inf."""
    far = tl.zeros((TB, KC), tl.float32)
    for i in range(d):
        lo = tl.load(lo_ptr + tiles * d + i, mask=tile_mask, other=0.0)
        hi = tl.load(hi_ptr + tiles * d + i, mask=tile_mask, other=0.0)
        c = tl.load(c_ptr + cols * d + i, mask=col_mask, other=0.0)
        span = tl.maximum(tl.abs(lo[:, None] - c[None, :]), tl.abs(hi[:, None] - c[None, :]))
        far += span * span
    return tl.where(col_mask[None, :], far, float("inf"))


@triton.jit
def _box_near(lo_ptr, hi_ptr, tiles, tile_mask, c_ptr, cols, col_mask, d, TB: tl.constexpr, KC: tl.constexpr):
    """Squared distances from each centroid to the nearest point of each tile's box (TB x KC); a
    padded centroid is at +inf."""
    near = tl.zeros((TB, KC), tl.float32)
    for i in range(d):
        lo = tl.load(lo_ptr + tiles * d + i, mask=tile_mask, other=0.0)
        hi = tl.load(hi_ptr + tiles * d + i, mask=tile_mask, other=0.0)
        c = tl.load(c_ptr + cols * d + i, mask=col_mask, other=0.0)
        gap = tl.maximum(tl.maximum(lo[:, None] - c[None, :], c[None, :] - hi[:, None]), 0.0)
        near += gap * gap
    return tl.where(col_mask[None, :], near, float("inf"))


@triton.jit(do_not_specialize=["k", "n_tiles"])
def _candidates_kernel(lo_ptr, hi_ptr, c_ptr, cand_ptr, count_ptr, work_ptr, work_count_ptr,
                       tile_label_ptr, moments_ptr, acc_ptr, part_inertia_ptr, control_ptr, stats_prev_ptr, tol,
                       n_tiles, k, d, margin,
                       TB: tl.constexpr, KC: tl.constexpr, MAXC: tl.constexpr, HAS_CONTROL: tl.constexpr,
                       SETTLE: tl.constexpr):
    go = True
    if HAS_CONTROL:
        # The first launch of a replayed iteration decides whether it is frozen (as prepare_centroids
        # does for the dense engine). Every program computes the same flag from the same inputs, and
        # the flag only ever goes from 0 to 1, so the programs reading control[0] while program 0
        # writes it agree.
        frozen = block_frozen(control_ptr, stats_prev_ptr, 0, tol, True)
        if tl.program_id(0) == 0:
            tl.store(control_ptr, frozen.to(tl.int32))
        go = frozen == 0
    if go:
        tiles = tl.program_id(0).to(tl.int64) * TB + tl.arange(0, TB)
        tile_mask = tiles < n_tiles
        chunk = tl.arange(0, KC)
        known = tl.full((TB,), -1, tl.int32)
        if SETTLE:
            known = tl.load(tile_label_ptr + tiles, mask=tile_mask, other=-1)
        if tl.min(tl.where(tile_mask, known, 0), axis=0) >= 0:
            # Every tile's rows hold one label: its centroid's far distance bounds the least one,
            # so the lists below are supersets of the exact ones (still holding every nearest
            # centroid), equal to them where the label is still the only candidate, and one
            # sweep over the centroids is saved.
            reach = tl.zeros((TB,), tl.float32)
            for i in range(d):
                lo = tl.load(lo_ptr + tiles * d + i, mask=tile_mask, other=0.0)
                hi = tl.load(hi_ptr + tiles * d + i, mask=tile_mask, other=0.0)
                c = tl.load(c_ptr + known * d + i, mask=tile_mask, other=0.0)
                span = tl.maximum(tl.abs(lo - c), tl.abs(hi - c))
                reach += span * span
        else:
            reach = tl.full((TB,), float("inf"), tl.float32)
            for j0 in range(0, k, KC):
                cols = j0 + chunk
                reach = tl.minimum(reach, tl.min(_box_far(lo_ptr, hi_ptr, tiles, tile_mask, c_ptr, cols, cols < k, d,
                                                          TB, KC), axis=1))
        # Every row of the tile is within ``reach`` of some centroid: a centroid whose box distance
        # exceeds it (with room for fp32 rounding of both sides) is nearest to none of them.
        limit = reach * (1.0 + margin) + 1e-30
        count = tl.zeros((TB,), tl.int32)
        first = tl.full((TB,), k, tl.int32)
        for j0 in range(0, k, KC):
            cols = j0 + chunk
            take = _box_near(lo_ptr, hi_ptr, tiles, tile_mask, c_ptr, cols, cols < k, d, TB, KC) <= limit[:, None]
            count += tl.sum(take.to(tl.int32), axis=1)
            first = tl.minimum(first, tl.min(tl.where(take, cols[None, :], k), axis=1))
        count = tl.where(tile_mask, count, 0)
        tl.store(count_ptr + tiles, count, mask=tile_mask)
        work = tile_mask
        if SETTLE:
            # A tile with one candidate whose rows already all hold it (``tile_label``) is settled:
            # its labels stand, and its sums, weight and inertia come from its moments (mean m,
            # weight W, scatter S = sum w |x - m|^2, float64): sum w |x - c|^2 = S + W |m - c|^2.
            single = tile_mask & (count == 1)
            settled = single & (known == first)
            work = tile_mask & ~settled
            tl.store(tile_label_ptr + tiles, tl.where(single, first, -1), mask=work)
            row = moments_ptr + tiles * (d + 2)
            weight = tl.load(row + d, mask=settled, other=0.0)
            spread = tl.zeros((TB,), tl.float64)
            for i in range(d):
                diff = tl.load(row + i, mask=settled, other=0.0) - tl.load(c_ptr + first * d + i, mask=settled,
                                                                             other=0.0).to(tl.float64)
                spread += diff * diff
            inertia = tl.where(settled, tl.load(row + d + 1, mask=settled, other=0.0) + weight * spread, 0.0)
            tl.store(part_inertia_ptr + tl.program_id(0), tl.sum(inertia, axis=0).to(tl.float32))
            # The settled tiles' sums. Consecutive tiles lie together along the curve, so a
            # program's settled tiles mostly share one label: then one sum a feature, else
            # per chunk of centroids between the least and greatest label.
            lowest = tl.min(tl.where(settled, first, k), axis=0)
            highest = tl.max(tl.where(settled, first, -1), axis=0)
            if lowest == highest:
                tl.atomic_add(acc_ptr + k * d + lowest, tl.sum(weight, axis=0).to(tl.float32), sem="relaxed")
                for i in range(d):
                    wx = weight * tl.load(row + i, mask=settled, other=0.0)
                    tl.atomic_add(acc_ptr + lowest * d + i, tl.sum(wx, axis=0).to(tl.float32), sem="relaxed")
            elif lowest < highest:
                weight32 = weight.to(tl.float32)
                for j0 in range((lowest // KC) * KC, highest + 1, KC):
                    cols = j0 + chunk
                    hit = settled[:, None] & (first[:, None] == cols[None, :])
                    present = tl.sum(hit.to(tl.int32), axis=0) > 0
                    tl.atomic_add(acc_ptr + k * d + cols, tl.sum(tl.where(hit, weight32[:, None], 0.0), axis=0),
                                  mask=present, sem="relaxed")
                    for i in range(d):
                        wx = (weight * tl.load(row + i, mask=settled, other=0.0)).to(tl.float32)
                        tl.atomic_add(acc_ptr + cols * d + i, tl.sum(tl.where(hit, wx[:, None], 0.0), axis=0),
                                      mask=present, sem="relaxed")
        else:
            tl.store(part_inertia_ptr + tl.program_id(0), 0.0)
        # Lists, for the tiles the pass will search only: one candidate is the list's head; longer
        # lists take a second sweep (in increasing centroid order, cut at MAXC).
        tl.store(cand_ptr + tiles * MAXC, first, mask=work)
        longer = work & (count > 1)
        if tl.max(longer.to(tl.int32), axis=0) > 0:
            filled = tl.zeros((TB,), tl.int32)
            for j0 in range(0, k, KC):
                cols = j0 + chunk
                take = (_box_near(lo_ptr, hi_ptr, tiles, tile_mask, c_ptr, cols, cols < k, d, TB, KC)
                        <= limit[:, None]) & longer[:, None]
                slot = filled[:, None] + tl.cumsum(take.to(tl.int32), axis=1) - 1
                tl.store(cand_ptr + tiles[:, None] * MAXC + slot, cols[None, :], mask=take & (slot < MAXC))
                filled += tl.sum(take.to(tl.int32), axis=1)
        # The other tiles go on the pass's work list (in no particular order).
        listed = tl.sum(work.to(tl.int32), axis=0)
        if listed > 0:
            base = tl.atomic_add(work_count_ptr, listed, sem="relaxed")
            slot = base + tl.cumsum(work.to(tl.int32), axis=0) - 1
            tl.store(work_ptr + slot, tiles.to(tl.int32), mask=work)


def candidate_launch() -> tuple[int, int]:
    """(tiles per program, warps) of the candidates launch. ``TORCHKM_BOX_CANDIDATES``
    (``TILES,WARPS``) overrides it for experiments."""
    spec = os.environ.get("TORCHKM_BOX_CANDIDATES")
    if spec:
        tiles, warps = (int(v) for v in spec.split(","))
        return tiles, warps
    return 32, 4


def candidate_programs(n_tiles: int) -> int:
    """Programs of the candidates launch (each writes one inertia partial)."""
    return triton.cdiv(n_tiles, candidate_launch()[0])


def candidates(lo: torch.Tensor, hi: torch.Tensor, c: torch.Tensor, cand: torch.Tensor, count: torch.Tensor,
               work: torch.Tensor, work_count: torch.Tensor, *, settle: tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor, torch.Tensor] | None = None,
               control: torch.Tensor | None = None, stats_prev: torch.Tensor | None = None, tol: float = 0.0) -> None:
    """Each tile's number of candidate centroids into ``count`` (tiles,) int32, and the tiles the
    pass must search into ``work`` (tiles,) int32, their number added to ``work_count`` (one int32,
    zero on entry). For those tiles, their candidates go to ``cand`` (tiles, MAX_CANDIDATES) int32
    in increasing order (past MAX_CANDIDATES the list is cut and the tile searches every centroid).

    ``settle``: ``(tile_label, moments, acc, part_inertia)``. ``tile_label`` (tiles,) int32 is the
    label every row of a tile holds, or -1 (not known or mixed); ``moments`` (tiles, d + 2) float64
    each tile's weighted mean, weight and scatter (``tile_moments``). A tile whose only candidate
    is its ``tile_label`` is settled: it stays off the work list, its weighted sums and weight go
    into ``acc`` (k * d sums, then k weights) and the inertia of the settled tiles of each program
    into ``part_inertia`` (``candidate_programs(tiles)`` elements). The other tiles' ``tile_label``
    becomes what the pass will give them: their candidate if they have one, else -1.
    Without ``settle`` every tile goes on the work list.

    ``control``/``stats_prev``: a replayed block's iteration (see ``prepare_centroids``), which this
    launch freezes or not."""
    tiles, d = lo.shape
    k = c.shape[0]
    if tiles == 0:
        return
    kc = min(32, max(16, triton.next_power_of_2(k)))
    device = c.device
    if settle is None:
        tile_label, moments, acc = unused(device, torch.int32), unused(device, torch.float64), unused(device)
        part_inertia = torch.empty(candidate_programs(tiles), device=device)
    else:
        tile_label, moments, acc, part_inertia = settle
    launcher(_candidates_kernel)[(candidate_programs(tiles),)](
        lo, hi, c, cand, count, work, work_count, tile_label, moments, acc, part_inertia,
        unused(device, torch.int32) if control is None else control,
        unused(device, torch.float64) if stats_prev is None else stats_prev, tol,
        tiles, k, d, distance_margin(d),
        TB=candidate_launch()[0], KC=kc, MAXC=cand.shape[1], HAS_CONTROL=control is not None,
        SETTLE=settle is not None, num_warps=candidate_launch()[1],
    )


def candidates_reference(lo: torch.Tensor, hi: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Pure-torch candidate test: a (tiles, k) bool mask, with the kernel's margins."""
    margin = distance_margin(c.shape[1])
    below = lo[:, None, :] - c[None, :, :]
    above = c[None, :, :] - hi[:, None, :]
    near = (torch.maximum(below, above).clamp_min(0) ** 2).sum(2)
    far = (torch.maximum(below.abs(), (hi[:, None, :] - c[None, :, :]).abs()) ** 2).sum(2)
    reach = far.min(1).values
    return near <= (reach * (1 + margin) + 1e-30)[:, None]


def tile_moments(rows: torch.Tensor, block_n: int, weight: torch.Tensor | None = None,
                 chunk_tiles: int = 1 << 16) -> torch.Tensor:
    """(tiles, d + 2) float64: each tile of ``block_n`` consecutive rows' weighted mean (d), weight
    and scatter ``sum w |x - mean|^2`` (mean 0 and scatter 0 where the weight is 0). Computed in
    float64 over chunks of ``chunk_tiles`` tiles (reductions over a (tiles, block_n, d) view, no
    atomics), so the temporary stays small."""
    n, d = rows.shape
    tiles = triton.cdiv(n, block_n)
    out = torch.zeros(tiles, d + 2, dtype=torch.float64, device=rows.device)

    def fill(t0: int, x: torch.Tensor, w: torch.Tensor | None) -> None:
        # x: (t, rows a tile, d) float64, w: (t, rows a tile) float64 or None (all 1).
        total = torch.full(x.shape[:1], float(x.shape[1]), dtype=torch.float64, device=x.device) if w is None \
            else w.sum(1)
        sums = x.sum(1) if w is None else (x * w[:, :, None]).sum(1)
        mean = torch.where(total[:, None] > 0, sums / torch.where(total > 0, total, 1.0)[:, None], 0.0)
        sq = ((x - mean[:, None, :]) ** 2).sum(2)
        scatter = (sq if w is None else sq * w).sum(1)
        out[t0:t0 + x.shape[0], :d], out[t0:t0 + x.shape[0], d], out[t0:t0 + x.shape[0], d + 1] = mean, total, scatter

    whole = n // block_n
    for t0 in range(0, whole, chunk_tiles):
        t1 = min(whole, t0 + chunk_tiles)
        x = rows[t0 * block_n:t1 * block_n].double().view(t1 - t0, block_n, d)
        w = None if weight is None else weight[t0 * block_n:t1 * block_n].double().view(t1 - t0, block_n)
        fill(t0, x, w)
    if whole < tiles:  # the last, short tile
        x = rows[whole * block_n:].double()[None]
        fill(whole, x, None if weight is None else weight[whole * block_n:].double()[None])
    return out


# ----------------------------------------------------------------------------------------------
# The pass.


@triton.jit
def _tile_distances(xr, c_ptr, j, d, dims, dim_mask, DP: tl.constexpr):
    """fp32 squared distances of the tile's rows to centroid ``j``, in the dense small-d pass's
    arithmetic: one feature after another up to 4 features, a sum over the padded row beyond."""
    if DP == 1:
        diff = tl.sum(xr, axis=1) - tl.load(c_ptr + j * d)
        dist = diff * diff
    elif DP == 2:
        x0, x1 = tl.split(xr)
        diff = x0 - tl.load(c_ptr + j * d)
        dist = diff * diff
        diff = x1 - tl.load(c_ptr + j * d + 1)
        dist += diff * diff
    elif DP == 4:
        even, odd = tl.split(tl.reshape(xr, (xr.shape[0], 2, 2)))
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        diff = x0 - tl.load(c_ptr + j * d)
        dist = diff * diff
        diff = x1 - tl.load(c_ptr + j * d + 1)
        dist += diff * diff
        diff = x2 - tl.load(c_ptr + j * d + 2)
        dist += diff * diff
        diff = x3 - tl.load(c_ptr + j * d + 3, mask=d > 3, other=0.0)
        dist += diff * diff
    else:
        cj = tl.load(c_ptr + j * d + dims, mask=dim_mask, other=0.0)
        diff = xr - cj[None, :]
        dist = tl.sum(diff * diff, axis=1)
    return dist


@triton.jit(do_not_specialize=["n", "k", "n_tiles"])
def _box_pass_kernel(
    x_ptr, w_ptr, c_ptr, cand_ptr, count_ptr, work_ptr, work_count_ptr, labels_ptr, acc_ptr,
    part_inertia_ptr, part_changed_ptr, searched_ptr, overflow_ptr, control_ptr,
    n, k, d, n_tiles,
    BLOCK_N: tl.constexpr, DP: tl.constexpr, KP: tl.constexpr, MAXC: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_PREV: tl.constexpr, HAS_CONTROL: tl.constexpr, REG_SUMS: tl.constexpr,
):
    """Program ``p`` of ``G`` walks the work list's entries ``p, p + G, ...``; step t loads tile t
    (rows, weights, previous labels, its count and first candidate) and searches tile t - 1, so the
    loads are in flight during a search (as in the dense small-d pass). ``x`` is the contiguous
    float32 transformed rows in curve order, ``labels`` int32 in the same order (previous labels on
    entry with ``HAS_PREV``). ``REG_SUMS`` (k <= KP): per-cluster sums kept in registers and added
    once per program; otherwise atomics per tile and candidate. Each program adds the centroids its
    tiles searched and its tiles past the slots to ``searched`` and ``overflow``."""
    go = True
    if HAS_CONTROL:
        go = tl.load(control_ptr) == 0
    if go:
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        dims = tl.arange(0, DP)
        dim_mask = dims < d
        sums_ptr = acc_ptr
        counts_ptr = acc_ptr + k * d
        k_rows = tl.arange(0, KP)
        if REG_SUMS:
            acc_x = tl.zeros((KP, DP), tl.float32)
            acc_w = tl.zeros((KP,), tl.float32)
        inertia_rows = tl.zeros((BLOCK_N,), tl.float32)
        changed_rows = tl.zeros((BLOCK_N,), tl.int32)
        searched = pid * 0
        overflow = pid * 0
        x_next = tl.zeros((BLOCK_N, DP), tl.float32)
        w_next = tl.zeros((BLOCK_N,), tl.float32)
        prev_next = tl.zeros((BLOCK_N,), tl.int32)
        count_next = pid * 0
        first_next = pid * 0
        tile_next = (pid * 0).to(tl.int64) + n_tiles
        listed_tiles = tl.load(work_count_ptr)
        my_tiles = tl.maximum(listed_tiles - pid + programs - 1, 0) // programs
        for t in range(my_tiles + 1):
            x_tile = x_next
            w = w_next
            prev = prev_next
            count = count_next
            first = first_next
            tile = tile_next
            entry = pid + t * programs
            # Past the list: a tile past the last row (nothing loaded, no candidates, nothing stored).
            tile_next = tl.load(work_ptr + entry, mask=entry < listed_tiles, other=n_tiles).to(tl.int64)
            rows = tile_next * BLOCK_N + tl.arange(0, BLOCK_N)
            row_mask = rows < n
            x_next = tl.load(x_ptr + rows[:, None] * d + dims[None, :], mask=row_mask[:, None] & dim_mask[None, :],
                             other=0.0)
            if HAS_WEIGHT:
                w_next = tl.load(w_ptr + rows, mask=row_mask, other=0.0)
            else:
                w_next = row_mask.to(tl.float32)
            if HAS_PREV:
                prev_next = tl.load(labels_ptr + rows, mask=row_mask, other=0)
            count_next = tl.load(count_ptr + tile_next, mask=tile_next < n_tiles, other=0)
            first_next = tl.load(cand_ptr + tile_next * MAXC, mask=tile_next < n_tiles, other=0)
            if t > 0:
                rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
                row_mask = rows < n
                listed = count <= MAXC
                steps = tl.where(listed, count, k)
                searched += steps
                overflow += (~listed).to(tl.int32)
                best = tl.full((BLOCK_N,), float("inf"), tl.float32)
                label = tl.zeros((BLOCK_N,), tl.int32)
                # Candidates in increasing index, strict comparison: ties keep the lowest index.
                for s in range(steps):
                    if listed:
                        j = first
                        if s > 0:
                            j = tl.load(cand_ptr + tile * MAXC + s)
                    else:
                        j = s
                    dist = _tile_distances(x_tile, c_ptr, j, d, dims, dim_mask, DP)
                    better = dist < best
                    best = tl.where(better, dist, best)
                    label = tl.where(better, j, label)
                if HAS_PREV:
                    changed_rows += (row_mask & (prev != label)).to(tl.int32)
                else:
                    changed_rows += row_mask.to(tl.int32)
                tl.store(labels_ptr + rows, label, mask=row_mask)
                inertia_rows += tl.where(row_mask, best, 0.0) * w
                xw = x_tile * w[:, None]
                if listed:
                    # The rows of each candidate's cluster, summed across the tile.
                    for s in range(steps):
                        j = first
                        if s > 0:
                            j = tl.load(cand_ptr + tile * MAXC + s)
                        hit = label == j
                        part_x = tl.sum(tl.where(hit[:, None], xw, 0.0), axis=0)
                        part_w = tl.sum(tl.where(hit, w, 0.0), axis=0)
                        if REG_SUMS:
                            acc_x += tl.where((k_rows == j)[:, None], part_x[None, :], 0.0)
                            acc_w += tl.where(k_rows == j, part_w, 0.0)
                        else:
                            tl.atomic_add(sums_ptr + j * d + dims, part_x, mask=dim_mask, sem="relaxed")
                            tl.atomic_add(counts_ptr + j, part_w, sem="relaxed")
                else:
                    # A tile near many centroids: one atomic per row and feature.
                    label64 = label.to(tl.int64)
                    tl.atomic_add(sums_ptr + label64[:, None] * d + dims[None, :], xw,
                                  mask=row_mask[:, None] & dim_mask[None, :], sem="relaxed")
                    tl.atomic_add(counts_ptr + label64, w, mask=row_mask, sem="relaxed")
        tl.store(part_changed_ptr + pid, tl.sum(changed_rows.to(tl.int64), axis=0))
        tl.store(part_inertia_ptr + pid, tl.sum(inertia_rows, axis=0))
        if my_tiles > 0:
            tl.atomic_add(searched_ptr, searched, sem="relaxed")
            tl.atomic_add(overflow_ptr, overflow, sem="relaxed")
        if REG_SUMS:
            live = k_rows < k
            tl.atomic_add(sums_ptr + k_rows[:, None] * d + dims[None, :], acc_x, mask=live[:, None] & dim_mask[None, :],
                          sem="relaxed")
            tl.atomic_add(counts_ptr + k_rows, acc_w, mask=live, sem="relaxed")


REG_SUMS_MAX_K = 64


def box_launch(n: int, device: torch.device) -> tuple[int, int]:
    """(rows per tile, programs) of the pass. ``TORCHKM_BOX_CONFIG`` (``BLOCK_N,programs per SM``)
    overrides it for experiments."""
    block_n, per_sm = 128, 8
    spec = os.environ.get("TORCHKM_BOX_CONFIG")
    if spec:
        block_n, per_sm = (int(v) for v in spec.split(","))
    n_tiles = triton.cdiv(n, block_n)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return block_n, max(1, min(n_tiles, per_sm * sms))


def box_pass(x_sorted: torch.Tensor, c: torch.Tensor, cand: torch.Tensor, count: torch.Tensor, work: torch.Tensor,
             work_count: torch.Tensor, labels: torch.Tensor, acc: torch.Tensor, part_inertia: torch.Tensor,
             part_changed: torch.Tensor, tallies: tuple[torch.Tensor, torch.Tensor], *, block_n: int,
             sample_weight: torch.Tensor | None = None, has_prev: bool = True,
             control: torch.Tensor | None = None) -> None:
    """One pass over the tiles of sorted rows on the work list (``candidates``): their ``labels``
    (int32, previous labels on entry with ``has_prev``) rewritten, their per-cluster sums and
    weights added into ``acc`` (k * d sums, then k weights; float32), each program's inertia and
    changed-label count into ``part_inertia`` and ``part_changed`` (one per program: the grid is
    their length); ``tallies`` (two int32 counters) gain the centroids the tiles searched and the
    tiles past the candidate slots."""
    n, d = x_sorted.shape
    k = c.shape[0]
    programs = part_inertia.numel()
    if n == 0 or programs == 0:
        return
    device = x_sorted.device
    kp = max(2, triton.next_power_of_2(k))
    launcher(_box_pass_kernel)[(programs,)](
        x_sorted, unused(device) if sample_weight is None else sample_weight, c, cand, count, work, work_count, labels,
        acc, part_inertia, part_changed, *tallies, unused(device, torch.int32) if control is None else control,
        n, k, d, count.numel(),
        BLOCK_N=block_n, DP=triton.next_power_of_2(d), KP=kp if k <= REG_SUMS_MAX_K else 2, MAXC=cand.shape[1],
        HAS_WEIGHT=sample_weight is not None, HAS_PREV=has_prev, HAS_CONTROL=control is not None,
        REG_SUMS=k <= REG_SUMS_MAX_K, num_warps=4,
    )


# ----------------------------------------------------------------------------------------------
# The engine.


class BoxEngine(ReplayedEngine):
    """Lloyd iterations on rows of at most 8 features, each tile of curve-sorted rows searched over
    its candidate list (module docstring). The interface of ``lloyd.LloydEngine``; ``labels`` is
    the caller's buffer, written in the caller's row order when read (``labels`` property)."""

    kernel = "pruned"

    def __init__(
        self, x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor, *, offset: torch.Tensor | None,
        row_scale: torch.Tensor | None, sample_weight: torch.Tensor | None, normalize: bool, tol: float,
        graphs: bool = False, block: int = 1, timed: bool = False,
    ):
        n, d = x.shape
        k = centroids.shape[0]
        if not 1 <= d <= MAX_D:
            raise ValueError(f"the box engine serves 1 to {MAX_D} features, got d={d}")
        device = x.device
        self.block = self.block_size = max(1, block)
        self.normalize = normalize
        self.tol_device = device_tol(tol)
        self._labels_out = labels
        # Once per fit: the rows, transformed as the kernels see them, in curve order, with the
        # caller's labels (an engine taking over a fit: the previous pass's) and the tiles.
        order = torch.argsort(curve_keys(x, offset, row_scale))
        self.order = order.to(torch.int32) if n < 2**31 else order
        self.block_n, programs = box_launch(n, device)
        tiles = sorted_tiles(x, self.order, self.block_n, offset=offset, row_scale=row_scale,
                             sample_weight=sample_weight, labels=labels)
        self.x_sorted, self.weight, self.sorted_labels = tiles["rows"], tiles["weight"], tiles["labels"]
        self.lo, self.hi, self.moments = tiles["lo"], tiles["hi"], tiles["moments"]
        n_tiles = self.lo.shape[0]
        self.tile_label = torch.full((n_tiles,), -1, dtype=torch.int32, device=device)
        self.cand = torch.zeros(n_tiles, MAX_CANDIDATES, dtype=torch.int32, device=device)
        self.count = torch.zeros(n_tiles, dtype=torch.int32, device=device)
        self.work = torch.zeros(n_tiles, dtype=torch.int32, device=device)
        self.c = centroids.to(torch.float32).contiguous().clone()
        self.c_old = torch.empty_like(self.c)
        self.sums = torch.empty(k, d, dtype=torch.float32, device=device)
        self.counts = torch.empty(k, dtype=torch.float32, device=device)
        self.acc = torch.zeros(k * d + k, dtype=torch.float32, device=device)
        # Inertia partials: the pass's programs, then the candidates launch's (settled tiles).
        self.part_inertia = torch.zeros(programs + candidate_programs(n_tiles), dtype=torch.float32, device=device)
        self.part_changed = torch.zeros(programs + candidate_programs(n_tiles), dtype=torch.int64, device=device)
        self._programs = programs
        # Counters zeroed before each pass: tiles on the work list, centroids searched, tiles past the slots.
        self.counters = torch.zeros(3, dtype=torch.int32, device=device)
        self.work_count = self.counters[:1]
        self.tallies = (self.counters[1:2], self.counters[2:3])
        # A pass's record: [inertia, shift, changed, empty], centroids searched, tiles past the slots.
        self.record = torch.zeros(6, dtype=torch.float64, device=device)
        self.stats = self.record[:4]
        self.info: PassInfo | None = None
        self.infos: list[PassInfo] = []
        self._init_passes(self._block_pass, device, graphs, timed, self.block_size, self.record.numel(),
                          launch_key("boxes", k, {"x": self.x_sorted, "weight": self.weight}, normalize=normalize))

    @property
    def labels(self) -> torch.Tensor:
        """The labels of the last pass in the caller's row order (int32, the caller's buffer)."""
        self._labels_out.index_copy_(0, self.order.long(), self.sorted_labels.to(self._labels_out.dtype))
        return self._labels_out

    def _pass(self, has_prev: bool, in_block: bool) -> None:
        control = self.control if in_block else None
        if not has_prev:
            self.tile_label.fill_(-1)
        self.acc.zero_()
        self.record.zero_()
        self.counters.zero_()
        programs = self._programs
        candidates(self.lo, self.hi, self.c, self.cand, self.count, self.work, self.work_count,
                   settle=(self.tile_label, self.moments, self.acc, self.part_inertia[programs:]), control=control,
                   stats_prev=self.stats_prev if in_block else None, tol=self.tol_device)
        box_pass(self.x_sorted, self.c, self.cand, self.count, self.work, self.work_count, self.sorted_labels, self.acc,
                 self.part_inertia[:programs], self.part_changed[:programs], self.tallies, block_n=self.block_n,
                 sample_weight=self.weight, has_prev=has_prev, control=control)
        k, d = self.c.shape
        finish_update(self.acc[: k * d].view(1, k, d), self.acc[k * d:].view(1, k), self.c, self.part_inertia,
                      self.part_changed, self.record, normalize=self.normalize, old_centroids=self.c_old,
                      sums=self.sums, counts=self.counts, control=control, tallies=self.tallies,
                      record=self.recording if in_block else None)

    def _block_pass(self) -> None:
        self._pass(True, in_block=True)

    def iterate(self, has_prev: bool) -> None:
        """One pass, its statistics the first row of the next ``read``; without ``has_prev`` the
        first of a run (no previous labels)."""
        if has_prev:
            self.run_block(1)
            return
        self._passes.begin(single="initial")
        self._pass(False, in_block=False)
        self.log[0].copy_(self.record)
        self._queue_single()

    def run_block(self, iterations: int, follow: bool = False) -> None:
        """Up to ``iterations`` (<= ``block_size``) passes with no host sync: a pass after one that
        met a stopping rule, or left a cluster empty, does nothing. ``follow``: as
        ``LloydEngine.run_block``'s."""
        self._run_passes(iterations, self.record, follow)

    def centroids_changed(self) -> None:
        """The centroids changed outside the passes (empty-cluster relocation): nothing is kept
        from one pass to the next but the labels, so nothing to do."""

    def read(self, rows: int) -> list[list[float]]:
        """The statistics of the first ``rows`` passes of the oldest block (or ``iterate``) not yet
        read (``LloydEngine.read``); their ``PassInfo`` in ``infos`` (the last one also in ``info``)."""
        values = self._read_log(rows)
        n, k = self.x_sorted.shape[0], self.c.shape[0]
        self.infos = []
        for row in values:
            # Every row of a searched tile computes the tile's candidates: work spent is work needed
            # here. A settled tile costs one distance, not counted.
            searched = min(float(n) * k, row[4] * self.block_n)
            self.infos.append(PassInfo(self.kernel, searched, searched, n, k))
        self.info = self.infos[-1] if self.infos else None
        return [row[:4] for row in values]


# ----------------------------------------------------------------------------------------------
# What the set-up costs (for a caller deciding whether to build an engine).

# Rows of the two synthetic set-ups timed: one small enough to be all fixed cost (launches and
# host work), one large enough for the device's per-row work to outlast the host's. Below about
# 10M rows the device works while the host still launches, so the set-up is not fixed + per-row
# cost: with 2^22 and 2^23 rows a line through the two estimated 14.1 and 5.4 ms for 100M x 2,
# whose set-up took 18.7 ms on an H200. The large one's time per row, which still holds some of
# the fixed cost, errs the other way, on the side of starting a trial later: 19.4 ms estimated
# for the 12.2 ms of the set-up with ``sorted_tiles`` (H200, 2026-11-27).
PROBE_ROWS = (1 << 12, 1 << 24)


@functools.lru_cache(maxsize=None)
def _setup_line(device: torch.device, d: int) -> tuple[float, float]:
    """(seconds, seconds per row) of ``BoxEngine``'s set-up on ``device`` for ``d`` features,
    measured once per process: the fastest of a few set-ups of uniform rows at each size of
    ``PROBE_ROWS`` (the first run compiles): the small one's time, the large one's per row."""
    g = torch.Generator(device=device).manual_seed(0)
    times = []
    for rows in PROBE_ROWS:
        x = torch.rand(rows, d, device=device, generator=g)
        c = x[:8].clone()
        labels = torch.zeros(rows, dtype=torch.int32, device=device)
        offset = torch.zeros(d, device=device)  # a fit's rows are centred: the kernels it will run
        best = math.inf
        for _ in range(3 if rows == PROBE_ROWS[0] else 2):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            BoxEngine(x, c, labels, offset=offset, row_scale=None, sample_weight=None, normalize=False, tol=0.0)
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        times.append(best)
        del x, c, labels
    return times[0], times[1] / PROBE_ROWS[1]


def setup_seconds(n: int, d: int, device: torch.device) -> float:
    """Estimated seconds of ``BoxEngine``'s once-per-fit set-up (curve order, sorted copy, tile
    boxes and moments) for ``n`` rows of ``d`` features on ``device``: measured on that device the
    first time it is asked (about 20 ms, see ``_setup_line``), then the larger of the fixed cost
    and the per-row cost times ``n``. Off CUDA (the interpreter) nothing is measured: 0."""
    if device.type != "cuda":
        return 0.0
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    fixed, per_row = _setup_line(device, d)
    return max(fixed, per_row * n)
