"""Fused assignment pass: nearest centroid, exact distance, and (optionally) the centroid sums, in one read of x.

One program owns BLOCK_N rows and streams centroid tiles of BLOCK_K through ``tl.dot`` (tensor
cores), looping over the features in BLOCK_D chunks when d is large. The accumulator starts at
``||c_j||^2`` and the centroids are pre-scaled by -2 (exact: a power of two), so the tensor cores
produce the score ``||c_j||^2 - 2 x.c_j`` (the squared distance minus ``||x||^2``) with no epilogue
arithmetic. Two ways to keep the running minimum (config ``EAGER``): lazily *per column of the
tile*, reduced across columns only once after the last centroid tile (three element-wise
operations per tile, no cross-thread reductions, but three tile-sized register arrays); or
eagerly per row after every tile (reductions per tile, few registers, so larger tiles fit). Ties
go to the lowest index, as in numpy, faiss and scikit-learn. With ``SWAP`` (the row in one
chunk) the product is transposed: scores (centroids x rows) with the resident row tile as
the shared-memory operand, so a 256-row tile fits beside the centroid stages and each centroid
tile read serves twice as many rows; the lazy minimum is then per row *and* centroid slot.
The exact mode's lazy searches also keep each slot's second-lowest score (one more array), from
which the best two candidates and a lower bound on the third follow (see ``precision``). Over many
centroid tiles the row-oriented lazy search packs the tile's number into the lowest bits of a
non-negative score (the row's squared norm with a margin is added), so one float minimum keeps a
slot's best with its tile (``AssignPass._lazy_bits``).
Sums and counts are added with relaxed atomics (fire-and-forget reductions; the next launch
orders them).

After the search the program reads its rows again (from cache) and computes, per row:
``||x - c_label||^2`` directly in fp32 (accurate even when the expansion cancels), the inertia and
changed-label counts of the tile, and optionally scatter-adds the rows into per-cluster sums, so a
Lloyd iteration reads x once.

Precision (``precision=``):
  ``"fast"``   products in x's dtype on tensor cores: tf32 for fp32 input, native fp16/bf16. Where
               fp32 rows take the streamed eager search (rows wider than one feature chunk, not on
               the Hopper search), they multiply fp16 operands instead: as many significant bits as
               tf32 (11), at twice its rate; so do rows of a multiple of 8 features on the Hopper
               search (packed there, ``hopper_search.packed``). Rows and centroids are scaled by one
               power of two into
               fp16's range (from the largest |x| and 2|c|, one small launch per pass), the rows
               copied a chunk at a time (at most ``HALF_ROWS_BYTES``; the Hopper search converts
               its resident row tile itself); the exact mode's bound takes fp16's rounding to
               nearest (2^-11 of the row, half tf32's truncation), with a floor on the row norm
               for fp16's subnormals (``centroids.half_row_floor``). ``TORCHKM_HALF_OPERANDS=0``:
               tf32.
  ``"exact"``  the fast pass also keeps the best two candidates and the third-best score. Each
               row's best two are compared by direct fp32 distances. A row is re-searched with
               3xTF32 products against all centroids (persistent launches over just those rows,
               the centroids split into chunks across program columns, then the rows' epilogue)
               when the third score could hide a closer centroid: the third score, less the bound
               on the error of the rows' operand rounding and the fp32 sums
               (``score_bound_coefficients``), and less what rounding the centroids can add,
               ``2 (x - c).r + ||r||^2`` for a centroid rounded by ``r`` (bounded through the
               distance itself, so it is small for the close centroids that decide), must leave a
               distance above the winner's. The epilogue also bounds that distance from the
               difference of the third score and the best (``_pair_floor``; over the Hopper
               search's packed record and the tl.dot searches' records but the lazy packed one):
               the rows' operand rounding is the same in both, so only its projection on the two
               centroids' difference remains, which settles rows near boundaries between close
               centroids. Where direct fp32 distances decide between centroids (the best two,
               a third, the candidates below) and lie within their rounding of each other
               (``_common.fp32_tie``), float64 distances of the fp32 values decide instead: the
               fp32 sums' order follows each launch's layout, and this way every kernel (the
               pruned engines' too) settles such a row alike. Labels then equal those of an fp32
               computation up to ties within fp32 rounding. Over many centroids (a split re-search) the deferred rows
               are first scored again with the fast product, in the centroid chunks whose lowest
               score in the pass could hide a winner, and the centroids whose scores could
               still win (up to 16 a row) are compared by direct fp32 distances
               (``_candidate_plan_kernel``, ``_candidate_kernel``; with fp16 operands from an fp16
               copy of the deferred rows the plan writes); only rows with more take the 3xTF32 products.
               A deferred row whose winner so far has every centroid within ``2 sqrt(D)`` listed
               (``centroids.centroid_neighbours``: tight clusters split among several centroids)
               takes the winner and that list as its candidates instead, re-scored by no chunk. Scaled (cosine) rows, and fp32 rows of at most 32
               features, use a cruder bound on the whole gap in raw-row units
               (``gap_bound_coefficient``; the best two compared directly only inside it); for
               scaled bf16 rows the centroids then enter as two bf16 parts (two products per
               tile), which leaves few rows inside it.
               For rows of at most 32 features and at most 128 centroids, every row is searched
               with 3xTF32 products instead (cheaper there; ``configs.exact_as_tf32x3``).
  ``"tf32x3"`` / ``"ieee"``  every row with 3xTF32 / fp32 FMA products (reference modes).
Rows may be centred on ``offset`` and scaled by ``row_scale`` (cosine) as they are loaded, so no
transformed copy of x ever exists.

On Hopper GPUs, for the rows ``hopper_search.supported`` takes (33-256 features, unscaled, no row
list; the exact mode, and the fast mode for fp32 and packed bf16 rows), the search runs in
``hopper_search.py`` (a Gluon kernel whose running minimum overlaps the next product) and writes a
per-row record; this kernel then runs its epilogue from that record (``SEARCHED``).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from . import hopper_search
from ._common import (
    ATOMIC_ADDRESS_FROM_MASK,
    FLOAT64_TIES,
    NEAR_SCORE_TIES,
    TIE_D,
    TIE_ROW_D,
    UPDATE_ATOMIC,
    UPDATE_CARRY,
    UPDATE_DELTA,
    UPDATE_NONE,
    UPDATE_ONEHOT,
    ReplayedCall,
    accumulate_rows,
    carries,
    carry_rows,
    carry_width,
    flush_carry,
    fp32_tie,
    launch_key,
    launcher,
    move_rows,
    nearer64,
    onehot_max_k,
    onehot_width,
    persistent_grid,
    sq_dist64_part,
    transform_rows,
    unused,
)
from .centroids import _PREPARE_ROWS_TL as PREPARE_ROWS
from .centroids import (
    HALF_ROW_FLOOR,
    _neighbour_reach,
    _round_tf32,
    amax_parts,
    centroid_neighbours,
    centroid_parts,
    prepare_centroids,
    row_norms,
)
from .configs import (
    FEW_ROWS,
    assign_config,
    atomic_replicas,
    candidate_chunks,
    candidate_config,
    candidate_exact_config,
    exact_as_tf32x3,
    lazy_register_cap,
    num_persistent_programs,
    small_d_launch,
    tf32x3_rows_config,
)
from .update import add_sorted_sums

__all__ = ["PRECISIONS", "AssignOutput", "PassSums", "assign", "assign_keeping_sums", "assign_reference", "gap_bound_coefficient", "pair_bound_coefficients",
           "score_bound_coefficients"]

PRECISIONS = ("exact", "fast", "tf32x3", "ieee")

logger = logging.getLogger("torchkm")


@triton.jit
def _tile(
    t, x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, c32_ptr, offset_ptr, scale_ptr, norm_ptr, weight_ptr, c_norm_ptr,
    row_index_ptr, row_count, tile_offset, searched_stride,
    labels_ptr, sq_dist_ptr, lower_ptr, prev_ptr, flag_count_ptr, flag_rows_ptr, key_ptr, searched_ptr, sums_ptr, counts_ptr,
    n, k, d, stride_xn, stride_xd, bound_coef, bias_coef, pair_coef, pair_acc_coef, replica, acc_sums, acc_counts, chunk_min_ptr, min_chunk, half_ptr, xh_ptr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_ROW_INDEX: tl.constexpr, CHECK: tl.constexpr, STORE_SQ_DIST: tl.constexpr, STORE_LOWER: tl.constexpr,
    HAS_PREV: tl.constexpr, UPDATE: tl.constexpr, RAW_MMA: tl.constexpr, PRECISION: tl.constexpr,
    ONE_CHUNK: tl.constexpr, EAGER: tl.constexpr, EPI_D: tl.constexpr, SPLIT: tl.constexpr, SWAP: tl.constexpr, KEYS: tl.constexpr, SEARCHED: tl.constexpr,
    DISTANCE_BOUND: tl.constexpr, CHUNK_MINS: tl.constexpr, PACK_KEYS: tl.constexpr, HALF: tl.constexpr, LAZY_BITS: tl.constexpr, PAIR_BITS: tl.constexpr,
    CENTRED: tl.constexpr, x_pre, prev_pre, w_pre, PREFETCH: tl.constexpr, ONE_TILE: tl.constexpr, c_res, c_lo_res, bias_res, offset_res,
):
    tl.static_assert(UPDATE != 4 or HAS_PREV, "moving rows between clusters needs their previous labels")
    tl.static_assert(not ONE_TILE or (not EAGER and not SWAP and not SEARCHED and LAZY_BITS == 0 and KEYS != 2),
                     "one centroid tile: the row-oriented lazy search")
    tl.static_assert(not PREFETCH or (ONE_CHUNK and UPDATE == 3 and not HAS_ROW_INDEX and not SEARCHED and not HALF),
                     "a tile loaded ahead (``_assign_programs``): whole rows in one chunk, carried sums")
    # The lazy searches (and the Hopper search's record) also name a third candidate (``label3``,
    # -1 for none) and bound every other score (``fourth``): under the distance bound, a row whose
    # third could beat the winner compares it directly and is re-searched only if the rest could.
    # (DISTANCE_BOUND = 1: without; TORCHKM_EXACT_THIRD=0, experiments.)
    THIRD: tl.constexpr = DISTANCE_BOUND == 2 and (SEARCHED or not EAGER)
    # The exact mode's 3xTF32 search of every row over one centroid tile (``configs.exact_as_tf32x3``)
    # takes the lowest score, which no direct distance checks. With ``TORCHKM_X3_TIES=1``
    # (``_common.NEAR_SCORE_TIES``; off by default: it costs those passes 20-75 %) rows with another
    # score within the scores' rounding of it are settled by direct fp32 distances (float64 on fp32
    # ties) below, as the best-two route (and so the bounds engine) settles them. Up to 128
    # centroids: a row's near centroids are counted, and two named, by one packed sum.
    X3_TIES: tl.constexpr = (NEAR_SCORE_TIES and FLOAT64_TIES and ONE_TILE and not CHECK and PRECISION == "tf32x3" and BLOCK_K <= 128
                             and ONE_CHUNK != 0 and not HAS_ROW_INDEX)
    # A persistent program's one centroid tile, its bias and the offset, loaded once before its
    # tiles of rows (``c_res``, ``c_lo_res``, ``bias_res``, ``offset_res``; ``_assign_programs``).
    RESIDENT: tl.constexpr = PREFETCH != 0 and ONE_TILE
    slots = t * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_ROW_INDEX:
        row_mask = slots < row_count
        rows = tl.load(row_index_ptr + slots, mask=row_mask, other=0).to(tl.int64)
    else:
        # 64-bit row offsets: n * stride can pass 2^31 elements.
        # ``tile_offset``: the first tile of a launch over a chunk of the rows (a searched pass).
        rows = (tl.zeros((BLOCK_N,), tl.int64) + t + tile_offset) * BLOCK_N + tl.arange(0, BLOCK_N)  # t may be a Python int (interpreter)
        row_mask = rows < n
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
    else:
        scale = tl.full((BLOCK_N,), 1.0, tl.float32)
    if RAW_MMA and HAS_SCALE:
        raw_norm = tl.load(norm_ptr + rows, mask=row_mask, other=1.0)
    mma_dtype = c_mma_ptr.dtype.element_ty
    tile_cols = tl.arange(0, BLOCK_K)
    dims0 = tl.arange(0, BLOCK_D)

    tl.static_assert(not CHUNK_MINS or (EAGER and not SWAP and not SEARCHED), "chunk minima come from the eager search")
    tl.static_assert(not PACK_KEYS or (EAGER and CHECK and DISTANCE_BOUND != 0), "packed keys: the eager exact search")
    tl.static_assert(LAZY_BITS == 0 or (not EAGER and not SWAP and not SEARCHED and ONE_CHUNK and RAW_MMA
                                        and not HAS_SCALE and not SPLIT),
                     "packed keys in the lazy search: raw unscaled rows in one chunk, one product")
    tl.static_assert(not HALF or (RAW_MMA and not HAS_SCALE and not SPLIT and not HAS_ROW_INDEX
                                  and (SEARCHED or (EAGER and not SWAP and not ONE_CHUNK))),
                     "fp16 operands for fp32 rows: the eager streamed search of raw rows, a chunk at a time, "
                     "or the Hopper search's record")
    if HALF:
        # fp16 operands (``AssignPass``): rows scaled by s (a copy of the launch's chunk), the
        # centroids and the bias by s and s^2 in ``prepare_centroids``; the tile's best scores (or
        # the Hopper search's record) are scaled back by s^-2.
        half_unscale = tl.load(half_ptr + 1)
    if EAGER:
        # Per-row running best, its index, and (CHECK) the second best with its index and the
        # third-best score.
        best = tl.full((BLOCK_N,), float("inf"), tl.float32)
        if CHUNK_MINS:
            chunk_best = tl.full((BLOCK_N,), float("inf"), tl.float32)
        label = tl.zeros((BLOCK_N,), tl.int32)
        if CHECK:
            second = tl.full((BLOCK_N,), float("inf"), tl.float32)
            label2 = tl.zeros((BLOCK_N,), tl.int32)
            third = tl.full((BLOCK_N,), float("inf"), tl.float32)
    elif SWAP:
        # The product transposed: scores (centroids x rows), the row tile as the right operand.
        best_t = tl.full((BLOCK_K, BLOCK_N), float("inf"), tl.float32)
        tile_t = tl.zeros((BLOCK_K, BLOCK_N), tl.int32)
        if CHECK:
            # Per slot also the second-lowest score over the tiles (its index is not kept).
            second_t = tl.full((BLOCK_K, BLOCK_N), float("inf"), tl.float32)
    else:
        # Per-column running best score and the k0 of the tile it came from; with CHECK also each
        # column's second-lowest score over the tiles (its index is not kept), as in SWAP.
        best_t = tl.full((BLOCK_N, BLOCK_K), float("inf"), tl.float32)
        tile_t = tl.zeros((BLOCK_N, BLOCK_K), tl.int32)
        if CHECK:
            second_t = tl.full((BLOCK_N, BLOCK_K), float("inf"), tl.float32)
    if ONE_CHUNK:
        # The whole row fits one chunk: load and transform it once for all centroid tiles.
        if PREFETCH:
            x_raw = x_pre
        else:
            x_raw = tl.load(x_ptr + rows[:, None] * stride_xn + dims0[None, :] * stride_xd,
                            mask=row_mask[:, None] & (dims0 < d)[None, :], other=0.0)
        if RESIDENT:
            shift0 = offset_res
        else:
            shift0 = tl.load(offset_ptr + dims0, mask=(dims0 < d) & HAS_OFFSET, other=0.0)
        if RAW_MMA:
            x_once = x_raw
        else:
            x_once = transform_rows(x_raw, row_mask, shift0, scale, HAS_OFFSET, HAS_SCALE).to(mma_dtype)
        if X3_TIES:
            # The rows' squared norms, for the near scores' bound (in the loaded tile's layout).
            x_loaded = transform_rows(x_raw.to(tl.float32), row_mask, shift0, scale, HAS_OFFSET, HAS_SCALE)
            x_sq = tl.sum(x_loaded * x_loaded, axis=1)
        if SWAP:
            x_once_t = tl.trans(x_once)
        if LAZY_BITS > 0:
            # Packed keys (``LAZY_BITS``): the accumulator starts at this row term plus the bias, so it
            # holds the squared distance and a margin (>= 0 but for rounding, as the key order needs):
            # the centred row's squared norm and 2^-5 of it, and 2^-5 of the raw row's, which
            # covers the products' rounding of raw (uncentred) rows.
            x_f = x_once.to(tl.float32)
            if HAS_OFFSET:
                x_c = tl.where((dims0 < d)[None, :],
                               x_f - tl.load(offset_ptr + dims0, mask=dims0 < d, other=0.0)[None, :], 0.0)
                row_term = tl.sum(x_c * x_c, axis=1) * (1.0 + 2.0**-5) + tl.sum(x_f * x_f, axis=1) * 2.0**-5
            else:
                row_term = tl.sum(x_f * x_f, axis=1) * (1.0 + 2.0**-5)
    tl.static_assert(not SEARCHED or (EAGER and not SWAP and not HAS_ROW_INDEX),
                     "a searched pass reads its rows' results in the eager search's variables")
    if KEYS == 2:
        # The split re-search found each listed row's label: only the epilogue runs.
        search_end = 0
    else:
        search_end = k
    # The Hopper search found each row's candidates (SEARCHED): no search is compiled, as the
    # centroid operand may then be fp16 for fp32 rows (fp16 operands), which it would not take.
    if not SEARCHED:
        # ONE_TILE: every centroid in the first tile (``AssignPass``): one step, known when compiled.
        tiles_end = BLOCK_K if ONE_TILE else search_end
        for k0 in range(0, tiles_end, BLOCK_K):
            cols = k0 + tile_cols
            col_mask = cols < k
            # Padded centroids score +inf, so they never win and never count as second best (packed:
            # 3e38, as an infinite key's tile bits would make it a NaN; decoded as +inf).
            if RESIDENT:
                bias = bias_res
            elif ONE_CHUNK == 2:
                bias = tl.load(bias_ptr + cols)  # whole tiles (``_one_chunk``)
            else:
                bias = tl.load(bias_ptr + cols, mask=col_mask, other=3.0e38 if LAZY_BITS > 0 else float("inf"))
            if SWAP:
                # (SWAP implies ONE_CHUNK, a lazy minimum and one product; see AssignPass.)
                if RAW_MMA and HAS_SCALE:
                    acc_t = bias[:, None] * raw_norm[None, :]
                else:
                    acc_t = tl.zeros((BLOCK_K, BLOCK_N), tl.float32) + bias[:, None]
                c_offs = cols[:, None].to(tl.int64) * d + dims0[None, :]
                c_mask = col_mask[:, None] & (dims0 < d)[None, :]
                acc_t = tl.dot(tl.load(c_mma_ptr + c_offs, mask=c_mask, other=0.0), x_once_t, acc_t,
                               input_precision=PRECISION)
                better = acc_t < best_t
                if CHECK:
                    second_t = tl.where(better, best_t, tl.minimum(second_t, acc_t))
                best_t = tl.where(better, acc_t, best_t)
                tile_t = tl.where(better, k0, tile_t)
            else:
                if RAW_MMA and HAS_SCALE:
                    # Raw rows, unit centroids: the score of row x is ||x|| (bias - 2 x_hat.c), same argmin.
                    acc = bias[None, :] * raw_norm[:, None]
                elif LAZY_BITS > 0:
                    acc = row_term[:, None] + bias[None, :]
                else:
                    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32) + bias[None, :]
                if RESIDENT:
                    acc = tl.dot(x_once, tl.trans(c_res), acc, input_precision=PRECISION)
                    if SPLIT:
                        acc = tl.dot(x_once, tl.trans(c_lo_res), acc, input_precision=PRECISION)
                elif ONE_CHUNK == 2:
                    # Whole tiles of whole rows (``_one_chunk``): no masks, and 32-bit offsets of a
                    # constant stride, so each tile's addresses cost a few instructions (sm_90 SASS at
                    # 245,760 x 32 x 1,024: 174 -> 142 a tile exact, 198 -> 165 fast).
                    c_offs = cols[:, None] * BLOCK_D + dims0[None, :]
                    acc = tl.dot(x_once, tl.trans(tl.load(c_mma_ptr + c_offs)), acc, input_precision=PRECISION)
                    if SPLIT:
                        acc = tl.dot(x_once, tl.trans(tl.load(c_lo_ptr + c_offs)), acc, input_precision=PRECISION)
                elif ONE_CHUNK:
                    # No loop over the features: the centroid tile's load is then pipelined across tiles.
                    c_offs = cols[:, None].to(tl.int64) * d + dims0[None, :]
                    c_mask = col_mask[:, None] & (dims0 < d)[None, :]
                    acc = tl.dot(x_once, tl.trans(tl.load(c_mma_ptr + c_offs, mask=c_mask, other=0.0)), acc,
                                 input_precision=PRECISION)
                    if SPLIT:
                        acc = tl.dot(x_once, tl.trans(tl.load(c_lo_ptr + c_offs, mask=c_mask, other=0.0)), acc,
                                     input_precision=PRECISION)
                else:
                    for d0 in range(0, d, BLOCK_D):
                        dims = d0 + dims0
                        dim_mask = dims < d
                        if RAW_MMA and not HALF:
                            x_tile = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                                             mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
                        elif HALF:
                            # The launch's chunk of rows, scaled into fp16 by ``_half_rows_kernel``
                            # (``xh_ptr``: contiguous, from row ``tile_offset * BLOCK_N``).
                            x_tile = tl.load(xh_ptr + (rows - tile_offset * BLOCK_N)[:, None] * d + dims[None, :],
                                             mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
                        else:
                            x_tile = transform_rows(
                                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                                row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE).to(mma_dtype)
                        c_offs = cols[:, None].to(tl.int64) * d + dims[None, :]
                        c_mask = col_mask[:, None] & dim_mask[None, :]
                        acc = tl.dot(x_tile, tl.trans(tl.load(c_mma_ptr + c_offs, mask=c_mask, other=0.0)), acc,
                                     input_precision=PRECISION)
                        if SPLIT:
                            acc = tl.dot(x_tile, tl.trans(tl.load(c_lo_ptr + c_offs, mask=c_mask, other=0.0)), acc,
                                         input_precision=PRECISION)
                if EAGER:
                    # Reduce the tile per row at once: few registers, so large tiles (and deep d) fit.
                    if CHECK and PACK_KEYS:
                        # Each score's column in its lowest bits: the lowest three keys are the best
                        # three scores with their columns (ties in the upper bits to either). What the
                        # cleared bits hide is in the bound (``AssignPass._bound_arguments``). Scores
                        # are capped below +inf (padding), still above 3e38 ("none"). The three come
                        # from a merging network over each thread's keys (``_lowest_three``, about 4.5
                        # operations a score: 1M x 768 bf16 exact pass 35.4 -> 32.3 ms, BENCHMARKS.md
                        # 2026-11-28) instead of three successive minima that each mask the one
                        # before (9). (Tried before it: finite padding instead of the cap, no change
                        # in time; one reduction of sorted triples, 9 a score, the leaves' +inf stays
                        # in the min/max; runs of four adjacent keys sorted first, which go through
                        # shared memory: only splits along a thread's own columns move no data.)
                        low: tl.constexpr = BLOCK_K - 1
                        if PACK_KEYS == 2:
                            # The lowest three at once (``_lowest_three``), the key in one lop3.
                            key = _packed_key(tl.minimum(acc, 3.2e38), tile_cols[None, :], -BLOCK_K, _ASM_LOP3)
                            m1, m2, m3 = _lowest_three(key)
                            j2 = m2.to(tl.int32, bitcast=True) & low
                        else:
                            key = ((tl.minimum(acc, 3.2e38).to(tl.int32, bitcast=True) & -BLOCK_K)
                                   | tile_cols[None, :]).to(tl.float32, bitcast=True)
                            m1 = tl.min(key, axis=1)
                        j1 = m1.to(tl.int32, bitcast=True) & low
                    else:
                        m1 = tl.min(acc, axis=1)
                        j1 = tl.min(tl.where(acc == m1[:, None], tile_cols[None, :], BLOCK_K), axis=1)
                    if HALF:
                        # Back to the scores' unit: exact (a power of two), so a key keeps its column
                        # bits; the capped padding stays above 3e38.
                        m1 = tl.where(m1 >= 3.0e38, m1, m1 * half_unscale)
                    if CHUNK_MINS:
                        # Each row's lowest score in every ``min_chunk`` centroids (row-major, one
                        # float a chunk): the candidate re-search then scores a deferred row again
                        # only in the chunks that could hold a winner.
                        chunk_best = tl.minimum(chunk_best, m1)
                        if (k0 + BLOCK_K) % min_chunk == 0 or k0 + BLOCK_K >= k:
                            tl.store(chunk_min_ptr + rows * tl.cdiv(k, min_chunk) + k0 // min_chunk, chunk_best, mask=row_mask)
                            chunk_best = tl.full((BLOCK_N,), float("inf"), tl.float32)
                    if CHECK:
                        if PACK_KEYS == 2:
                            pass  # m2, m3 (and j2) above
                        elif PACK_KEYS:
                            # (by column: m1 may be scaled back already)
                            rest = tl.where(tile_cols[None, :] == j1[:, None], float("inf"), key)
                            m2 = tl.min(rest, axis=1)
                            j2 = m2.to(tl.int32, bitcast=True) & low
                            m3 = tl.min(tl.where(tile_cols[None, :] == j2[:, None], float("inf"), rest), axis=1)
                        else:
                            rest = tl.where(tile_cols[None, :] == j1[:, None], float("inf"), acc)
                            m2 = tl.min(rest, axis=1)
                            j2 = tl.min(tl.where(rest == m2[:, None], tile_cols[None, :], BLOCK_K), axis=1)
                            m3 = tl.min(tl.where(tile_cols[None, :] == j2[:, None], float("inf"), rest), axis=1)
                        if HALF:
                            m2 = tl.where(m2 >= 3.0e38, m2, m2 * half_unscale)
                            m3 = tl.where(m3 >= 3.0e38, m3, m3 * half_unscale)
                        # Merge the sorted (best, second, third) with the tile's; running entries come from
                        # lower indices, so they win ties (strict comparisons).
                        tile_first = m1 < best
                        tile_second_a = m2 < best  # when the tile holds the new best
                        tile_second_b = m1 < second  # when it does not
                        third = tl.where(tile_first,
                                         tl.where(tile_second_a, tl.minimum(best, m3), tl.minimum(second, m2)),
                                         tl.where(tile_second_b, tl.minimum(second, m2), tl.minimum(third, m1)))
                        label2 = tl.where(tile_first, tl.where(tile_second_a, k0 + j2, label),
                                          tl.where(tile_second_b, k0 + j1, label2))
                        second = tl.where(tile_first, tl.where(tile_second_a, m2, best),
                                          tl.where(tile_second_b, m1, second))
                    better = m1 < best
                    best = tl.where(better, m1, best)
                    label = tl.where(better, k0 + j1, label)
                elif LAZY_BITS > 0:
                    # The tile's number in the lowest bits of the (non-negative) accumulator: one float
                    # minimum keeps each slot's best with its tile, ties to the lower tile (two
                    # instructions a score instead of three; four instead of five with CHECK, and no
                    # predicated copies). Decoded after the loop (``_lazy_key_floor``).
                    key = _tile_key(acc, k0 // BLOCK_K, LAZY_BITS, _ASM_LOP3)
                    if CHECK:
                        second_t = tl.minimum(second_t, tl.maximum(best_t, key))
                    best_t = tl.minimum(best_t, key)
                elif ONE_TILE:
                    # The only tile: its scores are the best (and no second within a column).
                    best_t = acc
                else:
                    # Strictly better only: an equal score in a later tile keeps the lower index.
                    better = acc < best_t
                    if CHECK:
                        second_t = tl.where(better, best_t, tl.minimum(second_t, acc))
                    best_t = tl.where(better, acc, best_t)
                    tile_t = tl.where(better, k0, tile_t)

    if SWAP:
        best = tl.min(best_t, axis=0)
        index_t = tile_t + tile_cols[:, None]
        label = tl.min(tl.where(best_t == best[None, :], index_t, 2147483647), axis=0)
        if CHECK:
            # The runner-up among the other slots has a known index (label2). A third candidate is
            # the lowest of everything else: the slot-mates of both (second_t) and the other
            # slots' best. A runner-up that shares the winner's slot has no index, so it counts as
            # a third and the row is re-searched (rare: 1 in BLOCK_K of the close pairs).
            at_best = index_t == label[None, :]
            others = tl.where(at_best, float("inf"), best_t)
            second = tl.min(others, axis=0)
            label2 = tl.min(tl.where(others == second[None, :], index_t, 2147483647), axis=0)
            at_second = index_t == label2[None, :]
            third = tl.min(tl.where(at_best | at_second, second_t, best_t), axis=0)
            second = tl.minimum(second, tl.min(tl.where(at_best, second_t, float("inf")), axis=0))
            if THIRD:
                label3, fourth = _third_candidate(best_t, second_t, index_t, at_best | at_second, 0)
    elif not EAGER:
        if LAZY_BITS > 0:
            tile_t = (best_t.to(tl.int32, bitcast=True) & ((1 << LAZY_BITS) - 1)) * BLOCK_K
            best_t = _lazy_key_floor(best_t, row_term, LAZY_BITS)
            if CHECK:
                second_t = _lazy_key_floor(second_t, row_term, LAZY_BITS)
        best = tl.min(best_t, axis=1)
        index_t = tile_t + tile_cols[None, :]
        if X3_TIES:
            # A score is ||c||^2 - 2 x.c in 3xTF32 products: each product off by at most 3 2^-22 of
            # |x_i c_i| (the operands' split, the dropped lo * lo), each of the 3d + 1 fp32 sums by
            # 2^-24 of what it holds, at most M = ||c||^2 + 2 ||x|| ||c|| <= 8 ||x||^2 + 2 ||x - c||^2.
            # So two scores' difference is off by at most 2.5 (4d + 32) 2^-24 M (the usual 1.25, room
            # for the bias's rounding) for every centroid no farther from x than r, r^2 an upper bound
            # on the winner's squared distance (its score plus ||x||^2, with room for their rounding:
            # d <= 32). A centroid farther than r is farther than the winner whatever its score says;
            # any other that could be nearer scores within that bound of the best: the near ones.
            reach_sq = tl.maximum(best + x_sq, 0.0) + (tl.abs(best) + x_sq) * 2.0**-10
            near_gap = (2.5 * (4 * d + 32) * 5.9604645e-08 * (1.0 + 2.0**-10)) * (8.0 * x_sq + 2.0 * reach_sq) + 1.0e-30
            near = best_t <= (best + near_gap)[:, None]
            # Per near centroid j: 1 + j 2^8 + j^2 2^16, summed: the count in the low 8 bits, and for
            # two the sum and the sum of squares of their indices, which name both (j < 128).
            pack_cols = 1 + (tile_cols << 8) + ((tile_cols * tile_cols) << 16)
            packed = tl.sum(tl.where(near, pack_cols[None, :], 0), axis=1)
            # (One near centroid: the label; more: settled in the epilogue, from ``packed``.)
            label = tl.where((packed & 255) == 1, (packed >> 8) & 255, 0)
        else:
            label = tl.min(tl.where(best_t == best[:, None], index_t, 2147483647), axis=1)
        if CHECK:  # the transposed search's reduction, along the other axis
            at_best = index_t == label[:, None]
            others = tl.where(at_best, float("inf"), best_t)
            second = tl.min(others, axis=1)
            label2 = tl.min(tl.where(others == second[:, None], index_t, 2147483647), axis=1)
            at_second = index_t == label2[:, None]
            third = tl.min(tl.where(at_best | at_second, second_t, best_t), axis=1)
            second = tl.minimum(second, tl.min(tl.where(at_best, second_t, float("inf")), axis=1))
            if THIRD:
                label3, fourth = _third_candidate(best_t, second_t, index_t, at_best | at_second, 1)
    if SEARCHED:
        # hopper_search.search's record of this launch's chunk of rows, (2 or 7, searched_stride):
        # best score, its index (int32 bits); with CHECK the second best, its index, the third-best
        # score, a third candidate's index and a bound on the rest. ``slots`` are the rows' places
        # in the chunk.
        best = tl.load(searched_ptr + slots, mask=row_mask, other=float("inf"))
        label = tl.load(searched_ptr + searched_stride + slots, mask=row_mask, other=0.0).to(tl.int32, bitcast=True)
        if CHECK:
            second = tl.load(searched_ptr + 2 * searched_stride + slots, mask=row_mask, other=float("inf"))
            label2 = tl.load(searched_ptr + 3 * searched_stride + slots, mask=row_mask,
                             other=0.0).to(tl.int32, bitcast=True)
            third = tl.load(searched_ptr + 4 * searched_stride + slots, mask=row_mask, other=float("inf"))
            if THIRD:
                label3 = tl.load(searched_ptr + 5 * searched_stride + slots, mask=row_mask,
                                 other=0.0).to(tl.int32, bitcast=True)
                fourth = tl.load(searched_ptr + 6 * searched_stride + slots, mask=row_mask, other=float("inf"))
        if HALF:
            # Exact (a power of two; inf, "none", stays inf).
            best = best * half_unscale
            if CHECK:
                second = second * half_unscale
                third = third * half_unscale
                if THIRD:
                    fourth = fourth * half_unscale
    if KEYS == 2:
        label = _label_of_key(tl.load(key_ptr.to(tl.pointer_type(tl.uint64)) + slots, mask=row_mask, other=0))
    tl.static_assert(not DISTANCE_BOUND or (CHECK and not HAS_SCALE), "the distance bound is for unscaled rows")
    done = row_mask
    if CHECK:
        row_norm = tl.load(norm_ptr + rows, mask=row_mask, other=0.0)
        if HALF:
            # fp16's subnormals round by an absolute amount: the bound takes at least this norm
            # (``centroids.half_row_floor``).
            row_norm = tl.maximum(row_norm, tl.load(half_ptr + 2))
        # The largest centroid norm, residual norm and |bias|, from ``prepare_centroids``' maxima of
        # each run of PREPARE_ROWS centroids (a few cached loads per tile of rows). (Inline: torch's
        # mutation analysis counts a helper's pointer as written when what it returns reaches a
        # store's address, see tests/kernels/test_mutations.py.)
        parts = tl.cdiv(k, PREPARE_ROWS)
        norms = tl.zeros((BLOCK_K,), tl.float32)
        residuals = tl.zeros((BLOCK_K,), tl.float32)
        biases = tl.zeros((BLOCK_K,), tl.float32)
        for p0 in range(0, parts, BLOCK_K):
            mask = p0 + tile_cols < parts
            norms = tl.maximum(norms, tl.load(c_norm_ptr + p0 + tile_cols, mask=mask, other=0.0))
            residuals = tl.maximum(residuals, tl.load(c_norm_ptr + parts + p0 + tile_cols, mask=mask, other=0.0))
            biases = tl.maximum(biases, tl.load(c_norm_ptr + 2 * parts + p0 + tile_cols, mask=mask, other=0.0))
        c_norm_max = tl.max(norms, axis=0)
        residual_max = tl.max(residuals, axis=0)
        bias_max = tl.max(biases, axis=0)
        if DISTANCE_BOUND:
            # Each score's error besides the centroids' rounding (which the distance bounds below):
            # the rows' operand rounding and the fp32 accumulation. A little over the residual's
            # computed norm, for its own rounding.
            bound = bound_coef * row_norm * c_norm_max + bias_coef * bias_max
            residual_max = residual_max * 1.001
            # Every row's best two are compared by direct fp32 distances (if it has two). (Only
            # those inside the gap bound: measured slower, 1M x 128 fp32 5.98 -> 6.35 ms.)
            resolve = row_mask & (second < 3.0e38)
        else:
            # Scores are in raw-row units, so the bound uses the raw row norm.
            bound = bound_coef * row_norm * c_norm_max
            if LAZY_BITS > 0:
                # The decoded best is lowered by up to twice ``_lazy_key_floor``'s slack, so the gaps
                # from it may be widened by that much (the others' lowering only narrows them). Its
                # key was the row term plus the score: at most both magnitudes.
                bound += 2.0 * ((tl.minimum(tl.abs(best), 1.0e38) + row_term) * 2.0 ** (LAZY_BITS - 22)
                                + row_term * 2.0**-17)
            # The true best is among the best two unless a third score is inside the bound too:
            # settle those rows below from direct fp32 distances; defer the rest to the re-search.
            resolve = row_mask & (second - best <= bound)
            flag = row_mask & (third - best <= bound)

    if PREFETCH:
        # The tile loaded ahead holds the whole rows: the distances and the sums take them from it.
        x_rows = transform_rows(x_raw, row_mask, shift0, scale, HAS_OFFSET, HAS_SCALE)
    if PREFETCH == 2 and HAS_WEIGHT:
        w = w_pre
    elif HAS_WEIGHT:
        w = tl.load(weight_ptr + rows, mask=row_mask, other=0.0)
    else:
        w = tl.full((BLOCK_N,), 1.0, tl.float32)
    # Epilogue: the exact distance to the winner (and the sums), reading the rows again from cache,
    # in narrower chunks than the search (64-bit row pointers of a wide chunk would spill).
    epi_dims = tl.arange(0, EPI_D)
    sq_dist = tl.zeros((BLOCK_N,), tl.float32)
    if CHECK:
        # Direct fp32 distances to both candidates; the second is read only for rows to settle.
        # The sums wait for the final labels: a second sweep of the (cached) rows, as fusing them
        # into this sweep spills registers.
        sq_dist2 = tl.zeros((BLOCK_N,), tl.float32)
        x_sq = tl.zeros((BLOCK_N,), tl.float32)
        label2_64 = label2.to(tl.int64)
        for d0 in range(0, d, EPI_D):
            dims = d0 + epi_dims
            dim_mask = dims < d
            xr = transform_rows(
                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
            cr = tl.load(c32_ptr + label.to(tl.int64)[:, None] * d + dims[None, :],
                         mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
            cr2 = tl.load(c32_ptr + label2_64[:, None] * d + dims[None, :],
                          mask=resolve[:, None] & dim_mask[None, :], other=0.0)
            diff = xr - cr
            diff2 = xr - cr2
            sq_dist += tl.sum(diff * diff, axis=1)
            sq_dist2 += tl.sum(diff2 * diff2, axis=1)
            if STORE_LOWER or DISTANCE_BOUND:
                x_sq += tl.sum(xr * xr, axis=1)
        best_sq = sq_dist  # the record's best's direct distance (``_pair_floor``)
        if CENTRED:
            tl.static_assert(SEARCHED and HALF and HAS_OFFSET and DISTANCE_BOUND != 0,
                             "centred operands: the Hopper search's fp16 rows less the offset, exact mode")
            # The search rounded the centred rows, fl(x - m) s (``hopper_search._half_rows``), the
            # values this sweep read: their operand error is relative to the norm it just summed
            # (x_sq, fp32: within (d + 16) units of its last place, root included), not the raw
            # norm, and the search's bias is ||c~||^2 <= (max ||c|| + R)^2.
            row_norm = tl.maximum(tl.sqrt(x_sq) * (1.0 + (d + 16) * 1.1920929e-07), tl.load(half_ptr + 2))
            bias_max = (c_norm_max + residual_max) * (c_norm_max + residual_max) * (1.0 + 2.0**-20)
            bound = bound_coef * row_norm * c_norm_max + bias_coef * bias_max
        take2 = resolve & ((sq_dist2 < sq_dist) | ((sq_dist2 == sq_dist) & (label2 < label)))
        if FLOAT64_TIES:
            tie = resolve & fp32_tie(sq_dist, sq_dist2, d, EPI_D)
            # The fp32 sums' order is this launch's layout: float64 settles the pair the same way in
            # every kernel, so the dense and pruned passes give a row on an fp32 tie one label.
            if ONE_CHUNK == 0 and not HAS_ROW_INDEX:
                # Rows streamed in chunks of features (wide rows). A tile's few tied rows (usually
                # one, where it has any) are settled one at a time first, each row's features
                # spread over the whole program: a few dependent loads a row instead of the tile
                # sweep's d / TIE_D. Such a launch runs one program an SM, so nothing hid that
                # sweep: H100, 1M x 768, k = 8,192 bf16, float64 ties cost 0.6-1.2 ms of a 30 ms
                # iteration (BENCHMARKS.md 2026-12-07). (Not compiled where whole rows fit one
                # chunk: the sweep is short there, and the second path cost those launches up to
                # 22 registers and some spills; nor in passes over row lists, the pruned engines',
                # whose streamed launches then spilled 90-190 bytes more; sm_90, Triton 3.6.)
                n_tie = tl.sum(tie.to(tl.int32), axis=0)
                if n_tie * tl.cdiv(d, TIE_ROW_D) <= tl.cdiv(d, TIE_D):
                    slot_ids = tl.arange(0, BLOCK_N)
                    for _ in range(0, n_tie):
                        slot = tl.min(tl.where(tie, slot_ids, BLOCK_N), axis=0)
                        at = slot_ids == slot
                        tie_row = tl.sum(tl.where(at, rows, 0), axis=0)
                        label_a = tl.sum(tl.where(at, label, 0), axis=0).to(tl.int64)
                        label_b = tl.sum(tl.where(at, label2, 0), axis=0).to(tl.int64)
                        row_scale = tl.zeros((1,), tl.float32) + tl.sum(tl.where(at, scale, 0.0), axis=0)
                        one_row = tl.full((1,), 1, tl.int1)
                        row_a = tl.zeros((1,), tl.float64)
                        row_b = tl.zeros((1,), tl.float64)
                        for d0 in range(0, d, TIE_ROW_D):
                            dims = d0 + tl.arange(0, TIE_ROW_D)
                            dim_mask = dims < d
                            xr = transform_rows(
                                tl.load(x_ptr + tie_row * stride_xn + dims[None, :] * stride_xd, mask=dim_mask[None, :], other=0.0),
                                one_row, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), row_scale,
                                HAS_OFFSET, HAS_SCALE)
                            row_a += sq_dist64_part(xr, tl.load(c32_ptr + label_a * d + dims[None, :],
                                                                mask=dim_mask[None, :], other=0.0))
                            row_b += sq_dist64_part(xr, tl.load(c32_ptr + label_b * d + dims[None, :],
                                                                mask=dim_mask[None, :], other=0.0))
                        take2 = tl.where(at, tl.sum(nearer64(row_a, row_b, label_a, label_b).to(tl.int32), axis=0) > 0,
                                         take2)
                        tie = tie & (slot_ids != slot)
            if tl.max(tie.to(tl.int32), axis=0) > 0:
                dist_a = tl.zeros((BLOCK_N,), tl.float64)
                dist_b = tl.zeros((BLOCK_N,), tl.float64)
                for d0 in range(0, d, TIE_D):
                    dims = d0 + tl.arange(0, TIE_D)
                    dim_mask = dims < d
                    tie_mask = tie[:, None] & dim_mask[None, :]
                    xr = transform_rows(
                        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=tie_mask, other=0.0),
                        tie, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET,
                        HAS_SCALE)
                    dist_a += sq_dist64_part(xr, tl.load(c32_ptr + label.to(tl.int64)[:, None] * d + dims[None, :],
                                                         mask=tie_mask, other=0.0))
                    dist_b += sq_dist64_part(xr, tl.load(c32_ptr + label2_64[:, None] * d + dims[None, :],
                                                         mask=tie_mask, other=0.0))
                take2 = tl.where(tie, nearer64(dist_a, dist_b, label, label2), take2)
        loser_sq = tl.where(take2, sq_dist, sq_dist2)
        label = tl.where(take2, label2, label)
        sq_dist = tl.where(take2, sq_dist2, sq_dist)
        if DISTANCE_BOUND:
            # Every other centroid scored at least ``third`` (``_distance_floor``); the winner's
            # direct distance carries a few roundings too: a margin of (d + 16) units on each.
            margin = (d + 16) * 1.1920929e-07
            others_low = _distance_floor(third, x_sq, bound, residual_max, margin)
            flag = row_mask & (third < 3.0e38) & (others_low <= sq_dist * (1.0 + margin))
            if PAIR_BITS > 0:
                # Only where a row is left to settle: the floor's roots cost the epilogue 9 % over
                # rows that settle without it (H200, 1M x 128 x 4096 N(0, 1) fp32, 325 -> 354 us).
                if tl.max(flag.to(tl.int32), axis=0) > 0:
                    others_low = tl.maximum(others_low, _pair_floor(
                        third, best, best_sq, x_sq, row_norm, c_norm_max, bias_max, residual_max, pair_coef,
                        pair_acc_coef, bias_coef, margin, PAIR_BITS - 1))
                    flag = row_mask & (third < 3.0e38) & (others_low <= sq_dist * (1.0 + margin))
            if THIRD:
                # Those rows compare their third candidate directly (few rows: the loads are masked,
                # and tiles without one skip the sweep); then only a fourth could still win.
                resolve3 = flag & (label3 >= 0)
                if tl.max(resolve3.to(tl.int32), axis=0) > 0:
                    sq_dist3 = tl.zeros((BLOCK_N,), tl.float32)
                    label3_64 = label3.to(tl.int64)
                    for d0 in range(0, d, EPI_D):
                        dims = d0 + epi_dims
                        dim_mask = dims < d
                        xr = transform_rows(
                            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=resolve3[:, None] & dim_mask[None, :], other=0.0),
                            resolve3, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
                        cr3 = tl.load(c32_ptr + label3_64[:, None] * d + dims[None, :],
                                      mask=resolve3[:, None] & dim_mask[None, :], other=0.0)
                        diff3 = xr - cr3
                        sq_dist3 += tl.sum(diff3 * diff3, axis=1)
                    take3 = resolve3 & ((sq_dist3 < sq_dist) | ((sq_dist3 == sq_dist) & (label3 < label)))
                    if FLOAT64_TIES:  # as the best two's tie above
                        tie = resolve3 & fp32_tie(sq_dist, sq_dist3, d, EPI_D)
                        if tl.max(tie.to(tl.int32), axis=0) > 0:
                            dist_a = tl.zeros((BLOCK_N,), tl.float64)
                            dist_b = tl.zeros((BLOCK_N,), tl.float64)
                            for d0 in range(0, d, TIE_D):
                                dims = d0 + tl.arange(0, TIE_D)
                                dim_mask = dims < d
                                tie_mask = tie[:, None] & dim_mask[None, :]
                                xr = transform_rows(
                                    tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=tie_mask, other=0.0),
                                    tie, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET,
                                    HAS_SCALE)
                                dist_a += sq_dist64_part(xr, tl.load(c32_ptr + label.to(tl.int64)[:, None] * d + dims[None, :],
                                                                     mask=tie_mask, other=0.0))
                                dist_b += sq_dist64_part(xr, tl.load(c32_ptr + label3_64[:, None] * d + dims[None, :],
                                                                     mask=tie_mask, other=0.0))
                            take3 = tl.where(tie, nearer64(dist_a, dist_b, label, label3), take3)
                    loser_sq = tl.where(resolve3, tl.minimum(loser_sq, tl.where(take3, sq_dist, sq_dist3)), loser_sq)
                    label = tl.where(take3, label3, label)
                    sq_dist = tl.where(take3, sq_dist3, sq_dist)
                    fourth_low = _distance_floor(fourth, x_sq, bound, residual_max, margin)
                    if PAIR_BITS > 0:
                        fourth_low = tl.maximum(fourth_low, _pair_floor(
                            fourth, best, best_sq, x_sq, row_norm, c_norm_max, bias_max, residual_max, pair_coef,
                            pair_acc_coef, bias_coef, margin, PAIR_BITS - 1))
                    others_low = tl.where(resolve3, fourth_low, others_low)
                    flag = tl.where(resolve3, (fourth < 3.0e38) & (fourth_low <= sq_dist * (1.0 + margin)), flag)
        done = row_mask & (flag == 0)
        n_flag = tl.sum(flag.to(tl.int32), axis=0)
        base = tl.atomic_add(flag_count_ptr, n_flag)
        pos = base + tl.cumsum(flag.to(tl.int32), axis=0) - 1
        tl.store(flag_rows_ptr + pos, rows, mask=flag)
        if KEYS == 1:  # clear the split re-search's slots of these rows
            tl.store(key_ptr.to(tl.pointer_type(tl.uint64)) + pos, tl.zeros((BLOCK_N,), tl.uint64), mask=flag)
        if KEYS == 3:
            # The candidate re-search (``_candidate_kernel``) reads the winner so far from the slot:
            # its direct distance bounds which scores could still hide a closer centroid.
            tl.static_assert(DISTANCE_BOUND != 0, "the candidate re-search needs the distance bound")
            tl.store(key_ptr.to(tl.pointer_type(tl.uint64)) + pos, _key_of(sq_dist, label), mask=flag)
        if STORE_LOWER:
            # A lower bound on the squared distance to every centroid but the winner (the pruned
            # Lloyd's bounds). Deferred rows get 0.
            if DISTANCE_BOUND:
                # The other candidate's direct distance (or, unless compared, what its score
                # bounds), and what bounds all the others.
                second_low = _distance_floor(second, x_sq, bound, residual_max, margin)
                lower = tl.minimum(tl.where(resolve, loser_sq * (1.0 - margin), second_low), others_low)
            else:
                # The loser's score when the pair was settled directly, else the second-best score,
                # less the rounding bound of the fast products.
                lower = tl.where(take2, best, second) - bound
                if RAW_MMA and HAS_SCALE:
                    lower = lower / raw_norm
                lower = tl.maximum(lower + x_sq, 0.0)
            tl.store(lower_ptr + rows, tl.where(flag, 0.0, lower), mask=row_mask)
        w = tl.where(done, w, 0.0)
        label64 = label.to(tl.int64)
        if UPDATE == 1 or UPDATE == 2:
            for d0 in range(0, d, EPI_D):
                dims = d0 + epi_dims
                dim_mask = dims < d
                xr = transform_rows(
                    tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                    row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
                accumulate_rows(sums_ptr + replica * k * d, counts_ptr + replica * k, label64, w, done, xr, dims,
                                dim_mask, d0 == 0, k, d, KP, UPDATE)
        elif UPDATE == 4:
            prev64 = tl.load(prev_ptr + rows, mask=done, other=0).to(tl.int64)
            moved = done & (prev64 != label64)
            if tl.max(moved.to(tl.int32), axis=0) > 0:  # most tiles of a late pass move no row
                for d0 in range(0, d, EPI_D):
                    dims = d0 + epi_dims
                    dim_mask = dims < d
                    xr = transform_rows(
                        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
                    move_rows(sums_ptr, counts_ptr, label64, prev64, w, moved, xr, dims, dim_mask, d0 == 0, d)
    else:
        if X3_TIES:
            n_near = packed & 255
            if tl.max((row_mask & (n_near > 1)).to(tl.int32), axis=0) > 0:
                # Rows with near scores (few tiles): direct fp32 distances decide, float64 where those
                # lie within their rounding of each other, the lower index on equal ones (as
                # ``fp32_tie``). Two near centroids: the pair named by ``packed``; more: every centroid.
                x3_pair = row_mask & (n_near == 2)
                near_sum = (packed >> 8) & 255
                spread = tl.sqrt(tl.maximum(2 * ((packed >> 16) & 65535) - near_sum * near_sum, 0).to(tl.float32))
                near_lo = tl.where(x3_pair, (near_sum - (spread + 0.5).to(tl.int32)) // 2, 0)
                near_hi = tl.where(x3_pair, near_sum - near_lo, 0)
                x3_many = row_mask & (n_near > 2)
                run_dist = tl.full((BLOCK_N,), float("inf"), tl.float32)
                run_label = near_lo
                # j = -1, -2: the pair's two (x3_pair rows); 0 .. k - 1: every centroid (x3_many rows).
                j_end = tl.where(tl.max(x3_many.to(tl.int32), axis=0) > 0, k, 0)
                for j in range(-2, j_end):
                    if j < 0:
                        active = x3_pair
                        cand = tl.where(j == -2, near_lo, near_hi)
                    else:
                        active = x3_many
                        cand = tl.zeros((BLOCK_N,), tl.int32) + j
                    cand64 = cand.to(tl.int64)
                    dist_j = tl.zeros((BLOCK_N,), tl.float32)
                    for d0 in range(0, d, TIE_D):
                        dims = d0 + tl.arange(0, TIE_D)
                        dim_mask = dims < d
                        cand_mask = active[:, None] & dim_mask[None, :]
                        xr = transform_rows(
                            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=cand_mask,
                                    other=0.0),
                            active, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET,
                            HAS_SCALE)
                        diff = xr - tl.load(c32_ptr + cand64[:, None] * d + dims[None, :], mask=cand_mask, other=0.0)
                        dist_j += tl.sum(diff * diff, axis=1)
                    take_j = active & (dist_j < run_dist)
                    tie = active & (run_dist < 3.0e38) & fp32_tie(run_dist, dist_j, d, TIE_D)
                    if tl.max(tie.to(tl.int32), axis=0) > 0:
                        run64 = run_label.to(tl.int64)
                        dist_a = tl.zeros((BLOCK_N,), tl.float64)
                        dist_b = tl.zeros((BLOCK_N,), tl.float64)
                        for d0 in range(0, d, TIE_D):
                            dims = d0 + tl.arange(0, TIE_D)
                            dim_mask = dims < d
                            tie_mask = tie[:, None] & dim_mask[None, :]
                            xr = transform_rows(
                                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=tie_mask,
                                        other=0.0),
                                tie, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale,
                                HAS_OFFSET, HAS_SCALE)
                            dist_a += sq_dist64_part(xr, tl.load(c32_ptr + run64[:, None] * d + dims[None, :],
                                                                 mask=tie_mask, other=0.0))
                            dist_b += sq_dist64_part(xr, tl.load(c32_ptr + cand64[:, None] * d + dims[None, :],
                                                                 mask=tie_mask, other=0.0))
                        take_j = tl.where(tie, nearer64(dist_a, dist_b, run_label, cand), take_j)
                    run_dist = tl.where(take_j, dist_j, run_dist)
                    run_label = tl.where(take_j, cand, run_label)
                label = tl.where(x3_pair | x3_many, run_label, label)
        w = tl.where(done, w, 0.0)
        label64 = label.to(tl.int64)
        if UPDATE == 4:
            prev64 = tl.load(prev_ptr + rows, mask=done, other=0).to(tl.int64)
            moved = done & (prev64 != label64)
        if PREFETCH:
            cr = tl.load(c32_ptr + label64[:, None] * d + dims0[None, :], mask=row_mask[:, None] & (dims0 < d)[None, :],
                         other=0.0)
            diff = x_rows - cr
            sq_dist += tl.sum(diff * diff, axis=1)
        else:
            for d0 in range(0, d, EPI_D):
                dims = d0 + epi_dims
                dim_mask = dims < d
                xr = transform_rows(
                    tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                    row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
                cr = tl.load(c32_ptr + label64[:, None] * d + dims[None, :], mask=row_mask[:, None] & dim_mask[None, :],
                             other=0.0)
                diff = xr - cr
                sq_dist += tl.sum(diff * diff, axis=1)
                if UPDATE == 1 or UPDATE == 2:
                    accumulate_rows(sums_ptr + replica * k * d, counts_ptr + replica * k, label64, w, done, xr, dims,
                                    dim_mask, d0 == 0, k, d, KP, UPDATE)
                if UPDATE == 4:
                    move_rows(sums_ptr, counts_ptr, label64, prev64, w, moved, xr, dims, dim_mask, d0 == 0, d)
    if UPDATE == 3:
        if PREFETCH:
            tl.static_assert(DP == BLOCK_D, "the carried sums take the tile loaded ahead as it is")
            acc_sums, acc_counts = carry_rows(acc_sums, acc_counts, label64, w, x_rows, KP)
        else:
            acc_sums, acc_counts = _carry_tile(acc_sums, acc_counts, x_ptr, rows, row_mask, label64, w, stride_xn,
                                               stride_xd, offset_ptr, scale, d, KP, DP, HAS_OFFSET, HAS_SCALE)
    # prev is read before labels are written, and deferred rows are written only by the re-search,
    # so labels may overwrite prev_labels in place.
    if HAS_PREV:
        if PREFETCH == 2:
            # Compared as loaded (int64, beside the labels' store), not moved to the search's layout.
            changed_rows = done & (prev_pre != label.to(tl.int64))
        else:
            prev = tl.load(prev_ptr + rows, mask=done, other=0).to(tl.int32)
            changed_rows = done & (prev != label)
        # Every thread's read of prev before any thread's store of labels: a row's label is held
        # by several threads, and one of them stores it while another may not have read prev yet,
        # which then counts no change. Without this barrier a fit's passes that add the rows into
        # the sums undercounted changed labels by up to a third (H200, 2026-12-03, 100,003 x 128,
        # k = 70, exact: 11,128 counted of 17,014; fine under the interpreter, which runs in order).
        tl.debug_barrier()
    else:
        changed_rows = done
    tl.store(labels_ptr + rows, label.to(labels_ptr.dtype.element_ty), mask=done)
    if STORE_SQ_DIST:
        tl.store(sq_dist_ptr + rows, sq_dist, mask=done)
    inertia_rows = tl.where(done, sq_dist * w, 0.0)
    if HAS_ROW_INDEX or UPDATE == 3:
        # A persistent program (``_assign_programs``): per row slot, summed after its last tile, as
        # a sum across the program's warps for every tile costs barriers on the loop's critical path.
        inertia = inertia_rows
        changed = changed_rows.to(tl.int32)
    else:
        inertia = tl.sum(inertia_rows, axis=0)
        changed = tl.sum(changed_rows.to(tl.int64), axis=0)
    return inertia, changed, acc_sums, acc_counts


@triton.jit
def _distance_floor(score, x_sq, bound, residual_max, margin):
    """A lower bound on the squared distance D of a centroid whose fast score is at least ``score``.

    The score is D less ||x||^2 (centred row), give or take ``bound`` and what the centroid's
    rounding r leaves out: 2 (x - c).r + ||r||^2, at most 2 sqrt(D) R + R^2. So
    (sqrt(D) + R)^2 >= score + ||x||^2 - bound = T + R^2, and D >= (sqrt(T + R^2) - R)^2. The fp32
    sums of ||x||^2 and of this formula carry a few roundings of their size: ``margin`` on each.
    (+inf scores, of no centroid, are clamped: no inf - inf.)"""
    score_c = tl.minimum(score, 3.0e38)
    t = score_c + x_sq - bound - margin * (x_sq + tl.abs(score_c)) - residual_max * residual_max
    root = tl.sqrt(tl.maximum(t, 0.0) + residual_max * residual_max) - residual_max
    return root * root * (1.0 - margin)


@triton.jit
def _pair_floor(score, best, best_sq, x_sq, row_norm, c_norm_max, bias_max, residual_max, pair_coef, pair_acc_coef,
                bias_coef, margin, TILE_BITS: tl.constexpr):
    """A lower bound on the squared distance D_j of every centroid j whose recorded score is at least
    ``score``, from the difference of two computed scores, j's and the record's best b's (whose
    direct distance is ``best_sq``). ``TILE_BITS`` > 0: the Hopper search's packed record
    (``hopper_search.packed``, its tile bits), whose values are lowered; 0: a record of the scores
    themselves, up to what ``pair_acc_coef`` and ``bias_coef`` bound (the tl.dot searches but the
    lazy packed one; the eager search's packed keys are in those coefficients).

    ``_distance_floor`` charges a score the rows' operand rounding dx at its worst over all
    centroids, 2 |dx| max||c||. Two scores of the same row carry the same dx, so their difference
    carries only 2 dx.(c~_j - c~_b), at most 2 e (sqrt(D~_j) + sqrt(D~_b)) for e >= |dx| and D~ the
    distances to the rounded centroids c~: small for the close centroids that decide a label (H200,
    1M x 128 x 4096 over-split fp32 rows, BENCHMARKS.md 2026-12-04: deferred 32 -> 16 % of the rows
    from random centroids, 52 -> 42 % after two iterations; exact pass 4.18 -> 3.69 and 4.41 ->
    3.88 ms). With the record's scores r (lowered: r_j <= s_j, the computed score) and the
    fp32 sums' error a on each score, s_j - s_b >= G = score - best - L_b - 2 a, where L_b bounds
    how far the record lowered b's (twice ``_key_floor``'s slack, which covers the cleared bits and
    the row term's sum). Then D~_j + 2 e sqrt(D~_j) >= D~_b - 2 e sqrt(D~_b) + G; with
    sqrt(D~_b) >= y = sqrt(best_sq) - R (R the centroids' largest rounding) and u^2 - 2 e u
    increasing from e, (sqrt(D~_j) + e)^2 >= max(y - e, 0)^2 + G, and sqrt(D_j) >= sqrt(D~_j) - R.
    Each step rounds toward the bound (``margin`` on magnitudes)."""
    eps, acc, y = _pair_terms(best_sq, row_norm, c_norm_max, bias_max, residual_max, pair_coef, pair_acc_coef,
                              bias_coef, margin)
    # The row term as the search added it, at most: the centred norm of the operand row, ROW_MARGIN
    # (2^-5) more, and room for its fp32 sum.
    root_x = tl.sqrt(x_sq) * (1.0 + margin) + eps
    term = root_x * root_x * (1.0 + 2.0**-5 + 2.0**-10)
    # (Magnitudes clamped at 1e37, so that inf scores, of no centroid, add up to no inf.)
    best_c = tl.minimum(tl.abs(best), 1.0e37)
    if TILE_BITS > 0:
        lowering = 2.0 * ((best_c + 1.01 * term) * 1.01 * (2.0 ** (TILE_BITS - 22) + 2.0**-21) + term * 2.0**-17)
    else:
        lowering = tl.zeros_like(best_c)
    score_c = tl.minimum(score, 1.0e37)
    gap = score_c - tl.minimum(best, 1.0e37) - lowering - 2.0 * acc
    gap = gap - margin * (tl.abs(score_c) + best_c + lowering + 2.0 * acc)
    root = tl.sqrt(tl.maximum(y * y * (1.0 - margin) + gap, 0.0) * (1.0 - margin))
    z = tl.maximum(root * (1.0 - margin) - (eps + residual_max) * (1.0 + margin), 0.0) * (1.0 - margin)
    return z * z * (1.0 - margin)


@triton.jit
def _pair_terms(ref_sq, row_norm, c_norm_max, bias_max, residual_max, pair_coef, pair_acc_coef, bias_coef, margin):
    """The terms ``_pair_floor`` and ``_candidate_pair_top`` share, for a row and its reference
    centroid (the record's best, the winner so far) at direct squared distance ``ref_sq``: the
    bound e on the row's operand rounding, the bound a on one score's fp32 sums, and
    y = max(sqrt(D~_ref) - e, 0) from below, D~_ref the distance to the reference's rounded
    centroid (sqrt(D~_ref) >= sqrt(ref_sq) - R)."""
    eps = pair_coef * row_norm
    acc = pair_acc_coef * row_norm * c_norm_max + bias_coef * bias_max
    y = tl.maximum(tl.sqrt(ref_sq * (1.0 - margin)) * (1.0 - margin) - (residual_max + eps) * (1.0 + margin), 0.0)
    return eps, acc, y


# Inline PTX where it compiles (not under the interpreter), see ``_tile_key``.
_ASM_LOP3 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _tile_key(acc, tile_no, LAZY_BITS: tl.constexpr, ASM: tl.constexpr):
    """The score ``acc`` with its lowest LAZY_BITS bits replaced by the tile's number, as a float."""
    return _packed_key(acc, tile_no, -(1 << LAZY_BITS), ASM)


@triton.jit
def _packed_key(acc, tag, MASK: tl.constexpr, ASM: tl.constexpr):
    """``(acc & MASK) | tag`` on the float's bits, as a float. One ``lop3`` ((a & b) | c): written in
    Triton, ptxas makes two logic instructions of it, a third of the lazy exact search's work a
    score."""
    bits = acc.to(tl.int32, bitcast=True)
    if ASM:
        key = tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r",
                                        [bits, tl.zeros_like(bits) + MASK, tl.zeros_like(bits) + tag],
                                        dtype=tl.int32, is_pure=True, pack=1)
    else:
        key = (bits & MASK) | tag
    return key.to(tl.float32, bitcast=True)


@triton.jit
def _merge_lowest_three(a1, a2, a3, b1, b2, b3):
    """The lowest three of two sorted triples (a1 <= a2 <= a3, b1 <= b2 <= b3), sorted: 9 operations."""
    c1 = tl.minimum(a1, b1)
    c2 = tl.minimum(tl.minimum(a2, b2), tl.maximum(a1, b1))
    c3 = tl.minimum(tl.minimum(a3, b3), tl.minimum(tl.maximum(a1, b2), tl.maximum(a2, b1)))
    return c1, c2, c3


@triton.jit
def _column_halves(v):
    """A (rows x W) tile's columns [0, W/2) and [W/2, W). In the products' layouts a thread holds
    columns that differ in their high bits, so this split moves no data (its low bits, but the
    lowest, are lanes)."""
    N: tl.constexpr = v.shape[0]
    W: tl.constexpr = v.shape[1]
    return tl.split(tl.permute(tl.reshape(v, (N, 2, W // 2)), (0, 2, 1)))


@triton.jit
def _lowest_three(key):
    """Each row's lowest three of a (rows x W) tile of distinct keys, sorted, W >= 4 a power of two.

    A merging network over the values a thread holds, then one reduction of triples across the
    lanes: about 4.5 operations a key, against 9 for three successive minima that each mask the
    one before (the packed eager search's former reduction, ``TORCHKM_TOP3_NETWORK=0``)."""
    N: tl.constexpr = key.shape[0]
    W: tl.constexpr = key.shape[1]
    # Adjacent columns first: a thread holds both (the products' accumulator layout), then sorted
    # pairs into sorted triples of four.
    a, b = tl.split(tl.reshape(key, (N, W // 2, 2)))
    lo = tl.minimum(a, b)
    hi = tl.maximum(a, b)
    lo_a, lo_b = _column_halves(lo)
    hi_a, hi_b = _column_halves(hi)
    upper = tl.maximum(lo_a, lo_b)
    lower = tl.minimum(hi_a, hi_b)
    c1 = tl.minimum(lo_a, lo_b)
    c2 = tl.minimum(upper, lower)
    c3 = tl.maximum(upper, lower)
    # Halve while a thread still holds several columns (4 lanes share a row's columns).
    for _ in tl.static_range(10):
        if c1.shape[1] > 4:
            a1, b1 = _column_halves(c1)
            a2, b2 = _column_halves(c2)
            a3, b3 = _column_halves(c3)
            c1, c2, c3 = _merge_lowest_three(a1, a2, a3, b1, b2, b3)
    return tl.reduce((c1, c2, c3), 1, _merge_lowest_three)


@triton.jit
def _lazy_key_floor(key_t, row_term, LAZY_BITS: tl.constexpr):
    """A lower bound on the score (bias - 2 x.c~) a packed key of the lazy search came from (+inf for
    padding and for none): the key without its tile bits, less 2^(LAZY_BITS - 22) of it (those bits
    and the subtraction's rounding) and 2^-17 of the row term (its fp32 sum into the products), less
    the row term."""
    value = (key_t.to(tl.int32, bitcast=True) & -(1 << LAZY_BITS)).to(tl.float32, bitcast=True)
    term = row_term[:, None]
    slack = tl.abs(value) * 2.0 ** (LAZY_BITS - 22) + term * 2.0**-17
    return tl.where(value >= 2.9e38, float("inf"), value - term - slack)


@triton.jit
def _third_candidate(best_t, second_t, index_t, at_two, AXIS: tl.constexpr):
    """Over a lazy search's slots (``AXIS``: the slots of a row), given the slots of the best two
    (``at_two``): the best of the other slots' minima as a third candidate (its index, -1 if none),
    and a lower bound on every score but those three (the slots' second-lowest and the other
    minima)."""
    rest = tl.where(at_two, float("inf"), best_t)
    third = tl.min(rest, axis=AXIS)
    label3 = tl.min(tl.where(rest == tl.expand_dims(third, AXIS), index_t, 2147483647), axis=AXIS)
    at_third = index_t == tl.expand_dims(label3, AXIS)
    fourth = tl.min(tl.where(at_two | at_third, second_t, best_t), axis=AXIS)
    return tl.where(third < float("inf"), label3, -1), fourth


@triton.jit
def _carry_tile(acc_sums, acc_counts, x_ptr, rows, row_mask, label64, w, stride_xn, stride_xd, offset_ptr, scale, d,
                KP: tl.constexpr, DP: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    # The whole row at once (DP <= 64, see ``carries``), again from cache.
    dims = tl.arange(0, DP)
    xr = transform_rows(
        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & (dims < d)[None, :], other=0.0),
        row_mask, tl.load(offset_ptr + dims, mask=(dims < d) & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
    return carry_rows(acc_sums, acc_counts, label64, w, xr, KP)


@triton.jit
def _key_of(score, label):
    """(score, label) as one uint64 whose largest value is the lowest score, ties to the lowest label:
    the complement of (order-preserving unsigned bits of the fp32 score, label). Never 0, the
    cleared slot."""
    bits = score.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) != 0, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return ~(((bits ^ flip).to(tl.uint64) << 32) | label.to(tl.uint64))


@triton.jit
def _label_of_key(key):
    return (~key).to(tl.uint32).to(tl.int32, bitcast=True)


@triton.jit
def _distance_of_key(key):
    """The score of a key made from a non-negative one (a squared distance): ``_key_of`` set its
    sign bit."""
    return (((~key) >> 32).to(tl.uint32) ^ 0x80000000).to(tl.float32, bitcast=True)


@triton.jit
def _candidate_top(key, x_sq, row_norm, c_norm_max, residual_max, bias_max, bound_coef, bias_coef, d):
    """The score at or under which a centroid could still beat a deferred row's winner, whose direct
    distance its key slot holds (``KEYS == 3``): a centroid is a candidate when what its score bounds
    (``_distance_floor``, as the pass itself decides, inverted into a score threshold) is not above
    that distance. ``x_sq``: the row's centred squared norm; ``row_norm``: its norm as the pass's
    bound takes it."""
    margin = (d + 16) * 1.1920929e-07
    bound = bound_coef * row_norm * c_norm_max + bias_coef * bias_max
    limit = _distance_of_key(key) * (1.0 + margin)
    # A score whose floor is within the limit is at most ``top`` (the floor inverted, with room for
    # its roundings): one comparison per score. A few more candidates than the floor would name cost
    # a direct distance each, never a wrong label.
    reach = tl.sqrt(limit / (1.0 - margin)) + residual_max
    top = reach * reach - x_sq + bound + margin * x_sq
    top = tl.where(top >= 0, top / (1.0 - margin), top / (1.0 + margin))
    # (and room for this arithmetic's own roundings, on the magnitudes it cancels)
    return top + 2.0 * margin * tl.abs(top) + 1e-6 * (reach * reach + x_sq) + 1e-30


@triton.jit
def _candidate_pair_top(key, score_w, row_norm, c_norm_max, bias_max, residual_max, pair_coef, pair_acc_coef,
                        bias_coef, d):
    """``_candidate_top`` from score differences (``_pair_floor``'s bound, taken from the winner w so
    far, whose score ``score_w`` the plan computed from the same operands): a centroid j can be
    proven farther than w only if its score s_j > s_w + 2 a + (sqrt(D_w) + e + R)^2 - y^2, with
    y = max(sqrt(D_w) - R - e, 0) (``_pair_floor``'s terms, D_w the key's direct distance), so at or
    under that it stays a candidate. The rows' operand rounding e enters only through the two
    centroids' difference, which over boundaries between close centroids leaves fewer candidates
    than ``_candidate_top``'s per-score bound; elsewhere that one is the smaller. Rounded upward."""
    margin = (d + 16) * 1.1920929e-07
    d_w = _distance_of_key(key)
    eps, acc, y = _pair_terms(d_w, row_norm, c_norm_max, bias_max, residual_max, pair_coef, pair_acc_coef, bias_coef,
                              margin)
    reach = (tl.sqrt(d_w * (1.0 + margin)) * (1.0 + margin) + eps + residual_max) * (1.0 + margin)
    top = score_w + 2.0 * acc + reach * reach - y * y * (1.0 - margin)
    return top + margin * (tl.abs(score_w) + 2.0 * acc + reach * reach + y * y) + 1e-30


@triton.jit
def _neighbour_need_kernel(count_ptr, key_ptr, need_ptr, control_ptr, cand_cap, BLOCK: tl.constexpr,
                           HAS_CONTROL: tl.constexpr):
    """Per centroid, the largest direct distance of a deferred row (the first ``cand_cap``) whose
    winner so far it is, as 1 + its bits (``centroids.centroid_neighbours``' need; an atomic
    maximum: non-negative floats order as their bits)."""
    go = True
    if HAS_CONTROL:
        go = tl.load(control_ptr) == 0
    if go:
        row_count = tl.minimum(tl.load(count_ptr), cand_cap)
        keys = key_ptr.to(tl.pointer_type(tl.uint64))
        for t in range(tl.program_id(0), tl.cdiv(row_count, BLOCK), tl.num_programs(0)):
            slots = t * BLOCK + tl.arange(0, BLOCK)
            row_mask = slots < row_count
            key = tl.load(keys + slots, mask=row_mask, other=0)
            bits = _distance_of_key(key).to(tl.int32, bitcast=True) + 1
            tl.atomic_max(need_ptr + _label_of_key(key), bits, mask=row_mask, sem="relaxed")


@triton.jit
def _candidate_plan_kernel(
    x_ptr, offset_ptr, norm_ptr, c_norm_ptr, row_index_ptr, count_ptr, key_ptr, chunk_min_ptr, list_ptr, top_ptr,
    control_ptr, k, d, stride_xn, stride_xd, n_chunks, cand_cap, lists_at, bound_coef, bias_coef, half_ptr, xh_ptr,
    copy_rows, nbr_ptr, nbr_count_ptr, radius_ptr, cand_ptr, c_mma_ptr, bias_ptr, pair_coef, pair_acc_coef,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CP: tl.constexpr, HAS_MINS: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_CONTROL: tl.constexpr, HALF: tl.constexpr, COPY: tl.constexpr,
    NEIGHBOURS: tl.constexpr, S: tl.constexpr, PAIR: tl.constexpr = False,
):
    """The exact mode's candidate re-search, first step: for each deferred row (``row_index_ptr``,
    the first ``cand_cap``), the score at or under which a centroid could still beat the winner
    (``top_ptr``), and the centroid chunks that could hold one. A centroid is a candidate when
    what its score bounds (``_distance_floor``, as the pass itself decides, inverted into a score
    threshold) is not above the winner's direct distance, read from the row's key slot
    (``KEYS == 3``). With the pass's chunk minima (``HAS_MINS``: each row's lowest score in each
    chunk), only chunks whose minimum is within the threshold are listed; else every chunk.

    ``COPY`` (fp16 operands): the first ``copy_rows`` deferred rows are also written, scaled into
    fp16 as the pass's search read them, to ``xh_ptr`` (the pass's fp16 row buffer, free once its
    search is done; one row per slot), so that their re-scoring loads half the bytes and converts
    nothing. Chunk c lists those slots at ``list_ptr + c * cand_cap``, their number at
    ``count_ptr[lists_at + c]``; the other slots at ``list_ptr + c * cand_cap + copy_rows``, their
    number at ``count_ptr[lists_at + n_chunks + c]`` (all cleared by the pass's preparation).

    ``NEIGHBOURS`` (the length of each centroid's list of near others, ``nbr_ptr`` (k,
    NEIGHBOURS), ``nbr_count_ptr`` and ``radius_ptr``, see ``centroids.centroid_neighbours``): a row
    whose winner ``w`` so far, at direct squared distance ``D``, has every other centroid within
    ``2 sqrt(D)`` of it listed, takes ``w`` and that list as its candidates (``cand_ptr``,
    ``count_ptr[2 + slot]``) and no chunk: its nearest is one of them (triangle inequality), which
    ``_candidate_exact_kernel`` then compares directly. No fast product re-scores it.

    ``PAIR`` (fp16 operands; ``TORCHKM_PAIR_CANDIDATES=0`` turns it off): the threshold is also
    taken from score differences (``_candidate_pair_top``), with the winner's score computed here
    from the operands the re-scoring multiplies (``c_mma_ptr``, ``bias_ptr``)."""
    tl.static_assert(not PAIR or HALF, "the winner's score from the rows as fp16 operands")
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        row_count = tl.minimum(tl.load(count_ptr), cand_cap)
        dims0 = tl.arange(0, BLOCK_D)
        chunk_ids = tl.arange(0, CP)
        chunk_mask = chunk_ids < n_chunks
        # As in the pass's epilogue: the largest centroid norm, residual norm and |bias|. (Inline,
        # as there: see ``_tile``.)
        parts = tl.cdiv(k, PREPARE_ROWS)
        cols = tl.arange(0, 128)
        norms = tl.zeros((128,), tl.float32)
        residuals = tl.zeros((128,), tl.float32)
        biases = tl.zeros((128,), tl.float32)
        for p0 in range(0, parts, 128):
            mask = p0 + cols < parts
            norms = tl.maximum(norms, tl.load(c_norm_ptr + p0 + cols, mask=mask, other=0.0))
            residuals = tl.maximum(residuals, tl.load(c_norm_ptr + parts + p0 + cols, mask=mask, other=0.0))
            biases = tl.maximum(biases, tl.load(c_norm_ptr + 2 * parts + p0 + cols, mask=mask, other=0.0))
        c_norm_max = tl.max(norms, axis=0)
        residual_max = tl.max(residuals, axis=0) * 1.001
        bias_max = tl.max(biases, axis=0)
        keys = key_ptr.to(tl.pointer_type(tl.uint64))
        row_floor = tl.load(half_ptr + 2) if HALF else 0.0
        if COPY or PAIR:
            half_scale = tl.load(half_ptr)
        for t in range(tl.program_id(0), tl.cdiv(row_count, BLOCK_N), tl.num_programs(0)):
            slots = t * BLOCK_N + tl.arange(0, BLOCK_N)
            row_mask = slots < row_count
            copied = row_mask & (slots < copy_rows)
            rows = tl.load(row_index_ptr + slots, mask=row_mask, other=0).to(tl.int64)
            row_norm = tl.maximum(tl.load(norm_ptr + rows, mask=row_mask, other=0.0), row_floor)
            key = tl.load(keys + slots, mask=row_mask, other=0)
            x_sq = tl.zeros((BLOCK_N,), tl.float32)
            if PAIR:
                # The winner's score as the re-scoring computes the others': bias + x~ . (-2 s c~).
                winner64 = _label_of_key(key).to(tl.int64)
                score_w = tl.load(bias_ptr + winner64, mask=row_mask, other=0.0)
            for d0 in range(0, d, BLOCK_D):
                dims = d0 + dims0
                dim_mask = dims < d
                raw = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                              mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
                if COPY or PAIR:
                    # (scaled as ``_half_rows_kernel`` scales them: the search's own fp16 operands)
                    raw_half = (raw * half_scale).to(tl.float16)
                if COPY:
                    tl.store(xh_ptr + slots.to(tl.int64)[:, None] * d + dims[None, :], raw_half,
                             mask=copied[:, None] & dim_mask[None, :])
                if PAIR:
                    c_w = tl.load(c_mma_ptr + winner64[:, None] * d + dims[None, :],
                                  mask=row_mask[:, None] & dim_mask[None, :], other=0.0).to(tl.float32)
                    score_w += tl.sum(raw_half.to(tl.float32) * c_w, axis=1)
                xr = transform_rows(raw, row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0),
                                    tl.full((BLOCK_N,), 1.0, tl.float32), HAS_OFFSET, False)
                x_sq += tl.sum(xr * xr, axis=1)
            top = _candidate_top(key, x_sq, row_norm, c_norm_max, residual_max, bias_max, bound_coef, bias_coef, d)
            if PAIR:
                score_w = score_w * tl.load(half_ptr + 1)  # (s^-2: the record's units)
                top = tl.minimum(top, _candidate_pair_top(key, score_w, row_norm, c_norm_max, bias_max, residual_max,
                                                          pair_coef, pair_acc_coef, bias_coef, d))
            tl.store(top_ptr + slots, top, mask=row_mask)
            need = row_mask[:, None] & chunk_mask[None, :]
            if NEIGHBOURS > 0:
                tl.static_assert(NEIGHBOURS < S, "the winner and its neighbours are a row's candidates")
                winner = _label_of_key(key)
                # (The winner's radius is the reach of its farthest deferred row: -1 if none.)
                reach = _neighbour_reach(_distance_of_key(key), d)
                near = row_mask & (tl.load(radius_ptr + winner, mask=row_mask, other=-1.0) >= reach)
                listed_n = tl.load(nbr_count_ptr + winner, mask=near, other=0)
                cand_cols = tl.arange(0, S)
                in_list = near[:, None] & (cand_cols[None, :] >= 1) & (cand_cols[None, :] <= listed_n[:, None])
                listed_ids = tl.load(nbr_ptr + winner.to(tl.int64)[:, None] * NEIGHBOURS + cand_cols[None, :] - 1,
                                     mask=in_list, other=0)
                cand_ids = tl.where(cand_cols[None, :] == 0, winner[:, None], listed_ids)
                tl.store(cand_ptr + slots.to(tl.int64)[:, None] * S + cand_cols[None, :], cand_ids,
                         mask=in_list | (near[:, None] & (cand_cols[None, :] == 0)))
                tl.store(count_ptr + 2 + slots, listed_n + 1, mask=near)
                need = need & (near == 0)[:, None]
            if HAS_MINS:
                # The pass's scores carry the same error bound as the re-search's (same operands,
                # fp32 sums of as many terms), so the same threshold holds for its minima.
                mins = tl.load(chunk_min_ptr + rows[:, None] * n_chunks + chunk_ids[None, :], mask=need,
                               other=float("inf"))
                need = need & (mins <= top[:, None])
            # The copied slots' lists, then the others' (a tile holds both kinds at one boundary only);
            # without a copy (copy_rows = 0) only the others'.
            for other in tl.static_range(1 - COPY, 2):
                listed = need & ((row_mask & (slots >= copy_rows)) if other else copied)[:, None]
                need_i = listed.to(tl.int32)
                in_chunk = tl.sum(need_i, axis=0)
                base = tl.atomic_add(count_ptr + lists_at + other * n_chunks + chunk_ids, in_chunk,
                                     mask=chunk_mask & (in_chunk > 0), sem="relaxed")
                pos = base[None, :] + tl.cumsum(need_i, axis=0) - 1 + other * copy_rows
                tl.store(list_ptr + chunk_ids[None, :].to(tl.int64) * cand_cap + pos,
                         slots[:, None] + tl.zeros_like(pos), mask=listed)


@triton.jit
def _candidate_kernel(
    x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, row_index_ptr, count_ptr, list_ptr, top_ptr, cand_ptr, control_ptr,
    k, d, stride_xn, stride_xd, chunk, cand_cap, lists_at, half_ptr, xh_ptr, list_base,
    offset_ptr, norm_ptr, c_norm_ptr, key_ptr, bound_coef, bias_coef,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr,
    PRECISION: tl.constexpr, SPLIT: tl.constexpr, HAS_CONTROL: tl.constexpr, HALF: tl.constexpr,
    COPY: tl.constexpr, LISTS: tl.constexpr, HAS_OFFSET: tl.constexpr, X_ONCE: tl.constexpr = False,
):
    """The candidate re-search, second step: the rows listed for centroid chunk c (program axis 1;
    ``_candidate_plan_kernel``) are scored again against its centroids by the fast product, one
    product per tile where the 3xTF32 re-search takes three. Scores at or under the row's
    threshold name candidates: up to ``S`` per row go to ``cand_ptr``, their count to
    ``count_ptr[2 + slot]`` (cleared by the pass's preparation); a row with more is re-searched in
    full (``_candidate_exact_kernel``). ``COPY``: the rows the plan copied into fp16 (``xh_ptr``,
    by slot; their lists and counts at offset 0), else the others from x (at ``list_base``, their
    counts after the copied rows').

    Without ``LISTS`` (a pass over few rows without chunk minima or a copy, where every chunk would
    list every deferred row in order) there is no plan: each program takes the first ``cand_cap``
    deferred rows as they are and computes their thresholds itself (``_candidate_top``, as the plan
    does), from ``offset_ptr``, ``norm_ptr``, ``c_norm_ptr``, ``key_ptr`` and the bound's
    coefficients.

    ``X_ONCE`` (rows read from x, of at most ``BLOCK_D`` features): each tile of rows is loaded and
    converted once, not once per centroid tile."""
    tl.static_assert(not X_ONCE or not COPY, "a row tile loaded once is read from x")
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        c = tl.program_id(1)
        if LISTS:
            listed = tl.load(count_ptr + lists_at + (0 if COPY else tl.num_programs(1)) + c)
        else:
            listed = tl.minimum(tl.load(count_ptr), cand_cap)
            # The plan's maxima (inline, as there), in BLOCK_K lanes.
            parts = tl.cdiv(k, PREPARE_ROWS)
            part_cols = tl.arange(0, BLOCK_K)
            norms = tl.zeros((BLOCK_K,), tl.float32)
            residuals = tl.zeros((BLOCK_K,), tl.float32)
            biases = tl.zeros((BLOCK_K,), tl.float32)
            for p0 in range(0, parts, BLOCK_K):
                at_part = p0 + part_cols
                norms = tl.maximum(norms, tl.load(c_norm_ptr + at_part, mask=at_part < parts, other=0.0))
                residuals = tl.maximum(residuals, tl.load(c_norm_ptr + parts + at_part, mask=at_part < parts, other=0.0))
                biases = tl.maximum(biases, tl.load(c_norm_ptr + 2 * parts + at_part, mask=at_part < parts, other=0.0))
            c_norm_max = tl.max(norms, axis=0)
            residual_max = tl.max(residuals, axis=0) * 1.001
            bias_max = tl.max(biases, axis=0)
            row_floor = tl.load(half_ptr + 2) if HALF else 0.0
        first = c * chunk
        last = tl.minimum(first + chunk, k)
        tile_cols = tl.arange(0, BLOCK_K)
        dims0 = tl.arange(0, BLOCK_D)
        mma_dtype = c_mma_ptr.dtype.element_ty
        # fp16 operands: the rows scaled by s as the pass's, so the scores are in units of s^-2.
        half_scale = tl.load(half_ptr) if HALF else 1.0
        for t in range(tl.program_id(0), tl.cdiv(listed, BLOCK_N), tl.num_programs(0)):
            at = t * BLOCK_N + tl.arange(0, BLOCK_N)
            row_mask = at < listed
            if LISTS:
                slots = tl.load(list_ptr + c.to(tl.int64) * cand_cap + list_base + at, mask=row_mask, other=0)
            else:
                slots = at
            if not COPY:
                rows = tl.load(row_index_ptr + slots, mask=row_mask, other=0).to(tl.int64)
            if LISTS:
                top = tl.load(top_ptr + slots, mask=row_mask, other=float("-inf"))
            else:
                # (A loop of its own: summing the product loop's row loads as well raced in Triton
                # 3.6's software pipeline, bf16 rows at 2 or 3 stages, so that thresholds came out
                # wrong and labels off a float64 argmin (H200, 2026-11-29; triton-lang/triton#6691).)
                x_sq = tl.zeros((BLOCK_N,), tl.float32)
                for d0 in range(0, d, BLOCK_D):
                    dims = d0 + dims0
                    dim_mask = dims < d
                    xr = transform_rows(
                        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                                mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0),
                        tl.full((BLOCK_N,), 1.0, tl.float32), HAS_OFFSET, False)
                    x_sq += tl.sum(xr * xr, axis=1)
                row_norm = tl.maximum(tl.load(norm_ptr + rows, mask=row_mask, other=0.0), row_floor)
                top = _candidate_top(tl.load(key_ptr.to(tl.pointer_type(tl.uint64)) + slots, mask=row_mask, other=0),
                                     x_sq, row_norm, c_norm_max, residual_max, bias_max, bound_coef, bias_coef, d)
                top = tl.where(row_mask, top, float("-inf"))
            if HALF:
                top = (top * half_scale) * half_scale
            if X_ONCE:
                # The whole row in one step: loaded and converted once for all the chunk's tiles.
                x_once = tl.load(x_ptr + rows[:, None] * stride_xn + dims0[None, :] * stride_xd,
                                 mask=row_mask[:, None] & (dims0 < d)[None, :], other=0.0)
                if HALF:
                    x_once = x_once * half_scale
                x_once = x_once.to(mma_dtype)
            for k0 in range(first, last, BLOCK_K):
                cols = k0 + tile_cols
                col_mask = cols < last
                acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32) + tl.load(
                    bias_ptr + cols, mask=col_mask, other=float("inf"))[None, :]
                for d0 in range(0, d, BLOCK_D):
                    dims = d0 + dims0
                    dim_mask = dims < d
                    if X_ONCE:
                        x_tile = x_once
                    elif COPY:
                        x_tile = tl.load(xh_ptr + slots.to(tl.int64)[:, None] * d + dims[None, :],
                                         mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
                    else:
                        # The raw rows, as the pass's fast product multiplies them (the offset is in the bias).
                        x_tile = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                                         mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
                        if HALF:
                            x_tile = x_tile * half_scale
                        x_tile = x_tile.to(mma_dtype)
                    c_offs = cols[:, None].to(tl.int64) * d + dims[None, :]
                    c_mask = col_mask[:, None] & dim_mask[None, :]
                    acc = tl.dot(x_tile, tl.trans(tl.load(c_mma_ptr + c_offs, mask=c_mask, other=0.0)), acc,
                                 input_precision=PRECISION)
                    if SPLIT:
                        acc = tl.dot(x_tile, tl.trans(tl.load(c_lo_ptr + c_offs, mask=c_mask, other=0.0)), acc,
                                     input_precision=PRECISION)
                is_cand = row_mask[:, None] & col_mask[None, :] & (acc <= top[:, None])
                # Each candidate takes its place by its own atomic: few scores pass, and a running
                # sum over the tile (one atomic a row) holds more registers (it spilled at 128 x 128).
                if ATOMIC_ADDRESS_FROM_MASK:
                    tallies = count_ptr + 2 + tl.where(is_cand, slots[:, None], 0)
                else:
                    tallies = count_ptr + 2 + slots[:, None] + tl.zeros_like(cols)[None, :]
                pos = tl.atomic_add(tallies, 1, mask=is_cand, sem="relaxed")
                tl.store(cand_ptr + slots[:, None].to(tl.int64) * S + pos, cols[None, :] + tl.zeros_like(pos),
                         mask=is_cand & (pos < S))


@triton.jit
def _candidate_exact_kernel(
    x_ptr, c32_ptr, offset_ptr, row_index_ptr, count_ptr, key_ptr, cand_ptr, slot_list_ptr, control_ptr,
    d, stride_xn, stride_xd, cand_cap,
    BLOCK_R: tl.constexpr, S: tl.constexpr, EPI_D: tl.constexpr, HAS_OFFSET: tl.constexpr,
    HAS_CONTROL: tl.constexpr,
):
    """The candidate re-search, second step: each deferred row's candidates by direct fp32
    distances (as the pass settles its best two; ties to the lowest index), the winner into the
    row's key slot. Rows with more than ``S`` candidates, or past the first ``cand_cap``, get
    their slot cleared and listed in ``slot_list_ptr`` (their count in ``count_ptr[1]``) for the
    full 3xTF32 re-search (``_research_kernel`` with ``SLOT_LIST``)."""
    go = True
    if HAS_CONTROL:
        go = tl.load(control_ptr) == 0
    if go:
        row_count = tl.load(count_ptr)
        cand_cols = tl.arange(0, S)
        epi_dims = tl.arange(0, EPI_D)
        keys = key_ptr.to(tl.pointer_type(tl.uint64))
        for t in range(tl.program_id(0), tl.cdiv(row_count, BLOCK_R), tl.num_programs(0)):
            slots = t * BLOCK_R + tl.arange(0, BLOCK_R)
            row_mask = slots < row_count
            in_cap = row_mask & (slots < cand_cap)
            n_cand = tl.load(count_ptr + 2 + slots, mask=in_cap, other=S + 1)
            settle = row_mask & (n_cand <= S)
            full = row_mask & (n_cand > S)
            rows = tl.load(row_index_ptr + slots, mask=settle, other=0).to(tl.int64)
            valid = settle[:, None] & (cand_cols[None, :] < n_cand[:, None])
            ids = tl.load(cand_ptr + slots[:, None].to(tl.int64) * S + cand_cols[None, :], mask=valid, other=0)
            ids64 = ids.to(tl.int64)
            dist = tl.zeros((BLOCK_R, S), tl.float32)
            for d0 in range(0, d, EPI_D):
                dims = d0 + epi_dims
                dim_mask = dims < d
                xr = transform_rows(
                    tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=settle[:, None] & dim_mask[None, :], other=0.0),
                    settle, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), tl.full((BLOCK_R,), 1.0, tl.float32),
                    HAS_OFFSET, False)
                cr = tl.load(c32_ptr + ids64[:, :, None] * d + dims[None, None, :],
                             mask=valid[:, :, None] & dim_mask[None, None, :], other=0.0)
                diff = xr[:, None, :] - cr
                dist += tl.sum(diff * diff, axis=2)
            dist = tl.where(valid, dist, float("inf"))
            best = tl.min(dist, axis=1)
            label = tl.min(tl.where(valid & (dist == best[:, None]), ids, 2147483647), axis=1)
            # Candidates within fp32 rounding of the best are settled by float64 distances, as the
            # pass settles its best two (``_common.fp32_tie``).
            if FLOAT64_TIES:
                near = valid & fp32_tie(dist, best[:, None], d, EPI_D)
                tie = settle & (tl.sum(near.to(tl.int32), axis=1) > 1)
                if tl.max(tie.to(tl.int32), axis=0) > 0:
                    near = near & tie[:, None]
                    tie_dims = tl.arange(0, TIE_D)
                    dist64 = tl.zeros((BLOCK_R, S), tl.float64)
                    for d0 in range(0, d, TIE_D):
                        dims = d0 + tie_dims
                        dim_mask = dims < d
                        xr = transform_rows(
                            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=tie[:, None] & dim_mask[None, :], other=0.0),
                            tie, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), tl.full((BLOCK_R,), 1.0, tl.float32),
                            HAS_OFFSET, False)
                        cr = tl.load(c32_ptr + ids64[:, :, None] * d + dims[None, None, :],
                                     mask=near[:, :, None] & dim_mask[None, None, :], other=0.0)
                        diff = xr.to(tl.float64)[:, None, :] - cr.to(tl.float64)
                        dist64 += tl.sum(diff * diff, axis=2)
                    dist64 = tl.where(near, dist64, float("inf"))
                    best64 = tl.min(dist64, axis=1)
                    label64 = tl.min(tl.where(near & (dist64 == best64[:, None]), ids, 2147483647), axis=1)
                    label = tl.where(tie, label64, label)
                    best = tl.where(tie, tl.min(tl.where(valid & (ids == label[:, None]), dist, float("inf")), axis=1), best)
            # No candidate (it cannot happen: the winner is one): the slot keeps the pass's winner.
            tl.store(keys + slots, _key_of(best, label), mask=settle & (n_cand > 0))
            tl.store(keys + slots, tl.zeros((BLOCK_R,), tl.uint64), mask=full)
            n_full = tl.sum(full.to(tl.int32), axis=0)
            if n_full > 0:
                base = tl.atomic_add(count_ptr + 1, n_full, sem="relaxed")
                tl.store(slot_list_ptr + base + tl.cumsum(full.to(tl.int32), axis=0) - 1, slots, mask=full)


@triton.jit
def _research_kernel(
    x_ptr, c_exact_ptr, bias_exact_ptr, offset_ptr, scale_ptr, row_index_ptr, row_count_ptr, key_ptr, slot_list_ptr,
    control_ptr, k, d, stride_xn, stride_xd, chunk,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_CONTROL: tl.constexpr, SLOT_LIST: tl.constexpr,
):
    """The exact mode's re-search split over centroid chunks (program axis 1), so that a few hundred
    deferred rows still occupy every SM: the nearest centroid of each listed row within the chunk,
    from 3xTF32 products of the transformed fp32 rows, folded into the row's key slot by an atomic
    maximum (see ``_key_of``). The re-search launch then reads the labels from the keys.
    ``SLOT_LIST``: only the slots listed in ``slot_list_ptr`` (``row_count_ptr[1]`` of them; the rows
    the candidate re-search left, see ``_candidate_exact_kernel``)."""
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        row_count = tl.load(row_count_ptr + (1 if SLOT_LIST else 0))
        first = tl.program_id(1) * chunk
        last = tl.minimum(first + chunk, k)
        tile_cols = tl.arange(0, BLOCK_K)
        dims0 = tl.arange(0, BLOCK_D)
        keys = key_ptr.to(tl.pointer_type(tl.uint64))
        for t in range(tl.program_id(0), tl.cdiv(row_count, BLOCK_N), tl.num_programs(0)):
            slots = t * BLOCK_N + tl.arange(0, BLOCK_N)
            row_mask = slots < row_count
            if SLOT_LIST:
                slots = tl.load(slot_list_ptr + slots, mask=row_mask, other=0)
            rows = tl.load(row_index_ptr + slots, mask=row_mask, other=0).to(tl.int64)
            if HAS_SCALE:
                scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
            else:
                scale = tl.full((BLOCK_N,), 1.0, tl.float32)
            best = tl.full((BLOCK_N,), float("inf"), tl.float32)
            label = tl.zeros((BLOCK_N,), tl.int32)
            for k0 in range(first, last, BLOCK_K):
                cols = k0 + tile_cols
                col_mask = cols < last
                acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32) + tl.load(
                    bias_exact_ptr + cols, mask=col_mask, other=float("inf"))[None, :]
                for d0 in range(0, d, BLOCK_D):
                    dims = d0 + dims0
                    dim_mask = dims < d
                    x_tile = transform_rows(
                        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
                        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
                    c_tile = tl.load(c_exact_ptr + cols[:, None].to(tl.int64) * d + dims[None, :],
                                     mask=col_mask[:, None] & dim_mask[None, :], other=0.0)
                    acc = tl.dot(x_tile, tl.trans(c_tile), acc, input_precision="tf32x3")
                m1 = tl.min(acc, axis=1)
                j1 = tl.min(tl.where(acc == m1[:, None], tile_cols[None, :], BLOCK_K), axis=1)
                better = m1 < best  # strict: ties keep the lower index
                best = tl.where(better, m1, best)
                label = tl.where(better, k0 + j1, label)
            tl.atomic_max(keys + slots, _key_of(best, label), mask=row_mask & (best < float("inf")), sem="relaxed")


@triton.jit
def _assign_kernel(
    x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, c32_ptr, offset_ptr, scale_ptr, norm_ptr, weight_ptr, c_norm_ptr,
    row_index_ptr, row_count_ptr,
    labels_ptr, sq_dist_ptr, lower_ptr, prev_ptr, flag_count_ptr, flag_rows_ptr, key_ptr, searched_ptr, acc_ptr, counts_offset,
    part_inertia_ptr, part_changed_ptr, part_base, tile_offset, searched_stride, control_ptr,
    n, k, d, stride_xn, stride_xd, bound_coef, bias_coef, pair_coef, pair_acc_coef, n_replicas, chunk_min_ptr, min_chunk, half_ptr, xh_ptr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_ROW_INDEX: tl.constexpr, CHECK: tl.constexpr, STORE_SQ_DIST: tl.constexpr, STORE_LOWER: tl.constexpr,
    HAS_PREV: tl.constexpr, UPDATE: tl.constexpr, RAW_MMA: tl.constexpr, PRECISION: tl.constexpr,
    ONE_CHUNK: tl.constexpr, EAGER: tl.constexpr, EPI_D: tl.constexpr, SPLIT: tl.constexpr, SWAP: tl.constexpr, KEYS: tl.constexpr, SEARCHED: tl.constexpr,
    DISTANCE_BOUND: tl.constexpr, CHUNK_MINS: tl.constexpr, PACK_KEYS: tl.constexpr, HALF: tl.constexpr, LAZY_BITS: tl.constexpr, PAIR_BITS: tl.constexpr,
    CENTRED: tl.constexpr, HAS_CONTROL: tl.constexpr, PREFETCH: tl.constexpr, ONE_TILE: tl.constexpr,
):
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        _assign_programs(x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, c32_ptr, offset_ptr, scale_ptr, norm_ptr, weight_ptr,
                         c_norm_ptr, row_index_ptr, row_count_ptr,
                         labels_ptr, sq_dist_ptr, lower_ptr, prev_ptr, flag_count_ptr, flag_rows_ptr, key_ptr, searched_ptr, acc_ptr, counts_offset,
                         part_inertia_ptr, part_changed_ptr, part_base, tile_offset, searched_stride,
                         n, k, d, stride_xn, stride_xd, bound_coef, bias_coef, pair_coef, pair_acc_coef, n_replicas, chunk_min_ptr, min_chunk, half_ptr, xh_ptr,
                         BLOCK_N, BLOCK_K, BLOCK_D, KP, DP, HAS_OFFSET, HAS_SCALE, HAS_WEIGHT, HAS_ROW_INDEX, CHECK,
                         STORE_SQ_DIST, STORE_LOWER, HAS_PREV, UPDATE, RAW_MMA, PRECISION, ONE_CHUNK, EAGER, EPI_D, SPLIT, SWAP, KEYS, SEARCHED,
                DISTANCE_BOUND, CHUNK_MINS, PACK_KEYS, HALF, LAZY_BITS, PAIR_BITS, CENTRED, PREFETCH, ONE_TILE)


@triton.jit
def _assign_programs(
    x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, c32_ptr, offset_ptr, scale_ptr, norm_ptr, weight_ptr, c_norm_ptr,
    row_index_ptr, row_count_ptr,
    labels_ptr, sq_dist_ptr, lower_ptr, prev_ptr, flag_count_ptr, flag_rows_ptr, key_ptr, searched_ptr, acc_ptr, counts_offset,
    part_inertia_ptr, part_changed_ptr, part_base, tile_offset, searched_stride,
    n, k, d, stride_xn, stride_xd, bound_coef, bias_coef, pair_coef, pair_acc_coef, n_replicas, chunk_min_ptr, min_chunk, half_ptr, xh_ptr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_ROW_INDEX: tl.constexpr, CHECK: tl.constexpr, STORE_SQ_DIST: tl.constexpr, STORE_LOWER: tl.constexpr,
    HAS_PREV: tl.constexpr, UPDATE: tl.constexpr, RAW_MMA: tl.constexpr, PRECISION: tl.constexpr,
    ONE_CHUNK: tl.constexpr, EAGER: tl.constexpr, EPI_D: tl.constexpr, SPLIT: tl.constexpr, SWAP: tl.constexpr, KEYS: tl.constexpr, SEARCHED: tl.constexpr,
    DISTANCE_BOUND: tl.constexpr, CHUNK_MINS: tl.constexpr, PACK_KEYS: tl.constexpr, HALF: tl.constexpr, LAZY_BITS: tl.constexpr, PAIR_BITS: tl.constexpr,
    CENTRED: tl.constexpr, PREFETCH: tl.constexpr, ONE_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    replica = pid % n_replicas
    # One accumulator buffer, the counts after the sums (see AssignPass).
    sums_ptr = acc_ptr
    counts_ptr = acc_ptr + counts_offset
    # UPDATE == 3: the program's partial sums, carried across its tiles (unused otherwise).
    acc_sums = tl.zeros((KP, DP), tl.float32)
    acc_counts = tl.zeros((KP,), tl.float32)
    # Persistent programs: each row slot's totals over the program's tiles (``_tile``), summed at the end.
    inertia_rows = tl.zeros((BLOCK_N,), tl.float32)
    changed_rows = tl.zeros((BLOCK_N,), tl.int32)
    if HAS_ROW_INDEX:
        # Persistent over a row list whose length is only known on the device (no host sync).
        row_count = tl.load(row_count_ptr)
        n_tiles = tl.cdiv(row_count, BLOCK_N)
    elif SEARCHED or HALF:
        # One chunk of the rows, from tile ``tile_offset`` on (see AssignPass.__call__).
        row_count = 0
        n_tiles = tl.minimum(tl.cdiv(n, BLOCK_N) - tile_offset, searched_stride // BLOCK_N)
    else:
        row_count = 0
        n_tiles = tl.cdiv(n, BLOCK_N)
    if HAS_ROW_INDEX or UPDATE == 3:
        programs = tl.num_programs(0)
        if PREFETCH:
            # Few clusters (carried sums) over whole rows: each tile's rows are loaded while the
            # tile before them is searched, as a program walks its tiles one after another and its
            # loop is not pipelined (it holds the search's own loops).
            dims0 = tl.arange(0, BLOCK_D)
            next_rows = (tl.zeros((BLOCK_N,), tl.int64) + pid) * BLOCK_N + tl.arange(0, BLOCK_N)
            x_next = tl.load(x_ptr + next_rows[:, None] * stride_xn + dims0[None, :] * stride_xd,
                             mask=(next_rows < n)[:, None] & (dims0 < d)[None, :], other=0.0)
            # The previous labels and the weights too (a fit's passes read both). A tile's previous
            # labels are read before any program writes that tile's labels: tile t + programs is
            # this program's own next tile, so labels may still overwrite prev_labels in place.
            ahead: tl.constexpr = PREFETCH == 2
            prev_next = tl.load(prev_ptr + next_rows, mask=(next_rows < n) & HAS_PREV & ahead, other=0)
            w_next = tl.load(weight_ptr + next_rows, mask=(next_rows < n) & HAS_WEIGHT & ahead, other=0.0)
        else:
            x_next = 0.0
            prev_next = 0
            w_next = 0.0
        if PREFETCH and ONE_TILE:
            # The one centroid tile, its bias and the offset stay in the program's registers: loaded
            # in the loop, Triton's pipeliner copied them again for every tile of rows and waited
            # on the copies (loads are not hoisted past the stores of the loop).
            cols_r = tl.arange(0, BLOCK_K)
            if ONE_CHUNK == 2:
                c_offs_r = cols_r[:, None] * BLOCK_D + dims0[None, :]
                c_res = tl.load(c_mma_ptr + c_offs_r)
                c_lo_res = 0.0
                if SPLIT:
                    c_lo_res = tl.load(c_lo_ptr + c_offs_r)
                bias_res = tl.load(bias_ptr + cols_r)
            else:
                c_offs_r = cols_r[:, None].to(tl.int64) * d + dims0[None, :]
                c_mask_r = (cols_r < k)[:, None] & (dims0 < d)[None, :]
                c_res = tl.load(c_mma_ptr + c_offs_r, mask=c_mask_r, other=0.0)
                c_lo_res = 0.0
                if SPLIT:
                    c_lo_res = tl.load(c_lo_ptr + c_offs_r, mask=c_mask_r, other=0.0)
                bias_res = tl.load(bias_ptr + cols_r, mask=cols_r < k, other=float("inf"))
            offset_res = tl.load(offset_ptr + dims0, mask=(dims0 < d) & HAS_OFFSET, other=0.0)
        else:
            c_res = 0.0
            c_lo_res = 0.0
            bias_res = 0.0
            offset_res = 0.0
        for t in range(pid, n_tiles, programs):
            x_tile = x_next
            prev_tile = prev_next
            w_tile = w_next
            if PREFETCH:
                next_rows += programs * BLOCK_N
                x_next = tl.load(x_ptr + next_rows[:, None] * stride_xn + dims0[None, :] * stride_xd,
                                 mask=(next_rows < n)[:, None] & (dims0 < d)[None, :], other=0.0)
                prev_next = tl.load(prev_ptr + next_rows, mask=(next_rows < n) & HAS_PREV & ahead, other=0)
                w_next = tl.load(weight_ptr + next_rows, mask=(next_rows < n) & HAS_WEIGHT & ahead, other=0.0)
            i, c, acc_sums, acc_counts = _tile(
                t, x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, c32_ptr, offset_ptr, scale_ptr, norm_ptr, weight_ptr,
                c_norm_ptr, row_index_ptr, row_count, tile_offset, searched_stride,
                labels_ptr, sq_dist_ptr, lower_ptr, prev_ptr, flag_count_ptr, flag_rows_ptr, key_ptr, searched_ptr, sums_ptr, counts_ptr,
                n, k, d, stride_xn, stride_xd, bound_coef, bias_coef, pair_coef, pair_acc_coef, replica, acc_sums, acc_counts, chunk_min_ptr, min_chunk, half_ptr, xh_ptr,
                BLOCK_N, BLOCK_K, BLOCK_D, KP, DP, HAS_OFFSET, HAS_SCALE, HAS_WEIGHT, HAS_ROW_INDEX, CHECK,
                STORE_SQ_DIST, STORE_LOWER, HAS_PREV, UPDATE, RAW_MMA, PRECISION, ONE_CHUNK, EAGER, EPI_D, SPLIT, SWAP, KEYS, SEARCHED,
                DISTANCE_BOUND, CHUNK_MINS, PACK_KEYS, HALF, LAZY_BITS, PAIR_BITS, CENTRED, x_tile, prev_tile, w_tile, PREFETCH, ONE_TILE,
                c_res, c_lo_res, bias_res, offset_res)
            inertia_rows += i
            changed_rows += c
        inertia = tl.sum(inertia_rows, axis=0)
        changed = tl.sum(changed_rows.to(tl.int64), axis=0)
        if UPDATE == 3:
            flush_carry(sums_ptr + replica * k * d, counts_ptr + replica * k, acc_sums, acc_counts, k, d, KP, DP)
    else:
        inertia, changed, acc_sums, acc_counts = _tile(
            pid, x_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, c32_ptr, offset_ptr, scale_ptr, norm_ptr, weight_ptr,
            c_norm_ptr, row_index_ptr, 0, tile_offset, searched_stride,
            labels_ptr, sq_dist_ptr, lower_ptr, prev_ptr, flag_count_ptr, flag_rows_ptr, key_ptr, searched_ptr, sums_ptr, counts_ptr,
            n, k, d, stride_xn, stride_xd, bound_coef, bias_coef, pair_coef, pair_acc_coef, replica, acc_sums, acc_counts, chunk_min_ptr, min_chunk, half_ptr, xh_ptr,
            BLOCK_N, BLOCK_K, BLOCK_D, KP, DP, HAS_OFFSET, HAS_SCALE, HAS_WEIGHT, HAS_ROW_INDEX, CHECK,
            STORE_SQ_DIST, STORE_LOWER, HAS_PREV, UPDATE, RAW_MMA, PRECISION, ONE_CHUNK, EAGER, EPI_D, SPLIT, SWAP, KEYS, SEARCHED,
                DISTANCE_BOUND, CHUNK_MINS, PACK_KEYS, HALF, LAZY_BITS, PAIR_BITS, CENTRED, 0.0, 0, 0.0, 0, ONE_TILE, 0.0, 0.0, 0.0, 0.0)
    tl.store(part_inertia_ptr + part_base + pid, inertia)
    tl.store(part_changed_ptr + part_base + pid, changed)


@triton.jit
def _half_rows_kernel(x_ptr, out_ptr, half_ptr, control_ptr, start, n, d, stride_xn, stride_xd,
                      BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_CONTROL: tl.constexpr):
    """Rows ``start``.. of x times the pass's scale s, as fp16 (contiguous): the operand of a chunk's
    search with fp16 operands (``AssignPass``)."""
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        scale = tl.load(half_ptr)
        local = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rows = start + local.to(tl.int64)
        row_mask = rows < n
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            mask = row_mask[:, None] & (dims < d)[None, :]
            v = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=mask, other=0.0)
            tl.store(out_ptr + local.to(tl.int64)[:, None] * d + dims[None, :], (v * scale).to(tl.float16), mask=mask)


@triton.jit
def _first_min(v0, i0, v1, i1):
    """Combine of a (value, index) minimum: of equal values the first operand's (lower) index stays."""
    take = v1 < v0
    return tl.where(take, v1, v0), tl.where(take, i1, i0)


@triton.jit
def _assign_small_d_kernel(
    x_ptr, c_ptr, offset_ptr, scale_ptr, weight_ptr,
    labels_ptr, sq_dist_ptr, prev_ptr, acc_ptr, counts_offset, part_inertia_ptr, part_changed_ptr,
    control_ptr, n, k, d, stride_xn, stride_xd, tiles_per_program,
    BLOCK_N: tl.constexpr, DP: tl.constexpr, KP: tl.constexpr, NC: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    STORE_SQ_DIST: tl.constexpr, HAS_PREV: tl.constexpr, UPDATE: tl.constexpr, HAS_CONTROL: tl.constexpr,
    REG_ACC: tl.constexpr, COLUMNS: tl.constexpr, KC: tl.constexpr, ONE_CHUNK: tl.constexpr,
    DENSE_ROWS: tl.constexpr,
):
    """d <= 8: one row per thread, the distance taken directly from the difference in fp32 (exact up
    to fp32 rounding of d terms); tensor cores would pad d to 16.

    With ``COLUMNS`` (d <= 4) a tile's distances are a (KC centroids x BLOCK_N rows) array: each
    thread holds a chunk of KC centroids for its rows, so its KC distances and their minimum (one
    ``tl.reduce`` of (distance, index) pairs, lowest index on ties) are independent in-thread work.
    With ``ONE_CHUNK`` (k <= KC) the program loads the centroids once. (Without ``COLUMNS``, a loop
    over single centroids, each waiting on its own load: 100M x 2, k = 32 takes 6.0 ms per pass on
    an H200, against 1.8.)

    Program ``p`` of ``G`` takes row tiles ``p, p + G, p + 2G, ...`` (``tiles_per_program`` of them)
    and keeps its statistics and (few clusters) its per-cluster sums in registers, so a pass issues
    one set of atomics per program, not per tile. The loads of tile ``t + 1`` (rows, weights,
    scales, previous labels) are issued before tile ``t`` is searched, so memory latency hides
    behind a tile's search. (H200, 100M x 2, k = 32, with the centroids in registers: 2.49 ms a pass
    without this, 1.84 with it; ncu put 83 % of the stall samples on the first uses of the rows' and
    the previous labels' loads, which ptxas had placed one before and one after the search.) ``DENSE_ROWS``:
    contiguous rows of exactly DP features, one vector load per row.

    With ``REG_ACC`` (d <= 4 and few clusters) each thread keeps per-cluster sums of its own rows in
    registers; otherwise the sums of a tile are a one-hot product on the tensor cores, whose columns
    hold each weighted feature and the weight split exactly into three tf32 parts, so the products
    are exact and only the fp32 accumulation rounds.
    """
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
        go = tl.load(control_ptr) == 0
    if go:
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        sums_ptr = acc_ptr
        counts_ptr = acc_ptr + counts_offset
        dims = tl.arange(0, DP)
        dim_mask = dims < d
        shift = tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0)
        inertia_rows = tl.zeros((BLOCK_N,), tl.float32)
        changed_rows = tl.zeros((BLOCK_N,), tl.int32)
        if UPDATE == 1:
            k_cols = tl.arange(0, KP)
            if REG_ACC:
                # Few clusters and features: each thread adds its rows into its own (clusters x
                # features) registers, reduced across threads once, at the program's end.
                tl.static_assert(COLUMNS, "the per-thread sums take the rows' features one by one")
                acc_w = tl.zeros((KP, BLOCK_N), tl.float32)
                acc_0 = tl.zeros((KP, BLOCK_N), tl.float32)
                if DP > 1:
                    acc_1 = tl.zeros((KP, BLOCK_N), tl.float32)
                if DP > 2:
                    acc_2 = tl.zeros((KP, BLOCK_N), tl.float32)
                    acc_3 = tl.zeros((KP, BLOCK_N), tl.float32)
            else:
                cols = tl.arange(0, NC)
                feature = cols % (d + 1)  # feature d is the weight
                part = cols // (d + 1)
                acc = tl.zeros((KP, NC), tl.float32)
        chunk = tl.arange(0, KC)
        if COLUMNS and ONE_CHUNK:
            # A padded centroid sits at infinity: its distance is +inf and never wins.
            h0 = tl.load(c_ptr + chunk * d, mask=chunk < k, other=float("inf"))
            if DP > 1:
                h1 = tl.load(c_ptr + chunk * d + 1, mask=chunk < k, other=0.0)
            if DP > 2:
                h2 = tl.load(c_ptr + chunk * d + 2, mask=chunk < k, other=0.0)
                h3 = tl.load(c_ptr + chunk * d + 3, mask=(chunk < k) & (chunk * 0 + 3 < d), other=0.0)
        # Step t loads tile t and searches tile t - 1 (its loads came in the step before).
        x_next = tl.zeros((BLOCK_N, DP), x_ptr.dtype.element_ty)
        scale_next = tl.full((BLOCK_N,), 1.0, tl.float32)
        w_next = tl.zeros((BLOCK_N,), tl.float32)
        prev_next = tl.zeros((BLOCK_N,), tl.int32)
        for t in range(tiles_per_program + 1):
            # 64-bit: n * stride can pass 2^31. Tile t = tiles_per_program (the last prefetch) lies
            # past the rows: the grid is cdiv(tiles, tiles_per_program).
            rows = (pid + t * programs).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
            row_mask = rows < n
            x_tile = x_next
            scale = scale_next
            w = w_next
            prev = prev_next
            if DENSE_ROWS:
                x_next = tl.load(x_ptr + rows[:, None] * DP + dims[None, :], mask=row_mask[:, None], other=0.0)
            else:
                x_next = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                                 mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
            if HAS_SCALE:
                scale_next = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
            if HAS_WEIGHT:
                w_next = tl.load(weight_ptr + rows, mask=row_mask, other=0.0)
            else:
                w_next = row_mask.to(tl.float32)
            if HAS_PREV:  # read before labels are written: labels may overwrite prev_labels in place
                prev_next = tl.load(prev_ptr + rows, mask=row_mask, other=0).to(tl.int32)
            rows = rows - programs * BLOCK_N
            row_mask = (rows >= 0) & (rows < n)
            if t > 0:
                xr = transform_rows(x_tile, row_mask, shift, scale, HAS_OFFSET, HAS_SCALE)
                best = tl.full((BLOCK_N,), float("inf"), tl.float32)
                label = tl.zeros((BLOCK_N,), tl.int32)
                if COLUMNS:
                    if DP == 1:
                        x0 = tl.sum(xr, axis=1)
                    elif DP == 2:
                        x0, x1 = tl.split(xr)
                    else:
                        even, odd = tl.split(tl.reshape(xr, (BLOCK_N, 2, 2)))
                        x0, x2 = tl.split(even)
                        x1, x3 = tl.split(odd)
                    for j0 in range(0, k, KC):
                        if ONE_CHUNK:
                            c0 = h0
                            if DP > 1:
                                c1 = h1
                            if DP > 2:
                                c2 = h2
                                c3 = h3
                        else:
                            chunk_cols = j0 + chunk
                            chunk_mask = chunk_cols < k
                            c0 = tl.load(c_ptr + chunk_cols * d, mask=chunk_mask, other=float("inf"))
                            if DP > 1:
                                c1 = tl.load(c_ptr + chunk_cols * d + 1, mask=chunk_mask, other=0.0)
                            if DP > 2:
                                c2 = tl.load(c_ptr + chunk_cols * d + 2, mask=chunk_mask, other=0.0)
                                c3 = tl.load(c_ptr + chunk_cols * d + 3, mask=chunk_mask & (chunk_cols * 0 + 3 < d), other=0.0)
                        diff = x0[None, :] - c0[:, None]
                        dist = diff * diff
                        if DP > 1:
                            diff = x1[None, :] - c1[:, None]
                            dist += diff * diff
                        if DP > 2:
                            diff = x2[None, :] - c2[:, None]
                            dist += diff * diff
                            diff = x3[None, :] - c3[:, None]
                            dist += diff * diff
                        low, at = tl.reduce((dist, tl.broadcast_to(chunk[:, None], (KC, BLOCK_N))), 0, _first_min)
                        better = low < best  # strict: earlier chunks win ties
                        best = tl.where(better, low, best)
                        label = tl.where(better, j0 + at, label)
                else:
                    for j in range(k):
                        cj = tl.load(c_ptr + j * d + dims, mask=dim_mask, other=0.0)
                        diff = xr - cj[None, :]
                        dist = tl.sum(diff * diff, axis=1)
                        better = dist < best  # strict: ties keep the lower index
                        best = tl.where(better, dist, best)
                        label = tl.where(better, j, label)
                if HAS_PREV:
                    changed_rows += (row_mask & (prev != label)).to(tl.int32)
                else:
                    changed_rows += row_mask.to(tl.int32)
                tl.store(labels_ptr + rows, label.to(labels_ptr.dtype.element_ty), mask=row_mask)
                if STORE_SQ_DIST:
                    tl.store(sq_dist_ptr + rows, best, mask=row_mask)
                inertia_rows += best * w  # w is 0 on masked rows
                if UPDATE == 1 and REG_ACC:
                    onehot = tl.where(k_cols[:, None] == label[None, :], w[None, :], 0.0)
                    acc_w += onehot
                    acc_0 += onehot * x0[None, :]
                    if DP > 1:
                        acc_1 += onehot * x1[None, :]
                    if DP > 2:
                        acc_2 += onehot * x2[None, :]
                        acc_3 += onehot * x3[None, :]
                if UPDATE == 1 and not REG_ACC:
                    onehot = (label[:, None] == k_cols[None, :]).to(tl.float32)
                    v = transform_rows(
                        tl.load(x_ptr + rows[:, None] * stride_xn + feature[None, :] * stride_xd, mask=row_mask[:, None] & (feature < d)[None, :], other=0.0),
                        row_mask, tl.load(offset_ptr + feature, mask=(feature < d) & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
                    v = tl.where(feature[None, :] == d, w[:, None], v * w[:, None])
                    hi = _round_tf32(v)
                    mid = _round_tf32(v - hi)
                    lo = v - hi - mid
                    v = tl.where(part[None, :] == 0, hi, tl.where(part[None, :] == 1, mid, tl.where(part[None, :] == 2, lo, 0.0)))
                    acc = tl.dot(tl.trans(onehot), v, acc, input_precision="tf32")
                if UPDATE == 2:
                    label64 = label.to(tl.int64)
                    tl.atomic_add(sums_ptr + label64[:, None] * d + dims[None, :], xr * w[:, None],
                                  mask=row_mask[:, None] & dim_mask[None, :], sem="relaxed")
                    tl.atomic_add(counts_ptr + label64, w, mask=row_mask, sem="relaxed")
        tl.store(part_changed_ptr + pid, tl.sum(changed_rows.to(tl.int64), axis=0))
        tl.store(part_inertia_ptr + pid, tl.sum(inertia_rows, axis=0))
        if UPDATE == 1 and REG_ACC:
            live = k_cols < k
            tl.atomic_add(counts_ptr + k_cols, tl.sum(acc_w, axis=1), mask=live, sem="relaxed")
            tl.atomic_add(sums_ptr + k_cols * d, tl.sum(acc_0, axis=1), mask=live, sem="relaxed")
            if DP > 1:
                tl.atomic_add(sums_ptr + k_cols * d + 1, tl.sum(acc_1, axis=1), mask=live, sem="relaxed")  # DP > 1: d >= 2
            if DP > 2:
                tl.atomic_add(sums_ptr + k_cols * d + 2, tl.sum(acc_2, axis=1), mask=live, sem="relaxed")  # DP > 2: d >= 3
                tl.atomic_add(sums_ptr + k_cols * d + 3, tl.sum(acc_3, axis=1), mask=live & (k_cols * 0 + 3 < d), sem="relaxed")
        if UPDATE == 1 and not REG_ACC:
            live = (k_cols < k)[:, None] & (part < 3)[None, :]
            tl.atomic_add(sums_ptr + k_cols[:, None] * d + feature[None, :], acc, mask=live & (feature < d)[None, :], sem="relaxed")
            tl.atomic_add(counts_ptr + k_cols[:, None] + feature[None, :] * 0, acc, mask=live & (feature == d)[None, :], sem="relaxed")


class AssignOutput(NamedTuple):
    """What :func:`assign` returns.

    ``inertia`` is the sum of ``weight * ||x - c_label||^2`` and ``changed`` the number of rows whose
    label differs from ``prev_labels`` (all rows without it), both as 0-d device tensors, so the
    caller decides when to synchronise. ``rechecked`` is the number of rows the exact mode
    re-searched against all centroids (0-d int32 device tensor; zero for the other modes): those
    with a third candidate inside the rounding bound. Rows with only two candidates inside it are
    settled in the pass itself.
    """

    labels: torch.Tensor
    sq_dist: torch.Tensor | None
    inertia: torch.Tensor
    changed: torch.Tensor
    rechecked: torch.Tensor


_OPERAND_ERROR = {
    # Relative error of (rows, centroids) as the tensor cores see them. fp32 rows go in raw and the
    # hardware may truncate them to tf32's 10 mantissa bits; the centroids are rounded to tf32 here.
    # fp16/bf16 rows are exact operands (products are exact, sums fp32); centroids are rounded to
    # nearest in that dtype.
    torch.float32: (2.0**-10, 2.0**-11),
    torch.float16: (0.0, 2.0**-11),
    torch.bfloat16: (0.0, 2.0**-8),
}
# fp32 rows as fp16 operands (``AssignPass.half``): rounded to nearest by our own conversion of the
# rows scaled by a power of two, so 2^-11 of each element in fp16's normal range, half of tf32's
# truncation error. An element in the subnormal range is off by up to 2^-25 / s instead; on a row
# norm floored at F sqrt(d) / s (``centroids.half_row_floor``) this covers both:
# 2^-11 ||x|| + 2^-25 sqrt(d) / s <= (1 + 2^-14 / F) 2^-11 max(||x||, F sqrt(d) / s), 17/16 of
# 2^-11 at F = 2^-10.
_HALF_ROW_ERROR = (1.0 + 2.0**-14 / HALF_ROW_FLOOR) * 2.0**-11


def gap_bound_coefficient(dtype: torch.dtype, d: int, split: bool = False) -> float:
    """``B`` such that the fast pass can misorder two centroids only if their score gap is <= B ||x|| max||c||.

    ``split``: bf16 centroids given as two parts (hi + lo), as the exact mode does; they then carry
    the square of the single rounding error.
    Each product ``x_i c_i`` carries relative error <= u_x + u_c + u_x u_c and the fp32
    accumulation at most ``d * 2^-24`` of ``sum |x_i c_i| <= ||x|| ||c||``; a score is
    ``||c||^2 - 2 x.c`` and a gap involves two scores: 4 times the product bound. Then a 1.25
    safety factor, as the accumulation order inside the tensor cores is not documented.
    """
    u_x, u_c = _OPERAND_ERROR[dtype]
    if split:
        u_c = u_c * u_c
    return 1.25 * 4.0 * (u_x + u_c + u_x * u_c + d * 2.0**-22)


def score_bound_coefficients(dtype: torch.dtype, d: int, split: bool = False,
                             half: bool = False) -> tuple[float, float]:
    """``(A, B)``: the exact mode's bound on one score's error besides the centroids' rounding,
    ``A ||x|| max||c|| + B max|bias|``, for unscaled rows. ``half``: fp32 rows multiplied as fp16
    operands (``_HALF_ROW_ERROR``, with the row norm floored by ``centroids.half_row_floor``).

    A score of the fast pass is ``bias - 2 x.c~`` for the centroid ``c~`` it multiplies (rounded:
    ``c = c~ + r``) and ``bias = ||c~||^2 + 2 m.c~``. Against the exact ``||c||^2 - 2 (x - m).c`` it
    is off by ``2 (x - m - c).r + ||r||^2``, which the kernel bounds by the row's distance to ``c``
    and ``max ||r||`` (so close centroids, those that matter, carry small errors), plus what is
    bounded here: the rows' operand rounding ``2 u_x ||x|| ||c~||`` and the fp32 accumulation of
    the bias and the ``d`` (``2d`` when split) products, ``gamma (|bias| + 2 ||x|| ||c~||)`` with
    ``gamma = 2^-22`` per term, as in ``gap_bound_coefficient``; then the bias's own rounding to
    fp32, and the same 1.25 safety factor.
    """
    u_x, u_c, gamma = _score_errors(dtype, d, split, half)
    return 1.25 * 2.0 * (u_x + gamma) * (1.0 + u_c), 1.25 * (gamma + 2.0**-24)


def pair_bound_coefficients(dtype: torch.dtype, d: int, split: bool = False,
                            half: bool = False) -> tuple[float, float]:
    """``(E, A)`` of ``_pair_floor``: ``E ||x||`` bounds the norm of a row's operand rounding (the
    same in every score of the row), ``A ||x|| max||c|| + B max|bias|`` (``B`` as in
    ``score_bound_coefficients``) one score's fp32 sums. ``score_bound_coefficients``' ``A`` is
    ``2 E (1 + u_c)`` plus this one; the same 1.25 safety factor."""
    u_x, u_c, gamma = _score_errors(dtype, d, split, half)
    return 1.25 * u_x, 1.25 * 2.0 * gamma * (1.0 + u_c)


def _score_errors(dtype: torch.dtype, d: int, split: bool, half: bool) -> tuple[float, float, float]:
    """(rows' operand error, centroids' operand error, fp32 sums' error per unit of magnitude) of a
    score over ``d`` products (``2d`` split), relative."""
    u_x, u_c = _OPERAND_ERROR[dtype]
    if half:
        if dtype != torch.float32 or split:
            raise ValueError(f"fp16 operands are for fp32 rows without split centroids, got {dtype}, split={split}")
        u_x = _HALF_ROW_ERROR
    if split:
        u_c = u_c * u_c
    return u_x, u_c, (2 * d if split else d) * 2.0**-22


def assign(
    x: torch.Tensor,
    centroids: torch.Tensor,
    *,
    precision: str = "exact",
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    raw_norms: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
    prev_labels: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    sums: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
    store_sq_dist: bool = True,
    config: dict | None = None,
) -> AssignOutput:
    """Nearest centroid of every (transformed) row of ``x`` (n, d) among ``centroids`` (k, d).

    Rows are transformed as they are read: ``(x - offset) * row_scale[:, None]``. ``centroids`` are
    float32 in that space. The fast pass multiplies the raw rows (so loads feed the tensor cores
    directly) by the centroids cast to ``x``'s dtype, with the transform folded into a
    per-centroid bias: ``||c||^2 - 2 (x - m).c = (||c||^2 + 2 m.c) - 2 x.c``, and for unit
    centroids of scaled rows, ``||x|| (||c||^2 - 2 x_hat.c)``. Re-checks, distances and sums use the
    transformed rows in fp32.

    Args:
        precision: see the module docstring.
        raw_norms: norms of the raw rows ``||x_i||`` (float32, (n,)) for ``"exact"``'s bound and
            the scaled rows; required with ``row_scale`` (where they are ``1 / row_scale``). Without
            them the exact mode takes them itself (in the launch that reads the rows for fp16
            operands, where there is one).
        sample_weight: float32 (n,) weights for the inertia and the sums.
        prev_labels: int32/int64 (n,) labels of the previous pass, for the changed count.
        labels: optional int32/int64 (n,) output buffer (default: new int64); may be ``prev_labels``
            itself, which is then updated in place.
        sums, counts: float32 (k, d) and (k,) buffers to which the (weighted) rows and weights of
            each cluster are added; both or neither.
        store_sq_dist: whether to return the per-row squared distances.
    """
    if (sums is None) != (counts is None):
        raise ValueError("pass both sums and counts, or neither")
    run, labels, sq_dist, kept = _run_pass(
        x, centroids, precision=precision, offset=offset, row_scale=row_scale, raw_norms=raw_norms,
        sample_weight=sample_weight, prev_labels=prev_labels, labels=labels, update=sums is not None,
        store_sq_dist=store_sq_dist, config=config)
    if sums is not None:
        sums += run.acc_sums.sum(0)
        counts += run.acc_counts.sum(0)
    rechecked = run.flag_count[0]
    if kept:  # the next call with this key overwrites the pass's buffers: hand out a copy
        rechecked = rechecked.clone()
    return AssignOutput(labels, sq_dist, run.part_inertia.sum(), run.part_changed.sum(), rechecked)


class PassSums(NamedTuple):
    """What :func:`assign_keeping_sums` returns. The last three are the pass's own buffers, valid
    until the next pass of the same shape on this thread: ``acc_sums`` (R, k, d) and ``acc_counts``
    (R, k), float32 replicas whose sum over R is the per-cluster sums of the transformed rows and
    their counts, and ``part_inertia`` (P,), float32 partials whose sum is the sum of the squared
    distances."""

    labels: torch.Tensor
    sq_dist: torch.Tensor | None
    acc_sums: torch.Tensor
    acc_counts: torch.Tensor
    part_inertia: torch.Tensor


def assign_keeping_sums(
    x: torch.Tensor,
    centroids: torch.Tensor,
    *,
    precision: str = "exact",
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    raw_norms: torch.Tensor | None = None,
    store_sq_dist: bool = False,
) -> PassSums:
    """:func:`assign` with the per-cluster sums left in the pass's accumulators, unreduced, for a
    following kernel (``online.ema_update``) to fold in: no zeroed sums, no reductions, no totals,
    which a VQ layer's training step, bound by launches, notices."""
    run, labels, sq_dist, _ = _run_pass(
        x, centroids, precision=precision, offset=offset, row_scale=row_scale, raw_norms=raw_norms,
        sample_weight=None, prev_labels=None, labels=None, update=True, store_sq_dist=store_sq_dist, config=None)
    return PassSums(labels, sq_dist, run.acc_sums, run.acc_counts, run.part_inertia)


def _run_pass(
    x: torch.Tensor, centroids: torch.Tensor, *, precision: str, offset: torch.Tensor | None,
    row_scale: torch.Tensor | None, raw_norms: torch.Tensor | None, sample_weight: torch.Tensor | None,
    prev_labels: torch.Tensor | None, labels: torch.Tensor | None, update: bool, store_sq_dist: bool,
    config: dict | None,
) -> tuple[AssignPass, torch.Tensor, torch.Tensor | None, bool]:
    """One assignment pass on a kept (or new) ``AssignPass``: ``(pass, labels, sq_dist, kept)``,
    ``kept`` saying whether the pass stays kept for the next call of its key."""
    if x.dim() != 2 or centroids.dim() != 2 or x.shape[1] != centroids.shape[1]:
        raise ValueError(f"expected x (n, d) and centroids (k, d), got {tuple(x.shape)} and {tuple(centroids.shape)}")
    if x.dtype not in _OPERAND_ERROR:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.device != centroids.device:
        raise ValueError(f"x is on {x.device} but centroids are on {centroids.device}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    n = x.shape[0]
    k = centroids.shape[0]
    if k == 0:
        raise ValueError("need at least one centroid")
    device = x.device
    c32 = centroids.to(torch.float32).contiguous()
    fast_pass = precision in ("exact", "fast")
    if raw_norms is None and fast_pass and row_scale is not None:
        raise ValueError("row_scale needs raw_norms")
    offset32 = None if offset is None else offset.to(torch.float32).contiguous()
    scaled = row_scale is not None
    inputs = {"x": x, "c32": c32, "offset": offset32, "row_scale": row_scale, "raw_norms": raw_norms,
              "sample_weight": sample_weight, "prev_labels": prev_labels, "labels": labels}
    key = None if config is not None else _reusable_key(inputs, k, precision, update, scaled, store_sq_dist)
    kept = None if key is None else _reused_passes().pop(key, None)
    if kept is None:
        kept = _KeptPass(AssignPass(x, k, precision, update=update, config=config, scaled=scaled))
    run = kept.run
    replayed = kept.replay(inputs, store_sq_dist) if key is not None and kept.replayable(inputs) else None
    if replayed is not None:
        labels, sq_dist = replayed
    else:
        labels = torch.empty(n, dtype=torch.int64, device=device) if labels is None else labels
        sq_dist = torch.empty(n, dtype=torch.float32, device=device) if store_sq_dist else None
        run(x, c32, offset=offset32, row_scale=row_scale, raw_norms=raw_norms, sample_weight=sample_weight,
            prev_labels=prev_labels, labels=labels, sq_dist=sq_dist)
        kept.calls += 1
    if key is not None:
        passes = _reused_passes()
        passes[key] = kept
        while len(passes) > REUSED_PASSES:
            passes.pop(next(iter(passes)))
    return run, labels, sq_dist, key is not None


class _KeptPass:
    """A pass that ``assign`` keeps for the calls of one key; on CUDA, queries (no previous labels,
    weights or label buffer; 16-byte aligned contiguous inputs) are replayed as a CUDA graph from
    the key's second call on (the first compiles the kernels).

    A pass is three to nine kernel launches, each costing the host tens of microseconds in Triton's
    launcher; a replay copies the inputs into the graph's own (static) tensors, launches the graph
    and copies the labels and distances out (H200, ``scripts/diag_reuse.py``, 2026-11-22, ms per
    call: ``torchkm.assign`` at 32,768 x 256 x 8192 0.84 against 1.89 eagerly with a kept pass and
    2.24 with a new one; the VQ layer's eager fp32 exact step 1.98 / 3.22 / 3.66).
    ``TORCHKM_REPLAY_QUERIES=0``: no graphs."""

    def __init__(self, run: AssignPass):
        self.run = run
        self.calls = 0
        self.replayed = ReplayedCall()

    def replayable(self, inputs: dict[str, torch.Tensor | None]) -> bool:
        x = inputs["x"]
        assert x is not None
        return (not self.replayed.failed and x.device.type == "cuda" and self.calls >= 1
                and os.environ.get("TORCHKM_REPLAY_QUERIES", "1") != "0"
                and inputs["prev_labels"] is None and inputs["sample_weight"] is None and inputs["labels"] is None
                and all(t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0) for t in inputs.values()))

    def replay(self, inputs: dict[str, torch.Tensor | None],
               store_sq_dist: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Labels and distances (copies) of the replayed query, or None where it cannot be captured."""
        x = inputs["x"]
        assert x is not None

        def query(static: dict[str, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
            labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
            sq_dist = torch.empty(x.shape[0], dtype=torch.float32, device=x.device) if store_sq_dist else None
            self.run(static["x"], static["c32"], offset=static["offset"], row_scale=static["row_scale"],
                     raw_norms=static["raw_norms"], sample_weight=None, prev_labels=None, labels=labels, sq_dist=sq_dist)
            return labels, sq_dist

        outputs = self.replayed(query, inputs, x.device)
        if outputs is None:
            return None
        labels, sq_dist = outputs
        return labels.clone(), None if sq_dist is None else sq_dist.clone()


# Passes kept by ``assign`` between calls, per thread (two threads must not share buffers), the most
# recently used last. ``_all_reused`` reaches every thread's dict so that one call can free them all.
_reused = threading.local()
_all_reused: weakref.WeakSet = weakref.WeakSet()


class _PassDict(dict):
    """A thread's kept passes; unlike a plain dict, weakly referenceable and known by identity."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__


def _reused_passes() -> dict:
    passes = getattr(_reused, "passes", None)
    if passes is None:
        passes = _reused.passes = _PassDict()
        _all_reused.add(passes)
    return passes


def _settings() -> tuple:
    """The ``TORCHKM_*`` environment as (name, value) pairs of bytes. Read from ``os.environ``'s
    encoded store where it has one: decoding all of a shell's environment costs tens of
    microseconds, as much as the rest of a small call's key."""
    store = getattr(os.environ, "_data", None)
    if os.supports_bytes_environ and isinstance(store, dict):  # (POSIX: its keys are bytes)
        return tuple(sorted(item for item in store.items() if item[0].startswith(b"TORCHKM_")))
    return tuple(sorted((name.encode(), value.encode()) for name, value in os.environ.items() if name.startswith("TORCHKM_")))


def clear_reused_passes(all_threads: bool = False) -> None:
    """Drop the passes ``assign`` keeps for reuse in this thread (every thread's with
    ``all_threads``), and their buffers. A pass another thread is running stays with that thread
    (it holds it while it runs) and is kept again when its call ends."""
    for passes in list(_all_reused) if all_threads else [_reused_passes()]:
        passes.clear()


def _reusable_key(inputs: dict[str, torch.Tensor | None], k: int, precision: str, update: bool, scaled: bool,
                  store_sq_dist: bool) -> tuple | None:
    """What a kept pass must match to serve this call of ``assign`` (``inputs``: its tensors by
    name, None where absent), or None where none may.

    Building an ``AssignPass`` (configs, buffers) costs more host time than a small pass takes on
    the GPU (about 0.25 ms of a VQ layer's eager step at 32,768 x 256, 8192 codes, H200), so calls
    of one shape reuse one. Not for traced tensors (torch.compile: the buffers are graph values),
    not during CUDA graph capture (a graph would keep writing the buffers that later calls use),
    not on another stream (its work could overlap this one's on the same buffers), and not for
    large passes (whose buffers, an fp16 copy of the rows and a replayed query's copy of its inputs
    among them, would stay held; their host time is small next to their GPU time). The key holds
    everything a pass's set-up and launches read: ``launch_key`` of the inputs (dtypes, shapes,
    strides, alignment, which are absent), the flags, and the ``TORCHKM_*`` settings.
    ``TORCHKM_REUSE_PASSES=0``: a new pass per call.
    """
    x = inputs["x"]
    assert x is not None
    if hopper_search.traced(x) or x.shape[0] * x.shape[1] > REUSED_PASS_MAX_ELEMENTS:
        return None
    settings = _settings()
    if (b"TORCHKM_REUSE_PASSES", b"0") in settings:
        return None
    stream = None
    if x.device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        stream = torch.cuda.current_stream(x.device).cuda_stream
    return launch_key("assign", k, inputs, stream=stream, precision=precision, update=update, scaled=scaled,
                      store_sq_dist=store_sq_dist, inference=torch.is_inference_mode_enabled(), settings=settings)


class AssignPass:
    """One configuration of the assignment pass with its buffers, reusable pass after pass.

    Everything a pass writes besides the labels lives here: the per-program partials of inertia
    and changed labels (``part_inertia``, ``part_changed``, fully overwritten by every pass), the
    accumulators of the fused sums (``acc_sums`` (R, k, d) and ``acc_counts`` (R, k): R replicas
    for few clusters, so that programs do not queue on the same addresses) and the exact mode's
    deferred-row list (``flag_count``, ``flag_rows``, and ``research_keys``, one per listed row for
    the re-search split into centroid chunks). With the candidate re-search (``cand_cap`` > 0),
    ``flag_count`` holds 2 + ``cand_cap`` + ``research_chunks`` counters: the deferred rows, the
    rows left to the full re-search (listed in ``full_slots``), each deferred row's candidates (in
    ``cand_ids``), and the rows listed for each centroid chunk (from ``lists_at``; the lists in
    ``cand_lists``, each row's threshold in ``cand_tops``). The eager search then also writes each
    row's lowest score per chunk (``chunk_mins``, where its tiles align with the chunks). The
    accumulators and ``flag_count`` must be zero when a pass starts: each call clears them as part
    of the centroids' preparation (the search sets the keys of the rows it lists), so a pass is
    three to seven launches (preparation, search, candidate plan, candidates, their distances,
    chunked re-search, re-search epilogue) and can be captured in a CUDA graph. ``scaled``: the
    passes will get a ``row_scale`` (cosine rows), which keep the gap bound of the exact mode (and
    for bf16, hi + lo centroids). ``fixed_rows``: every call passes the same ``x``, unchanged
    between calls (a fit's engine), whose largest |x| (fp16 operands) is then read by the first
    call only.
    """

    def __init__(self, x: torch.Tensor, k: int, precision: str, *, update: bool,
                 config: dict | None = None, extra_partials: int = 0, lower_bounds: bool = False,
                 moves: bool = False, scaled: bool = False, fixed_rows: bool = False):
        n, d = x.shape
        device = x.device
        if precision == "exact" and not lower_bounds and d > SMALL_D and exact_as_tf32x3(k, d, x.dtype):
            # Short rows, at most 128 clusters: every row with 3xTF32 products costs less than the best
            # two (see exact_as_tf32x3), all centroids in one tile. ``lower_bounds``: the caller
            # passes ``lower``, which comes from the best two.
            config = config or tf32x3_rows_config(n, k, d, x.dtype)
            precision = "tf32x3"
        self.k, self.precision = k, precision
        self.small_d = d <= SMALL_D
        self.traced = hopper_search.traced(x)
        self.check = precision == "exact" and not self.small_d
        self.fast = precision in ("exact", "fast")
        # bf16 rows are exact operands, so one product's error is the centroids' rounding, which the
        # distance bound keeps small for the close centroids that matter (1.3 % of random rows
        # re-searched at 1M x 128, k = 4096). Scaled (cosine) rows keep the gap bound, so there the
        # centroids go in as two bf16 parts (hi + lo, 16 bits of mantissa between them: two
        # products, few rows left to re-search). (Never for fp16, whose small lo parts would fall
        # into its subnormal range.) ``TORCHKM_BF16_SPLIT=1``/``0`` forces either (experiments).
        forced = os.environ.get("TORCHKM_BF16_SPLIT")
        self.split = self.check and x.dtype == torch.bfloat16 and (forced == "1" if forced in ("0", "1") else scaled)
        if not update:
            self.update, n_replicas = UPDATE_NONE, 1
        elif k > onehot_max_k(d):
            # (The small-d kernel adds into the first copy only.)
            self.update, n_replicas = UPDATE_ATOMIC, 1 if self.small_d else atomic_replicas(k, d)
        elif carries(k, d) and not self.small_d:
            # Each program adds its sums once (persistent programs, see ``carries``): no queueing.
            self.update, n_replicas = UPDATE_CARRY, 1
        else:
            self.update = UPDATE_ONEHOT
            # The small-d kernel keeps its sums in registers until its programs end: no replicas.
            n_replicas = 1 if self.small_d else min(128, max(1, (1 << 14) // (k * d)))
        self.n_replicas = n_replicas
        # One buffer, so that one launch clears both and one collective sums both. The kernels take
        # the buffer itself and find the counts at ``counts_offset``: under torch.compile, a launch
        # that writes a view at a storage offset is functionalised wrongly (torch 2.11's Inductor
        # clones such a view's whole storage from a copy of the view alone, reading past its end).
        self.counts_offset = n_replicas * k * d if update else 0
        self.acc = torch.empty(n_replicas * k * (d + 1) if update else 1, dtype=torch.float32, device=device)
        self.acc_sums = self.acc[: self.counts_offset].view(n_replicas, k, d) if update else None
        self.acc_counts = self.acc[self.counts_offset:].view(n_replicas, k) if update else None
        # ``moves``: float64 sums and counts kept across passes, which a pass called with
        # ``moves=True`` changes only by the rows whose label changed (``UPDATE_DELTA``). Their owner
        # sets them (e.g. from a pass's ``acc_sums``); no pass clears them.
        self.move_acc = torch.zeros(k * (d + 1) if moves else 1, dtype=torch.float64, device=device)
        self.move_sums = self.move_acc[: k * d].view(1, k, d) if moves else None
        self.move_counts = self.move_acc[k * d:].view(1, k) if moves else None
        self.flag_count = torch.empty(1, dtype=torch.int32, device=device)
        self.flag_rows = torch.empty(n if self.check else 1, dtype=torch.int32, device=device)
        self.cand_cap = self.copy_rows = self.neighbours = 0
        self.chunk_mins: torch.Tensor | None = None
        # Which search writes ``chunk_mins``: the Hopper search, the eager tl.dot search's epilogue.
        self.search_mins = self.eager_mins = False
        self.half = self.hopper = False
        self.half_rows = 0  # rows of the streamed search's fp16 copy, 0 for none
        # ``fixed_rows``: every call gets the same x, unchanged (a fit's engine), so the largest |x|
        # of fp16 operands is read once, not by every pass (H200, 1M x 128 fp32: 0.24 ms of a 4.3 ms
        # Lloyd iteration); the first call that needs it, or one given other rows, reads it.
        # ``TORCHKM_FIXED_ROWS=0``: every pass reads it (experiments).
        self.fixed_rows = fixed_rows and os.environ.get("TORCHKM_FIXED_ROWS", "1") != "0"
        self.rows_max_of: tuple | None = None
        # The rows' norms, where an exact pass is not given them (``__call__``).
        self.own_norms: torch.Tensor | None = None
        if self.small_d:
            self.block_n, self.main_grid, self.tiles_per_program = small_d_launch(n, device, self.update == UPDATE_ONEHOT)
            # The centroid-chunk layout of the small-d search for d <= 4 (``TORCHKM_SMALL_D_COLUMNS=0``:
            # the loop over single centroids, for experiments; its sums then take the one-hot product).
            self.columns = os.environ.get("TORCHKM_SMALL_D_COLUMNS", "1") != "0"
            # Centroids per chunk: all of them up to 32 (64 for one feature), so that no padded
            # centroid costs a distance and, in one chunk, each program loads them once.
            self.chunk = min(triton.next_power_of_2(k), 64 if d == 1 else 32)
            self.recheck_grid = 0
        else:
            cfg = dict(config or assign_config(n, k, d, x.dtype, precision, split=self.split))
            # The exact mode settles rows from the best two candidates: the eager search keeps them per
            # row, the lazy ones (per column slot) the best and second-lowest score of each slot. The
            # transposed search needs the whole row in one chunk and one product (no hi/lo
            # centroids: measured slower for bf16, see configs.py).
            cfg["SWAP"] = bool(cfg.get("SWAP", False) and cfg["BLOCK_D"] >= d and not self.split)
            cfg["EAGER"] = bool(cfg.get("EAGER", False) and not cfg["SWAP"])
            self.cfg = cfg
            # Rows of 64-256 features over many centroids on Hopper: the search overlapping its running
            # minimum with the next product (hopper_search.py), then the epilogue alone in its own
            # programs (``_epilogue_shape``). ``main_grid`` covers the more numerous launch, the
            # epilogue's or the tl.dot search's (extra programs find no rows), so every partial slot
            # is written whichever ran.
            # The exact mode everywhere it applies; the fast mode for fp32 and packed bf16 rows (fp16:
            # the tl.dot search measured as fast). With its configs by row width (kernels v14; H200,
            # diag_hopper_search.py, fused pass, Hopper / tl.dot ms): 32,768 x 256, k = 8192, fp32
            # exact 0.692 / 1.059, fast 0.530 / 0.677, bf16 fast 0.242 / 0.346; 1M x 64, k = 4096,
            # fp32 exact 2.77 / 6.26, fast 1.98 / 2.30, bf16 fast 1.41 / 1.91. Earlier, H200, k = 4096,
            # fused pass (scripts/diag_hopper_search.py), ms, Hopper against tl.dot search:
            # 1M x 128 exact 5.09 / 5.97 (fp32), 3.63 / 4.82 (bf16); fast 3.98 / 4.12 (fp32),
            # 2.69 / 2.41 (bf16); 1M x 64 exact 3.30 / 6.35 (fp32), 2.91 / 5.17 (bf16); fast 2.49 /
            # 2.30 (fp32), 1.93 / 1.94 (bf16); 32,768 x 256, k = 8192, bf16 exact 0.500 / 0.537.
            # With packed keys (hopper_search.packed; same tool, 2026-11-22): exact 4.39 / 6.50
            # (fp32), 3.30 / 5.37 (bf16); fast fp32 3.60 / 4.14; 1M x 64 exact 3.00 / 6.27, 2.56 /
            # 5.17; 32,768 x 256 bf16 exact 0.456 / 0.593. bf16 fast, packed: 1M x 128 2.41 / 2.44,
            # 1M x 64 1.65 / 1.93, 32,768 x 256 0.253 / 0.332, 1M x 128 with k = 65,536 33.2 / 45.9.
            # (Only for real tensors: under torch.compile's tracing the pass keeps the tl.dot search.)
            # Not for bf16 rows of at most 32 features (H200, 245,760 x 32, k = 1024, fast Lloyd
            # iteration, three alternating runs, 2026-11-22: 0.128 / 0.136 / 0.137 ms against 0.128 /
            # 0.133 / 0.133 on the tl.dot search), where the exact mode takes it (``supported``).
            # TORCHKM_HOPPER_FAST=1 / 0: the fast mode takes it wherever supported / nowhere (A/B).
            fast_setting = os.environ.get("TORCHKM_HOPPER_FAST")
            fast_hopper = (fast_setting == "1" if fast_setting in ("0", "1") else
                           x.dtype == torch.float32 or (hopper_search.packed(x, k) and d > 32)
                           or hopper_search.streamed(x))
            # Wide 16-bit rows (``hopper_search.streamed``): the exact mode only where the streamed
            # search writes its record as fast as the tl.dot search's (``streamed_checks``).
            # A traced pass (torch.compile) keeps the tl.dot search unless ``TORCHKM_HOPPER_TRACED=1``,
            # which takes it through its op (``hopper_search.in_traced_passes``).
            self.hopper = (hopper_search.mode() is not None and not self.split
                           and (not self.traced or hopper_search.in_traced_passes())
                           and ((precision == "exact" and (not hopper_search.streamed(x)
                                                           or hopper_search.streamed_checks(x)))
                                or (precision == "fast" and fast_hopper))
                           and hopper_search.supported(x, k, scaled=scaled, split=False, row_list=False))
            self.main_grid = triton.cdiv(n, cfg["BLOCK_N"]) if n else 0
            if self.update == UPDATE_CARRY:
                self.main_grid = persistent_grid(self.main_grid, num_persistent_programs(device))
            if self.hopper and n:
                # Search and epilogue one chunk of rows at a time: the record is O(chunk). Each
                # chunk's epilogue launch writes its own run of partial slots (``chunk_grid``).
                self.chunk_rows = hopper_search.chunk_rows(n, max(cfg["BLOCK_N"], 128), device)
                self.n_chunks = triton.cdiv(n, self.chunk_rows)
                self.epilogue_shape = _epilogue_shape(cfg, self.update)
                chunk_tiles = self.chunk_rows // self.epilogue_shape[0]
                self.chunk_grid = (persistent_grid(chunk_tiles, num_persistent_programs(device))
                                   if self.update == UPDATE_CARRY else chunk_tiles)
                # Also enough programs for a launch of the tl.dot search (extra ones find no rows).
                self.main_grid = max(self.main_grid, self.n_chunks * self.chunk_grid)
                # Over several chunks on a GPU the searches alternate between two side streams and
                # two records, so that chunk i + 1's search fills the SMs that chunk i's search
                # and epilogue leave idle. ``TORCHKM_HOPPER_OVERLAP=0``: one stream, one record
                # (experiments).
                self.overlap = (self.n_chunks > 1 and device.type == "cuda" and not self.traced
                                and os.environ.get("TORCHKM_HOPPER_OVERLAP", "1") != "0")
                # Allocated by the first call that searches (passes over row lists never do).
                self.searched = None
                self.search_streams = (torch.cuda.Stream(device), torch.cuda.Stream(device)) if self.overlap else ()
            else:
                self.hopper = self.overlap = False
                self.searched, self.search_streams = None, ()
            # fp32 rows through the streamed eager search multiply fp16 operands: the same 11
            # significant bits as tf32, at twice its tensor-core rate. Rows and centroids are scaled
            # by one power of two into fp16's range (``centroids.amax_parts``, ``_half_scale``: one
            # small launch per pass reads x for its largest |x|); the exact mode's bound takes fp16's
            # rounding to nearest and, with a floor on the row norm, its subnormals
            # (``_HALF_ROW_ERROR``). ``TORCHKM_HALF_OPERANDS=0``: tf32 products (experiments).
            # The Hopper search takes them too, converting each row tile as it loads it (once per
            # program, then resident); the fp16 centroids need 16-byte rows for TMA (d a multiple
            # of 8). Unpacked, fp16 operands paid off only in the exact mode and for rows over 512
            # bytes (H200, Lloyd iteration, ms, tf32 -> fp16, bench_lloyd 2026-11-22: 1M x 128,
            # k = 4096, exact 4.57 -> 4.34, fast 3.45 -> 3.56; 32,768 x 256, k = 8192, exact 0.97
            # -> 0.86, fast 0.84 -> 0.62, the search alone 0.80 -> 0.40); packed (the bias and row
            # term as fp16 parts, ``hopper_search.packed``), the fast mode takes them too (fused
            # pass, 1M x 128, k = 4096, 2026-11-27: fast 3.63 -> 2.47 ms against packed tf32), where
            # the rows' maxima are read once (a fit's engine: ``fixed_rows``) or k is large: a pass
            # over other rows reads them first (``amax_parts``: 0.24 ms at 1M x 128, 2026-11-22), and
            # the products save about 0.28 ms per 1,000 centroids there, so by that estimate fewer
            # than about 1,000 centroids lose (not timed). Not in traced passes.
            fast_half = hopper_search.packed(x, k, half=True) and (self.fixed_rows or k >= HALF_FAST_MIN_K)
            hopper_half = (self.hopper and not self.traced
                           and (self.check or d * x.element_size() > 512 or fast_half)
                           and hopper_search.supported(x, k, scaled=False, split=False, row_list=False,
                                                       dtype=torch.float16))
            self.half = (os.environ.get("TORCHKM_HALF_OPERANDS", "1") != "0" and x.dtype == torch.float32
                         and self.fast and not self.split and not scaled
                         and (hopper_half
                              or (not self.hopper and cfg["EAGER"] and not cfg["SWAP"] and cfg["BLOCK_D"] < d)))
            # The tiles of the passes that take fp16 operands; passes over row lists keep ``cfg`` (tf32).
            self.half_cfg = cfg
            if self.half and not self.hopper and config is None:
                # 16-bit operands: the 16-bit rows' streamed tiles (H200, 1M x 768, k = 8192, fused
                # pass with feature chunks of 32 -> 64: fast 31.4 -> 28.7 ms, exact 42.7 -> 41.7; in
                # tf32 these tiles spill). Same rows and centroids a tile: the grid and the chunk
                # minima do not depend on which tiles a pass takes.
                tiles = assign_config(n, k, d, torch.float16, precision)
                if (tiles["EAGER"] and not tiles["SWAP"] and tiles["BLOCK_D"] < d
                        and (tiles["BLOCK_N"], tiles["BLOCK_K"]) == (cfg["BLOCK_N"], cfg["BLOCK_K"])):
                    self.half_cfg = {**cfg, **{key: tiles[key] for key in ("BLOCK_D", "num_warps", "num_stages")}}
            if self.half:
                sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
                self.half_x_programs = max(1, min(4 * sms, triton.cdiv(n, 32)))
                # (-1: the rows' maxima are not known yet, see ``__call__``.)
                self.half_parts = torch.full((self.half_x_programs + centroid_parts(k * d, sms),), -1.0,
                                             dtype=torch.float32, device=device)
            if self.half and not self.hopper:
                # The search reads an fp16 copy of its rows, made a chunk at a time (at most
                # HALF_ROWS_BYTES, whole waves of one program per SM), so that x stays the only
                # O(n d) tensor. (Scaling the fp32 tiles in the search itself, between their
                # load and the product: H200, 1M x 768, k = 8192, fast pass 49.9 -> 47.1 ms only.)
                block_n = cfg["BLOCK_N"]
                waves = max(1, HALF_ROWS_BYTES // (sms * block_n * d * 2))
                self.half_rows = min(triton.cdiv(n, block_n) * block_n, waves * sms * block_n)
                self.half_chunks = triton.cdiv(n, self.half_rows)
                chunk_tiles = self.half_rows // block_n
                self.half_grid = (persistent_grid(chunk_tiles, num_persistent_programs(device))
                                  if self.update == UPDATE_CARRY else chunk_tiles)
                self.main_grid = max(self.main_grid, self.half_chunks * self.half_grid)
                self.half_x: torch.Tensor | None = None  # allocated by the first call
            self.recheck_grid = num_persistent_programs(device) if self.check and self.main_grid else 0
            if self.check:
                self.recheck_cfg = {"EAGER": False, **assign_config(n, k, d, torch.float32, "tf32x3"), "SWAP": False}
                # The re-search splits the centroids into chunks, one program column each, so
                # that a few row tiles of deferred rows still fill the GPU (a pass over 32,768 rows
                # defers a few thousand: 20 tiles of 128). Each row keeps its best (score, index) of
                # every chunk in one key slot; the re-search launch then only runs the epilogue.
                # Up to 8 chunks; 16 with the candidate re-search, which then skips more of them
                # (chunk minima, below): H200, 1M x 768, k = 8192, Lloyd-2 centroids, exact pass
                # fp32 61.4 -> 59.1 ms, bf16 39.4 -> 37.5 (scripts/diag_streamed.py, 2026-11-22).
                block_k = self.recheck_cfg["BLOCK_K"]
                with_candidates = os.environ.get("TORCHKM_RESEARCH_CANDIDATES", "1") != "0"
                chunks = min(int(os.environ.get("TORCHKM_RESEARCH_CHUNKS", "16" if with_candidates else "8")),
                             triton.cdiv(k, 2 * block_k))
                self.research_chunk = triton.cdiv(triton.cdiv(k, chunks), block_k) * block_k
                self.research_chunks = triton.cdiv(k, self.research_chunk)
                self.research_keys = torch.empty(n if self.research_chunks > 1 else 1, dtype=torch.int64,
                                                 device=device)
                # The split re-search first scores its rows' chunks again with the fast product and
                # keeps the few centroids that could still win, then compares those directly: one
                # product per tile instead of three. Rows with more than CANDIDATES of them (or past
                # the first ``cand_cap`` deferred rows, ``candidate_rows``) take the
                # 3xTF32 re-search. Only under the distance bound, which says which scores could
                # win. H200, 1M x 768, k = 8192, centroids after three Lloyd iterations (16-19 % of
                # the rows deferred), scripts/diag_streamed.py: see BENCHMARKS.md.
                # ``TORCHKM_RESEARCH_CANDIDATES=0``: every deferred row in 3xTF32 (experiments).
                self.cand_cap = candidate_rows(n) if self.research_chunks > 1 and with_candidates else 0
                if self.cand_cap:
                    # Counts: deferred rows, rows left to the full re-search, each row's candidates,
                    # the rows listed for each centroid chunk (``lists_at`` on). Then each row's
                    # candidates, its threshold, and the chunks' row lists: with 16 chunks, 136
                    # bytes per candidate slot (``candidate_rows``: half the rows), and ``full_slots``
                    # 4 per row. With the chunk minima below, about 140 bytes per row of the pass.
                    # Each chunk has two row lists: the rows copied into fp16 and the others.
                    self.lists_at = 2 + self.cand_cap
                    self.flag_count = torch.empty(self.lists_at + 2 * self.research_chunks, dtype=torch.int32,
                                                  device=device)
                    self.cand_ids = torch.empty(self.cand_cap * CANDIDATES, dtype=torch.int32, device=device)
                    self.cand_tops = torch.empty(self.cand_cap, dtype=torch.float32, device=device)
                    self.cand_lists = torch.empty(self.research_chunks * self.cand_cap, dtype=torch.int32,
                                                  device=device)
                    self.full_slots = torch.empty(n, dtype=torch.int32, device=device)
                    self.neighbours = neighbour_count(k)
                    if self.neighbours:
                        # (``need`` and ``tally`` start cleared; each pass's neighbour launches clear them again.)
                        self.neighbour_need = torch.zeros(k, dtype=torch.int32, device=device)
                        self.neighbour_tally = torch.zeros(k, dtype=torch.int32, device=device)
                        self.neighbour_ids = torch.empty(k, self.neighbours, dtype=torch.int32, device=device)
                        self.neighbour_counts = torch.empty(k, dtype=torch.int32, device=device)
                        self.neighbour_radius = torch.empty(k, dtype=torch.float32, device=device)
                    # The deferred rows the plan copies into the streamed search's fp16 row buffer
                    # (fp16 operands; see the launch).
                    self.copy_rows = min(self.cand_cap, self.half_rows)
                    # The eager search also keeps each row's lowest score per chunk (4 bytes per
                    # row and chunk), so that the candidate re-search skips the chunks that cannot
                    # hold a winner. H200, 1M x 768, k = 8192, Lloyd-2 centroids, 8 chunks: candidate
                    # products fp32 16.8 -> 7.2 ms, bf16 10.3 -> 5.2 (scripts/diag_streamed.py,
                    # 2026-11-22). ``TORCHKM_CHUNK_MINS=0``: every chunk (experiments).
                    # The ring search writes them too (wide 16-bit rows, ``hopper_search.search_chunk_mins``):
                    # without them its exact pass's candidate re-search scored every chunk.
                    self.search_mins = (self.hopper and not self.traced
                                        and hopper_search.search_chunk_mins(x, self.research_chunk, check=True))
                    self.eager_mins = (self.cfg["EAGER"] and not self.cfg["SWAP"]
                                       and self.research_chunk % self.cfg["BLOCK_K"] == 0)
                    if (self.search_mins or self.eager_mins) and os.environ.get("TORCHKM_CHUNK_MINS", "1") != "0":
                        self.chunk_mins = torch.empty(n * self.research_chunks, dtype=torch.float32, device=device)
        # The exact pass over wide 16-bit rows (the ring search's) adds its sums after its labels are
        # final, in label order (``update.add_sorted_sums``: one atomic a run of a label in each
        # block of 128 rows), not in its epilogue (a second sweep of each row tile once its labels
        # are settled, one atomic a row and feature, and the re-searched rows' own): H100, 1M x 768
        # bf16, k = 8,192, the exact pass 27.67 ms with its epilogue's sums, 25.09 without; the
        # sorted sums alone 0.89 ms (BENCHMARKS.md 2026-12-07, "chunk minima"). The fast pass keeps
        # its sums in its one sweep (0.70 ms there). ``TORCHKM_SORTED_SUMS=1``/``0``: after the pass /
        # in the epilogue (default: ``SORTED_SUMS_DEFAULT``); ``all``: every exact pass after the
        # Hopper search so, narrower rows and fp32 ones too (for timing; not measured yet). (Into
        # the first copy of the sums: the others stay as cleared.)
        sorted_setting = os.environ.get("TORCHKM_SORTED_SUMS", SORTED_SUMS_DEFAULT)
        if sorted_setting not in ("0", "1", "all"):
            raise ValueError(f"TORCHKM_SORTED_SUMS: 0, 1 or all, got {sorted_setting!r}")
        self.sorted_sums = (self.check and self.hopper and not self.traced and self.update == UPDATE_ATOMIC
                            and (sorted_setting == "all" or (sorted_setting == "1" and hopper_search.streamed(x))))
        # ``extra_partials`` trailing slots belong to another kernel of the same iteration (the
        # pruned Lloyd's settle pass), so that one reduction sees both.
        self.extra_base = self.main_grid + self.recheck_grid
        self.part_inertia = torch.empty(self.extra_base + extra_partials, dtype=torch.float32, device=device)
        self.part_changed = torch.empty(self.extra_base + extra_partials, dtype=torch.int64, device=device)
        self.spares: dict[tuple[str, torch.dtype], torch.Tensor] = {}  # for unused pointer arguments
        if self.main_grid == 0:  # no program writes them
            self.part_inertia.zero_()
            self.part_changed.zero_()

    def _searched_chunks(self, x: torch.Tensor, prepared: Any, control: torch.Tensor | None, main: dict[str, Any],
                         half: bool = False, chunk_mins: bool = False) -> None:
        """The Hopper search and the epilogue over it, chunk by chunk. With ``overlap``, chunk i's
        search runs on side stream i % 2 into record i % 2, once the epilogue that read that record
        (chunk i - 2's) is done: a search can start while the previous one drains and the
        epilogue runs. The caller's stream waits for every search it reads, so all work has joined
        it on return (also under CUDA graph capture). ``main``: the epilogue launch's arguments, its
        rows per program in ``BLOCK_N``. ``half``: the search scales each row tile into fp16 as it
        loads it, and the epilogue scales the record back. ``chunk_mins``: the search writes the
        rows' chunk minima (``search_mins``)."""
        if self.searched is None:
            self.searched = torch.empty(2 if self.overlap else 1, hopper_search.record_rows(self.check),
                                        self.chunk_rows, dtype=torch.float32, device=x.device)
        offset = main["offset_ptr"] if main["HAS_OFFSET"] else None
        # ``main["CENTRED"]``: the search rounds the rows less the offset, against ||c~||^2 alone.
        centred = bool(main["CENTRED"])
        bias = prepared.bias_centred if centred else prepared.bias
        # The packed search's centroid operand, once for all chunks (a traced search makes its own).
        packed = hopper_search.packed(x, self.k, half=half) and not self.traced
        operands = (hopper_search.search_operands(bias, torch.float16 if half else x.dtype) if packed
                    else None)
        caller = torch.cuda.current_stream(x.device) if self.overlap else None
        for stream in self.search_streams:
            stream.wait_stream(caller)  # the prepared centroids, the control word
        half_scale = prepared.half_scale if half else None
        read = []
        for chunk in range(self.n_chunks):
            start = chunk * self.chunk_rows
            record = self.searched[chunk % len(self.searched)]
            mins = (dict(chunk_mins=self.chunk_mins[start * self.research_chunks:], min_chunk=self.research_chunk)
                    if chunk_mins else {})
            if self.overlap:
                stream = self.search_streams[chunk % 2]
                with torch.cuda.stream(stream):
                    if chunk >= 2:
                        stream.wait_event(read[chunk - 2])
                    hopper_search.search(x[start:start + self.chunk_rows], prepared.c_mma, bias, record,
                                         check=self.check, control=control, offset=offset, operands=operands,
                                         half_scale=half_scale, centred=centred, **mins)
                caller.wait_stream(stream)
            elif self.traced:
                hopper_search.search_in_graph(x[start:start + self.chunk_rows], prepared.c_mma, prepared.bias,
                                              self.searched, chunk % len(self.searched), check=self.check,
                                              control=control, offset=offset)
            else:
                hopper_search.search(x[start:start + self.chunk_rows], prepared.c_mma, bias, record,
                                     check=self.check, control=control, offset=offset, operands=operands,
                                     half_scale=half_scale, centred=centred, **mins)
            launcher(_assign_kernel)[(self.chunk_grid,)](
                x, prepared.c_mma, searched_ptr=record, SEARCHED=True, part_base=chunk * self.chunk_grid,
                tile_offset=start // main["BLOCK_N"], searched_stride=self.chunk_rows,
                **({"maxnreg": EPILOGUE_MAX_REGISTERS, **main} if half and self.check else main),
            )
            if self.overlap:
                read.append(caller.record_event())

    def _half_chunks(self, x: torch.Tensor, prepared: Any, block_n: int, main: dict[str, Any],
                     searched: torch.Tensor) -> None:
        """The search with fp16 operands, chunk by chunk: each chunk's rows scaled into an fp16 copy
        (``_half_rows_kernel``), then the pass's launch over that chunk, writing its own run of
        partial slots."""
        n, d = x.shape
        if self.half_x is None:
            self.half_x = torch.empty(self.half_rows, d, dtype=torch.float16, device=x.device)
        block_r = 32
        for chunk in range(self.half_chunks):
            start = chunk * self.half_rows
            launcher(_half_rows_kernel)[(triton.cdiv(min(self.half_rows, n - start), block_r),)](
                x, self.half_x, prepared.half_scale, main["control_ptr"], start, n, d, x.stride(0), x.stride(1),
                BLOCK_R=block_r, BLOCK_D=min(64, triton.next_power_of_2(d)), HAS_CONTROL=main["HAS_CONTROL"],
            )
            launcher(_assign_kernel)[(self.half_grid,)](
                x, prepared.c_mma, **{**main, "xh_ptr": self.half_x}, searched_ptr=searched,
                SEARCHED=False, part_base=chunk * self.half_grid, tile_offset=start // block_n,
                searched_stride=self.half_rows,
            )

    def _lazy_bits(self, d: int, searched: bool, half: bool, scaled: bool) -> int:
        """Tile bits of the lazy search's packed keys (``_tile``, ``LAZY_BITS``), 0 for none: the lazy
        row-oriented search of raw, unscaled rows in one feature chunk, one product a tile, 16 to
        1,024 centroid tiles. The loop then takes a third fewer instructions (sm_90 SASS at 245,760 x
        32, k = 1,024: 255 -> 174 a tile exact, 280 -> 197 fast), but each program also sums its rows'
        term and decodes its keys: H200, fused pass, ms, compare/select -> packed
        (scripts/diag_lazy_keys.py, 2026-11-28): 245,760 x 32 x 1,024 fp32 exact 0.225 -> 0.208,
        bf16 fast 0.116 -> 0.106; 3.9M x 32 x 1,024 fp32 exact 3.28 -> 2.98, bf16 fast 1.71 -> 1.56;
        at 10 tiles (1M x 24 x 300) fast 0.398 -> 0.434 fp32, 0.389 -> 0.414 bf16, so not below 16.
        ``TORCHKM_LAZY_KEYS=1``: from 2 tiles, ``0``: never (experiments and tests)."""
        cfg = self.cfg
        tiles = triton.cdiv(self.k, cfg["BLOCK_K"])
        setting = os.environ.get("TORCHKM_LAZY_KEYS", "auto")
        if (not self.main_grid or searched or half or scaled or self.split or not self.fast or cfg["EAGER"]
                or cfg["SWAP"] or cfg["BLOCK_D"] < d or tiles < (2 if setting == "1" else 16) or tiles > 1024
                or setting == "0"):
            return 0
        return (tiles - 1).bit_length()

    def _bound_arguments(self, dtype: torch.dtype, d: int, scaled: bool, packed: bool = False,
                         half: bool = False) -> dict[str, Any]:
        # Unscaled rows: each score's error besides the centroids' rounding, which the kernel bounds
        # by the distance (``score_bound_coefficients``); scaled (cosine) rows, or
        # TORCHKM_EXACT_BOUND=gap (experiments): the whole gap in raw-row units (``gap_bound_coefficient``).
        # fp32 rows of at most 32 features keep it too: there the epilogue sets the pace and the
        # distance bound's (every row's second distance, ||x||^2) cost more than the re-search it
        # saves (H200, 245,760 x 32, k = 1024: 0.230 -> 0.248 ms per pass, 2026-11-22, before the
        # lazy search's packed keys; TORCHKM_EXACT_BOUND=distance takes the distance bound there,
        # to measure it again).
        # CENTRED: the caller's (the Hopper search's centred fp16 operands, ``_searched_chunks``).
        no_pair = {"pair_coef": 0.0, "pair_acc_coef": 0.0, "PAIR_BITS": 0, "CENTRED": False}
        if not self.check:
            return {"bound_coef": 0.0, "bias_coef": 0.0, "DISTANCE_BOUND": False, **no_pair}
        setting = os.environ.get("TORCHKM_EXACT_BOUND", "auto")
        if scaled or setting == "gap" or (setting != "distance" and dtype == torch.float32 and d <= 32):
            return {"bound_coef": gap_bound_coefficient(dtype, d, split=self.split), "bias_coef": 0.0,
                    "DISTANCE_BOUND": False, **no_pair}
        # The packed Hopper search sums 6 more terms into each score (its bias and the row's term,
        # three parts each; 8 with fp16 operands, four parts each): its products count as d + 8.
        # fp16 operands: their rounding to nearest (``_HALF_ROW_ERROR``); ``TORCHKM_HALF_ROW_BOUND=0``
        # takes tf32's error for them, as before 2026-12-04 (experiments: A/B of the deferred rows).
        half = half and os.environ.get("TORCHKM_HALF_ROW_BOUND", "1") != "0"
        bound, bias = score_bound_coefficients(dtype, d + 8 if packed else d, split=self.split, half=half)
        pair, pair_acc = pair_bound_coefficients(dtype, d + 8 if packed else d, split=self.split, half=half)
        third = os.environ.get("TORCHKM_EXACT_THIRD", "1") != "0"
        # ``PAIR_BITS``: the caller's (it depends on the search that writes the record).
        return {"bound_coef": bound, "bias_coef": bias, "DISTANCE_BOUND": 2 if third else 1,
                **no_pair, "pair_coef": pair, "pair_acc_coef": pair_acc}

    def __call__(
        self, x: torch.Tensor, c32: torch.Tensor, *, offset: torch.Tensor | None, row_scale: torch.Tensor | None,
        raw_norms: torch.Tensor | None, sample_weight: torch.Tensor | None, prev_labels: torch.Tensor | None,
        labels: torch.Tensor, sq_dist: torch.Tensor | None = None, zero: tuple[torch.Tensor, ...] = (),
        control: torch.Tensor | None = None, stats_prev: torch.Tensor | None = None, iteration: int = 0,
        tol: float = 0.0, rows: tuple[torch.Tensor, torch.Tensor] | None = None, lower: torch.Tensor | None = None,
        clear: bool = True, moves: bool = False,
    ) -> None:
        """Assign the rows of ``x`` to ``c32`` (fp32 (k, d), transformed space) into ``labels``; the
        preparation launch also clears the float64 tensor in ``zero``. ``control``, ``stats_prev``,
        ``iteration`` and ``tol``: see ``prepare_centroids`` (Lloyd iterations replayed in blocks).

        ``rows = (row_index, row_count)``: only the listed rows (int32 indices, the count a 1-element
        int32 device tensor), others untouched. ``lower`` (exact mode): float32 (n,) receiving a
        lower bound on each row's squared distance to every centroid but its own (0 for rows the
        re-search settled). ``clear=False`` keeps what the accumulators already hold. ``moves=True``
        (an object built with ``moves``, and ``prev_labels``): instead of adding every row into the
        accumulators, move each row whose label changed between the float64 ``move_sums`` and
        ``move_counts``."""
        if moves and (self.move_sums is None or prev_labels is None):
            raise ValueError("moves=True needs an AssignPass built with moves=True, and prev_labels")
        if moves and rows is None and self.update == UPDATE_CARRY:
            # Its programs are persistent, and only a row list (or carried sums) walks their tiles.
            raise ValueError("moves=True over every row needs more clusters than carried sums take (see carries)")
        n, d = x.shape
        searched = bool(self.main_grid and self.hopper and rows is None and row_scale is None
                        and hopper_search.traced(x) == self.traced
                        and hopper_search.supported(x, self.k, scaled=False, split=False, row_list=False))
        # (Row lists, e.g. the bounds engine's, keep tf32 products: the fp16 copy is by chunks of rows.)
        half = (self.half and row_scale is None and rows is None and bool(self.main_grid)
                and (searched or not self.hopper))
        # Exact rows without given norms: the pass takes them itself, in the launch that reads the
        # rows for fp16 operands, else in one of their own (H200, 32,768 x 256 fp32: 7.5 us against
        # 10.7 for the maxima and 11.4 for torch's norms).
        own_norms = raw_norms is None and self.check  # (never for the small-d pass: it has no check)
        if own_norms:
            if self.own_norms is None or self.own_norms.shape[0] != n:
                self.own_norms = torch.empty(n, dtype=torch.float32, device=x.device)
            raw_norms = self.own_norms
        if half:
            # (Other rows than the last call's: other data pointer, shape or strides.)
            rows_key = (x.data_ptr(), x.shape, x.stride()) if self.fixed_rows else None
            if own_norms or rows_key is None:
                amax_parts(x, c32, self.half_parts, self.half_x_programs, norms=raw_norms if own_norms else None)
            elif rows_key == self.rows_max_of:
                amax_parts(x, c32, self.half_parts, self.half_x_programs, rows=False)
            else:
                # New rows: their maxima are computed where the slots say they are unknown, so a
                # fit whose first pass is captured (``lloyd.ReplayedPass``: a fit after the first of
                # its shape) reads the rows at its first replay, not at every one. (Before, such a
                # graph read them every iteration: 15 us at 32,768 x 256 fp32, H200, 2026-11-29.)
                if self.rows_max_of is not None:
                    self.half_parts[:self.half_x_programs].fill_(-1.0)
                amax_parts(x, c32, self.half_parts, self.half_x_programs, keep_known=True)
            self.rows_max_of = rows_key
        elif own_norms:
            row_norms(x, raw_norms)
        prepared = prepare_centroids(c32, offset, x.dtype, fast=self.fast and not self.small_d, split=self.split,
                                     exact=self.check or not (self.fast or self.small_d), zero=(self.acc, self.flag_count, *zero) if clear else (self.flag_count, *zero),
                                     control=control, stats_prev=stats_prev, iteration=iteration, tol=tol,
                                     half_parts=self.half_parts if half else None)
        # Unused pointer arguments get a tensor each, and no tensor goes to two arguments (``unused``).
        dev = x.device

        def spare(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            if (name, dtype) not in self.spares:  # kept: passes that reuse this object allocate none
                self.spares[name, dtype] = unused(dev, dtype)
            return self.spares[name, dtype]

        def given(t: torch.Tensor | None, dtype: torch.dtype = torch.float32, *, name: str) -> torch.Tensor:
            return spare(name, dtype) if t is None else t

        control_args = {"control_ptr": given(control, torch.int32, name="control"), "HAS_CONTROL": control is not None}
        accumulate = self.update != UPDATE_NONE
        if self.small_d:
            if moves:
                raise ValueError(f"moves=True needs the tensor-core pass (d > {SMALL_D})")
            columns = self.columns and d <= 4
            if self.main_grid:
                launcher(_assign_small_d_kernel)[(self.main_grid,)](
                    x, c32, given(offset, name="offset"), given(row_scale, name="scale"),
                    given(sample_weight, name="weight"), labels, given(sq_dist, name="sq_dist"),
                    given(prev_labels, labels.dtype, name="prev"),
                    self.acc if accumulate else spare("acc"), self.counts_offset, self.part_inertia, self.part_changed,
                    n=n, k=self.k, d=d, stride_xn=x.stride(0), stride_xd=x.stride(1),
                    tiles_per_program=self.tiles_per_program, **control_args,
                    BLOCK_N=self.block_n, DP=triton.next_power_of_2(d), KP=onehot_width(self.k),
                    NC=max(16, triton.next_power_of_2(3 * (d + 1))),
                    REG_ACC=columns and onehot_width(self.k) * (triton.next_power_of_2(d) + 1) <= 128
                    and os.environ.get("TORCHKM_SMALL_D_REG_ACC", "1") != "0",
                    COLUMNS=columns, KC=self.chunk,
                    ONE_CHUNK=columns and self.k <= self.chunk,
                    # (Triton vectorises the loads as far as the data pointer's alignment allows. No
                    # data_ptr() here: traced launches get fake tensors.)
                    DENSE_ROWS=d == triton.next_power_of_2(d) and x.stride(0) == d and (d == 1 or x.stride(1) == 1),
                    HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None,
                    HAS_WEIGHT=sample_weight is not None, STORE_SQ_DIST=sq_dist is not None,
                    HAS_PREV=prev_labels is not None, UPDATE=self.update, num_warps=4,
                )
            return
        if raw_norms is None and self.fast and row_scale is not None:
            raise ValueError("row_scale needs raw_norms")
        if lower is not None and not self.check:
            raise ValueError('lower bounds come from the exact mode\'s best two candidates (precision="exact", d > 8)')
        common = dict(
            c32_ptr=c32, offset_ptr=given(offset, name="offset"), scale_ptr=given(row_scale, name="scale"),
            norm_ptr=given(raw_norms, name="norm"), weight_ptr=given(sample_weight, name="weight"),
            c_norm_ptr=prepared.c_norm, labels_ptr=labels, sq_dist_ptr=given(sq_dist, name="sq_dist"),
            lower_ptr=given(lower, name="lower"), prev_ptr=given(prev_labels, labels.dtype, name="prev"),
            acc_ptr=self.acc if accumulate else spare("acc"), counts_offset=self.counts_offset,
            part_inertia_ptr=self.part_inertia, part_changed_ptr=self.part_changed,
            n=n, k=self.k, d=d, stride_xn=x.stride(0), stride_xd=x.stride(1), n_replicas=self.n_replicas, **control_args,
            KP=onehot_width(self.k) if self.update in (UPDATE_ONEHOT, UPDATE_CARRY) else 16,
            DP=carry_width(d) if self.update == UPDATE_CARRY else 16,
            HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None, HAS_WEIGHT=sample_weight is not None,
            STORE_SQ_DIST=sq_dist is not None, HAS_PREV=prev_labels is not None, UPDATE=self.update,
        )
        if moves:
            common.update(acc_ptr=self.move_acc, counts_offset=self.k * d, n_replicas=1, KP=16, DP=16,
                          UPDATE=UPDATE_DELTA)
        sorted_sums = self.sorted_sums and accumulate and not moves and rows is None and searched
        if sorted_sums:  # added once the labels are final (below)
            common["UPDATE"] = UPDATE_NONE
        split_research = bool(self.recheck_grid) and self.research_chunks > 1
        keys = self.research_keys if split_research else spare("keys", torch.int64)
        lazy_bits = self._lazy_bits(d, searched, half, row_scale is not None)
        searched_packed = searched and hopper_search.packed(x, self.k, half=half)
        bound_args = self._bound_arguments(x.dtype, d, row_scale is not None, packed=searched_packed or lazy_bits > 0,
                                           half=half)
        pair_setting = os.environ.get("TORCHKM_PAIR_BOUND", "1")
        if bound_args["DISTANCE_BOUND"] and not self.split and pair_setting != "0":
            # The epilogue bounds the others' distances from score differences too (``_pair_floor``;
            # PAIR_BITS: 1 + the packed record's tile bits): over the Hopper search's packed record
            # and the tl.dot searches' records but the lazy packed one. ``TORCHKM_PAIR_BOUND=0``: from
            # each score alone (experiments: A/B of the deferred rows). H200, 1M x 128, k = 4096,
            # over-split fp32 rows (scripts/diag_exact_settings.py, 2026-12-04), tl.dot search:
            # re-checked 37.4 -> 18.5 % and 8.11 -> 7.50 ms a pass from random rows, 57.4 -> 46.9 %
            # and 8.93 -> 7.67 ms after two iterations; N(0, 1) rows (0.2-0.8 % re-checked) pay
            # 0.18 ms of 6.2 in the epilogue.
            if searched_packed:
                bound_args["PAIR_BITS"] = 1 + hopper_search.tile_bits(self.k, 2 if half else x.element_size(), d)
            elif not searched and lazy_bits == 0:
                bound_args["PAIR_BITS"] = 1
        # The Hopper search rounds fp32 rows as (x - m) s, not x s, and the epilogue bounds their
        # rounding by the centred norm (``_tile``, CENTRED): rows off the origin defer fewer rows.
        # H200, 1M x 128, k = 4096, over-split fp32 rows, a fit's (centred) passes
        # (scripts/diag_exact_settings.py, 2026-12-04): re-checked 8.0 -> 3.4 % from random
        # centroids, 34.5 -> 24.6 % after two iterations, Lloyd 3.73 -> 3.56 ms an iteration;
        # N(0, 1) rows the same (0.1-0.3 %, times within noise, also at 32,768 x 256 once the
        # centred bias came from the preparing launch). ``TORCHKM_CENTRED_OPERANDS=0``: raw rows.
        bound_args["CENTRED"] = (searched and half and offset is not None and bool(bound_args["DISTANCE_BOUND"])
                                 and not self.traced and os.environ.get("TORCHKM_CENTRED_OPERANDS", "1") != "0")
        # The eager exact search keeps its best three as packed keys (``_tile``, PACK_KEYS) for 16-bit
        # rows, whose centroids' rounding leaves far more room than the cleared bits take
        # (``TORCHKM_PACKED_KEYS=1``/``0``: also for fp32 rows / never, experiments and tests).
        packing = os.environ.get("TORCHKM_PACKED_KEYS", "auto")
        pack_keys = (bool(self.main_grid) and not searched and bool(bound_args["DISTANCE_BOUND"])
                     and self.cfg["EAGER"] and not self.cfg["SWAP"] and packing != "0"
                     and (x.dtype != torch.float32 or half or packing == "1"))
        if pack_keys:
            # 2: each tile's lowest three through a merging network (``_lowest_three``); 1: three
            # successive minima (``TORCHKM_TOP3_NETWORK=0``, experiments).
            pack_keys = 1 if os.environ.get("TORCHKM_TOP3_NETWORK") == "0" else 2
            # A key differs from its score by less than 2^BITS units in the last place: relative
            # 2^(BITS - 23) of |score| <= |bias| + 2 ||x|| max||c~||, with the usual 1.25 factor.
            cleared = 1.25 * 2.0 ** (int(self.cfg["BLOCK_K"]).bit_length() - 1 - 23)
            bound_args = {**bound_args, "bound_coef": bound_args["bound_coef"] + 2.0 * cleared,
                          "bias_coef": bound_args["bias_coef"] + cleared,
                          "pair_acc_coef": bound_args["pair_acc_coef"] + 2.0 * cleared}
        candidates = split_research and bool(self.cand_cap) and bool(bound_args["DISTANCE_BOUND"])
        # The chunk minima come from the eager tl.dot search's epilogue (``CHUNK_MINS``) or from the
        # Hopper search (``search_mins``), whichever searched.
        chunk_mins = (candidates and self.chunk_mins is not None and bool(self.main_grid)
                      and (self.search_mins if searched else self.eager_mins))
        # Feature chunk of the epilogue: narrow, as wide chunks of 64-bit row pointers (and the one-hot
        # product's operands) spill registers. Triton 3.6, sm_90 (scripts/compile_sm90.py's
        # stand-ins, 2026-12-05, benchmarks/results/2026-12-05_cpu_s19_compile_*), 245,760 x 32,
        # k = 1,024, over 32 features a chunk: the dense pass's lazy search under its register caps
        # spills 56 / 64 bytes (exact / fast fp32), and with moves (two row pointers and float64
        # values a chunk) 260 / 340; the bounds engine's list search uses 255 registers and spills
        # 20. Over 16 none spill (the list search 208 registers). Moves take 16; the rest stays at 32
        # until timed (``TORCHKM_EPILOGUE_WIDTH`` sets it, for experiments).
        epilogue_width = (int(os.environ.get("TORCHKM_EPILOGUE_WIDTH", "0"))
                          or (16 if self.update == UPDATE_ONEHOT or moves else 32))
        if self.main_grid:
            cfg = self.half_cfg if half else self.cfg
            if searched:
                # The epilogue only (no search): the eager search's variables take the record.
                cfg = {**cfg, "EAGER": True, "SWAP": False, "num_stages": 1}
            # ONE_CHUNK: the config's BLOCK_D covers all features, so a row tile is loaded once.
            # Over a row list the launch is persistent (its length is on the device); main_grid
            # programs still cover it whole and write every partial slot.
            main = dict(
                c_lo_ptr=prepared.c_lo if self.split else spare("c_lo", prepared.c_mma.dtype), bias_ptr=prepared.bias,
                row_index_ptr=spare("row_index", torch.int32) if rows is None else rows[0],
                row_count_ptr=spare("row_count", torch.int32) if rows is None else rows[1],
                flag_count_ptr=self.flag_count, flag_rows_ptr=self.flag_rows, key_ptr=keys,
                chunk_min_ptr=self.chunk_mins if chunk_mins else spare("chunk_mins"),
                min_chunk=self.research_chunk if chunk_mins else 1, CHUNK_MINS=chunk_mins and not searched,
                PACK_KEYS=pack_keys,
                LAZY_BITS=lazy_bits,
                half_ptr=prepared.half_scale if half else spare("half"), HALF=half,
                xh_ptr=spare("xh", torch.float16),
                KEYS=(3 if candidates else 1) if split_research else 0, **bound_args,
                SPLIT=self.split, HAS_ROW_INDEX=rows is not None, CHECK=self.check, RAW_MMA=self.fast,
                STORE_LOWER=lower is not None,
                PRECISION=("tf32" if x.dtype == torch.float32 and not half else "ieee") if self.fast else self.precision,
                ONE_CHUNK=_one_chunk(cfg, self.k, d), EPI_D=min(epilogue_width, cfg["BLOCK_D"]), PREFETCH=0, ONE_TILE=False, **cfg,
                **common,
            )
            # Few clusters (carried sums), whole rows in one chunk: each program loads its next tile
            # ahead (``_carry_prefetch``).
            if (main["UPDATE"] == UPDATE_CARRY and rows is None and not searched and not half and main["ONE_CHUNK"] > 0
                    and cfg["BLOCK_D"] == carry_width(d)):
                main["PREFETCH"] = _carry_prefetch(self.fast and x.dtype == torch.float32)
            # Every centroid in one tile: the search need not keep a running minimum across tiles
            # (H200, BENCHMARKS.md 2026-12-02, pass ms: 3.9M x 32 x 32 exact fp32 0.667 -> 0.566,
            # bf16 0.611 -> 0.498, fast fp32 0.506 -> 0.398; 1M x 64 x 16 fast bf16 0.178 -> 0.150;
            # 1M x 128 x 64 level). Not for the fast mode over padded features: there the search
            # inlined spills more (1M x 17 x 7 fast fp32 0.159 -> 0.201, bf16 0.134 -> 0.181; exact
            # 0.182 -> 0.173 and 0.209 -> 0.202). ``TORCHKM_ONE_TILE=0`` turns it off (experiments).
            main["ONE_TILE"] = (os.environ.get("TORCHKM_ONE_TILE") != "0" and self.k <= cfg["BLOCK_K"] and not searched
                                and not cfg["EAGER"] and not cfg["SWAP"] and not lazy_bits and main["KEYS"] != 2
                                and not (self.precision == "fast" and d < cfg["BLOCK_D"]))
            # Where measured: rows of at most 32 features (over a row list: ``lazy_register_cap``).
            measured = lazy_bits and cfg["BLOCK_D"] <= 32
            cap = lazy_register_cap(self.check, x.dtype, row_list=rows is not None, n=n) if measured else None
            if cap:
                main["maxnreg"] = cap
            if searched:
                block_n, warps = self.epilogue_shape
                self._searched_chunks(x, prepared, control, {**main, "BLOCK_N": block_n, "num_warps": warps}, half,
                                      chunk_mins=chunk_mins)
            elif half:
                self._half_chunks(x, prepared, cfg["BLOCK_N"], main, spare("searched"))
            else:
                launcher(_assign_kernel)[(self.main_grid,)](
                    x, prepared.c_mma, searched_ptr=spare("searched"), SEARCHED=False, part_base=0, tile_offset=0,
                    searched_stride=0, **main,
                )
        if self.recheck_grid:
            # Deferred rows: every centroid again, 3xTF32 products of the transformed fp32 rows.
            cfg = self.recheck_cfg
            split_grid = (max(1, self.recheck_grid // self.research_chunks), self.research_chunks)
            if candidates:
                # fp16 operands from the streamed search: the deferred rows that fit its fp16 row
                # buffer are copied into it by slot (done with: the search is), so their re-scoring
                # reads half the bytes and converts nothing, as the search's own. H200, 1M x 768,
                # k = 8192 fp32: see BENCHMARKS.md. ``TORCHKM_CANDIDATE_COPY=0``: never (experiments).
                # (``_half_chunks``, this pass's search, allocated the buffer.)
                copy_rows = (self.copy_rows
                             if half and not searched and os.environ.get("TORCHKM_CANDIDATE_COPY", "1") != "0" else 0)
                xh = self.half_x if copy_rows else spare("xh", torch.float16)
                # Over few rows (``FEW_ROWS``) without chunk minima or a copy, the plan would list
                # every deferred row for every chunk: the candidate launch then reads the rows as
                # they are and takes their thresholds itself, one launch fewer, over finer chunks, as
                # a few deferred rows fill few programs (H200, 32,768 x 256, k = 8,192, about 50
                # deferred rows: see BENCHMARKS.md). Over thousands of rows (1M x 128) the plan's
                # thresholds, taken once a row, cost less than each program's own.
                # ``TORCHKM_CANDIDATE_LISTS=1``: the plan and its lists always (experiments).
                lists = bool(chunk_mins or copy_rows or n > FEW_ROWS
                             or os.environ.get("TORCHKM_CANDIDATE_LISTS") == "1")
                if lists:
                    if self.neighbours:
                        # The deferred rows' needs, then each needed centroid's near others.
                        launcher(_neighbour_need_kernel)[(self.recheck_grid,)](
                            self.flag_count, keys, self.neighbour_need, control_args["control_ptr"], self.cand_cap,
                            BLOCK=256, HAS_CONTROL=control is not None, num_warps=4)
                        centroid_neighbours(c32, self.neighbour_need, self.neighbour_tally, self.neighbour_ids,
                                            self.neighbour_counts, self.neighbour_radius, control)
                        neighbour_ids, neighbour_counts = self.neighbour_ids, self.neighbour_counts
                        neighbour_radius = self.neighbour_radius
                    else:
                        neighbour_ids, neighbour_counts = spare("neighbour_ids", torch.int32), spare("counts", torch.int32)
                        neighbour_radius = spare("radius")
                    launcher(_candidate_plan_kernel)[(self.recheck_grid,)](
                        x, given(offset, name="offset"), raw_norms, prepared.c_norm, self.flag_rows, self.flag_count,
                        keys, self.chunk_mins if chunk_mins else spare("chunk_mins"), self.cand_lists,
                        self.cand_tops, control_args["control_ptr"], self.k, d, x.stride(0), x.stride(1),
                        self.research_chunks, self.cand_cap, self.lists_at, bound_args["bound_coef"],
                        bound_args["bias_coef"], prepared.half_scale if half else spare("half"), xh, copy_rows,
                        neighbour_ids, neighbour_counts, neighbour_radius, self.cand_ids, prepared.c_mma, prepared.bias,
                        bound_args["pair_coef"], bound_args["pair_acc_coef"],
                        BLOCK_N=64, BLOCK_D=32, CP=max(2, triton.next_power_of_2(self.research_chunks)),
                        HAS_MINS=chunk_mins, HAS_OFFSET=offset is not None, HAS_CONTROL=control is not None,
                        HALF=half, COPY=bool(copy_rows), NEIGHBOURS=self.neighbours, S=CANDIDATES, num_warps=4,
                        # H200, 1M x 128, k = 4096, over-split fp32 rows (diag_exact_settings.py,
                        # 2026-12-04): 3.84 -> 3.69 ms a Lloyd iteration (``TORCHKM_PAIR_CANDIDATES=0``:
                        # off, experiments).
                        PAIR=half and not self.split and os.environ.get("TORCHKM_PAIR_CANDIDATES", "1") != "0",
                    )
                    chunk, grid = self.research_chunk, split_grid
                else:
                    chunk, chunks = candidate_chunks(self.k)
                    grid = (max(1, self.recheck_grid // chunks), chunks)
                cand_cfg = candidate_config(torch.float16 if half else x.dtype, d, few_rows=not lists)
                for copied in (True, False) if copy_rows else (False,):
                    launcher(_candidate_kernel)[grid](
                        x, prepared.c_mma, prepared.c_lo if self.split else spare("c_lo", prepared.c_mma.dtype),
                        prepared.bias, self.flag_rows, self.flag_count, self.cand_lists, self.cand_tops, self.cand_ids,
                        control_args["control_ptr"], self.k, d, x.stride(0), x.stride(1), chunk,
                        self.cand_cap, self.lists_at, prepared.half_scale if half else spare("half"), xh,
                        0 if copied else copy_rows, given(offset, name="offset"), raw_norms, prepared.c_norm, keys,
                        bound_args["bound_coef"], bound_args["bias_coef"], S=CANDIDATES,
                        PRECISION="tf32" if x.dtype == torch.float32 and not half else "ieee", SPLIT=self.split,
                        HAS_CONTROL=control is not None, HALF=half, COPY=copied, LISTS=lists,
                        HAS_OFFSET=offset is not None,
                        X_ONCE=(not copied and d <= cand_cfg["BLOCK_D"]
                                and os.environ.get("TORCHKM_CANDIDATE_X_ONCE", "1") != "0"), **cand_cfg,
                    )
                launcher(_candidate_exact_kernel)[(self.recheck_grid,)](
                    x, c32, given(offset, name="offset"), self.flag_rows, self.flag_count, keys, self.cand_ids,
                    self.full_slots, control_args["control_ptr"], d, x.stride(0), x.stride(1), self.cand_cap,
                    S=CANDIDATES, HAS_OFFSET=offset is not None, HAS_CONTROL=control is not None,
                    **candidate_exact_config(d, few_rows=n <= FEW_ROWS),
                )
            if split_research:
                launcher(_research_kernel)[split_grid](
                    x, prepared.c_exact, prepared.bias_exact, given(offset, name="offset"),
                    given(row_scale, name="scale"), self.flag_rows, self.flag_count, keys,
                    self.full_slots if candidates else spare("full_slots", torch.int32),
                    control_args["control_ptr"], self.k, d, x.stride(0), x.stride(1), self.research_chunk,
                    BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], BLOCK_D=cfg["BLOCK_D"],
                    HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None,
                    HAS_CONTROL=control is not None, SLOT_LIST=candidates,
                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                )
            # The deferred rows (a few percent) add their sums by per-row atomics, not by the one-hot
            # product of few clusters. In this kernel Triton 3.6 gave that product's wgmma a
            # shared-memory address past its allocation: the bounds engine's first pass over 24,576
            # x 32, k = 64, stopped with an illegal memory access over bf16 rows (compute-sanitizer:
            # an HGMMA.64x32x16.F32.BF16 of the one-hot sums reading 0x6800 of 20,480 bytes), and
            # over fp32 rows its sums came out wrong (centroids 1.2e-2 off a float64 Lloyd step,
            # labels right; H200, 2026-12-03, BENCHMARKS.md). With atomics: 2.5e-7, no errors.
            few_rows_update = ({"UPDATE": UPDATE_ATOMIC, "KP": 16, "DP": 16}
                               if self.update in (UPDATE_ONEHOT, UPDATE_CARRY) and not moves else {})
            launcher(_assign_kernel)[(self.recheck_grid,)](
                x, prepared.c_exact, spare("c_lo"), prepared.bias_exact, row_index_ptr=self.flag_rows,
                row_count_ptr=self.flag_count, flag_count_ptr=spare("flag_count", torch.int32),
                flag_rows_ptr=spare("flag_rows", torch.int32), key_ptr=keys, KEYS=2 if split_research else 0,
                searched_ptr=spare("searched"), SEARCHED=False, tile_offset=0, searched_stride=0,
                chunk_min_ptr=spare("chunk_mins"), min_chunk=1, CHUNK_MINS=False, PACK_KEYS=False, LAZY_BITS=0,
                half_ptr=spare("half"), xh_ptr=spare("xh", torch.float16), HALF=False, SPLIT=False,
                part_base=self.main_grid, bound_coef=0.0, bias_coef=0.0, pair_coef=0.0, pair_acc_coef=0.0, PAIR_BITS=0,
                DISTANCE_BOUND=False, CENTRED=False,
                HAS_ROW_INDEX=True, CHECK=False, STORE_LOWER=False, RAW_MMA=False, PRECISION="tf32x3",
                ONE_CHUNK=_one_chunk(cfg, self.k, d), EPI_D=min(epilogue_width, cfg["BLOCK_D"]), PREFETCH=0, ONE_TILE=False, **cfg,
                **{**common, **few_rows_update},
            )
        if sorted_sums:
            add_sorted_sums(x, labels, self.acc_sums[0], self.acc_counts[0], sample_weight=sample_weight,
                            offset=offset, row_scale=row_scale, control=control)


# The exact epilogue after the Hopper search (``_epilogue_shape``) over fp32 rows with fp16 operands is
# held to this many registers unless its config caps it lower: the rare float64 sweep of fp32 ties
# (``_common.fp32_tie``) took the exact one at 1M x 128, k = 4096 from 128 to 149 registers (three
# programs an SM instead of four); capped, it uses 128 with no spill (sm_90, Triton 3.6; at 32,768 x
# 256, k = 8192: 134 before the sweep, 128 and 4 bytes spilled capped). The other epilogues keep the
# registers ptxas picks (a cap of 128 raised bf16's exact one from 96 to 120, the fast fp32 one from
# 80 to 96). Not timed on a GPU yet.
EPILOGUE_MAX_REGISTERS = 128

# Whether the exact pass over wide 16-bit rows adds its sums after its labels are final
# (``AssignPass.sorted_sums``): off until a Lloyd run on a GPU compares it with the epilogue's sums.
SORTED_SUMS_DEFAULT = "0"


def _epilogue_shape(cfg: dict, update: int) -> tuple[int, int]:
    """(rows per program, warps) of the epilogue launch after the Hopper search (``SEARCHED``).

    Its own shape, not the pass config's (which sizes the tl.dot search's tiles: 128-256 rows of
    80-163 registers, one to three programs an SM): 64 rows on four warps (72-128 registers), so
    more programs share an SM and hide the gathers of the winners' centroid rows. H200, fused pass
    replayed, two processes a setting, ms (2026-12-02, scripts/diag_second_sums.py): 1M x 128,
    k = 4096, exact fp32 3.073 / 3.087 -> 3.033 / 3.029, bf16 2.823 / 2.815 -> 2.770 / 2.781; fast
    fp32 2.475 / 2.554 -> 2.436 / 2.452, bf16 2.208 / 2.221 -> 2.174 / 2.205; 32,768 x 256, k = 8192,
    level (exact fp32 0.357 / 0.353 -> 0.347 / 0.356). 32 rows on four warps: level with 128; on two,
    as 64 in fp32 (exact 3.027 / 3.022) but not in bf16 (2.790 / 2.800).
    ``TORCHKM_EPILOGUE_CONFIG=BLOCK_N,num_warps`` sets it (experiments; rows dividing 128, as the
    chunks' rows are a multiple of it). The persistent one-hot carry keeps the config's."""
    if update == UPDATE_CARRY:
        return cfg["BLOCK_N"], cfg["num_warps"]
    shape = (64, 4) if cfg["BLOCK_N"] >= 64 else (cfg["BLOCK_N"], cfg["num_warps"])
    spec = os.environ.get("TORCHKM_EPILOGUE_CONFIG")
    if spec:
        rows, warps = (int(v) for v in spec.split(","))
        if 128 % rows or rows < 16:
            raise ValueError(f"TORCHKM_EPILOGUE_CONFIG: rows must divide 128 and be at least 16, got {rows}")
        shape = (rows, warps)
    return shape


def _carry_prefetch(fast_fp32: bool) -> int:
    """``_tile``'s PREFETCH for a pass of carried sums (few clusters) over whole rows: 1 when each
    program loads its next tile of rows while it searches the current one, 2 when it loads the
    tile's previous labels and weights ahead too, 0 when it loads nothing ahead.

    H200, 2026-12-02. The fused pass replayed (no previous labels), 3.9M x 32, k = 32, ms, 0 -> 1:
    exact fp32 0.740 / 0.738 -> 0.663 / 0.658 (two calls), fast fp32 0.588 / 0.590 -> 0.506 /
    0.506, exact bf16 0.684 / 0.686 -> 0.611 / 0.616, fast bf16 (64-row tiles, ``assign_config``)
    0.503 -> 0.403; 245,760 x 32: 0.051 -> 0.048, 0.044 -> 0.039, 0.051 -> 0.046, 0.038 -> 0.032.
    Per Lloyd iteration of a fit (previous labels read), 3.9M x 32, k = 32, ms, 0 / 1 / 2: exact
    fp32 0.873 / 0.826 / 0.743, fast fp32 0.609 / 0.543 / 0.629, exact bf16 0.956 / 0.742 / 0.750,
    fast bf16 0.548 / 0.463 / 0.432 (``bench_lloyd``, three calls). So 2, but 1 for the fast mode
    over fp32 rows. More programs an SM under a register cap spilled and were slower.
    ``TORCHKM_CARRY_PREFETCH=0``, ``1`` or ``2`` sets it (experiments, tests)."""
    setting = os.environ.get("TORCHKM_CARRY_PREFETCH", "auto")
    if setting in ("0", "1", "2"):
        return int(setting)
    return 1 if fast_fp32 else 2


def _one_chunk(cfg: dict, k: int, d: int) -> int:
    """``_tile``'s ONE_CHUNK: 0 when the features are streamed in chunks; 1 when one chunk of
    ``BLOCK_D`` covers the row; 2 when it is the row exactly and the centroids fill whole tiles of
    ``BLOCK_K`` (their loads then need no mask, and ``k d`` fits 32-bit offsets)."""
    if cfg["BLOCK_D"] < d:
        return 0
    return 2 if d == cfg["BLOCK_D"] and k % cfg["BLOCK_K"] == 0 and k * d < 2**31 else 1


SMALL_D = 8
# The fp16 copy of a chunk of rows (fp32 rows with fp16 operands, ``AssignPass``): at most this many bytes.
HALF_ROWS_BYTES = 1 << 28
# The fast mode's fp16 operands on the Hopper search over rows of at most 512 bytes, for passes that
# read the rows' maxima each call: from this many centroids (``AssignPass``).
HALF_FAST_MIN_K = 1024
# ``assign``'s kept passes: at most this many per thread, each for at most this many row elements.
REUSED_PASSES = 4
REUSED_PASS_MAX_ELEMENTS = 1 << 23
# The candidate re-search (``_candidate_kernel``): candidates kept per deferred row.
CANDIDATES = 16
# The most centroids for which the exact mode searches each one's near others (``neighbour_count``).
NEIGHBOUR_MAX_CLUSTERS = 65536


def neighbour_count(k: int) -> int:
    """How many near centroids the exact mode lists for a centroid that deferred rows need (see
    ``centroids.centroid_neighbours`` and ``_candidate_plan_kernel``): the candidate buffer's size
    less the winner; 0 (none, every deferred row re-scored by chunks) over more than
    ``NEIGHBOUR_MAX_CLUSTERS`` centroids, where the search, a k x k product over the centroids
    with deferred rows, grows as k^2 (H200, d = 128, tight clusters, every centroid searched: 0.10
    ms at k = 4,096, 1.0 ms at 16,384 and 15.7 ms at 65,536). Measured up to that size: at 10M x
    128 x 65,536, mixed rows (62 / 37 % deferred, fp32 / bf16), the exact pass took 1,643 -> 757 ms
    and 878 -> 378 ms with the lists, labels equal, and a fit's Lloyd iterations 1,378 -> 417 ms
    and 651 -> 375 ms (flash-kmeans 863 / 415); N(0, 1) rows 391 / 376 ms either way (the search
    0.08 ms: every list overflows in its first tile). See BENCHMARKS.md, 2026-12-04.
    ``TORCHKM_NEIGHBOURS=0``/``1``: never / at any k (experiments and tests)."""
    setting = os.environ.get("TORCHKM_NEIGHBOURS", "auto")
    if setting == "0" or (setting != "1" and k > NEIGHBOUR_MAX_CLUSTERS):
        return 0
    return CANDIDATES - 1


def candidate_rows(n: int) -> int:
    """The most deferred rows of an ``n``-row pass the candidate re-search takes (its buffers hold
    ``CANDIDATES`` int32, a threshold and a place in each chunk's list for each); the rest, and rows with more
    candidates, take the 3xTF32 re-search, many times its cost per row (H200, 1M x 768 bf16,
    k = 8192, 276,000 rows deferred: 16.4 + 3.0 ms with a cap of 2^18, 14.3 + 0.4 without; see
    BENCHMARKS.md). Half the rows, and never fewer than 2^18."""
    return min(n, max(1 << 18, n // 2))


def assign_reference(x: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference of the search: float64 scores of the same inputs (small sizes only).

    Returns ``(labels, top3)``: labels break ties to the lowest index, and ``top3`` (n, 3) holds the
    three lowest scores ``||c||^2 - 2 x.c`` in order (+inf where k < 3).
    """
    c = centroids.double()
    scores = c.pow(2).sum(1)[None, :] - 2.0 * x.double() @ c.T
    labels = scores.argmin(1)
    top = torch.topk(scores, min(3, scores.shape[1]), dim=1, largest=False, sorted=True).values
    pad = torch.full((scores.shape[0], 3 - top.shape[1]), float("inf"), dtype=top.dtype)
    return labels, torch.cat([top, pad], dim=1)
