"""Lloyd iterations that skip distance computations, with labels equal to the dense pass's.

Two engines with the interface of ``lloyd.LloydEngine`` (``iterate``, ``read``, ``labels``, ``c``,
``c_old``, ``sums``, ``counts``, ``stats``):

``TriangleEngine`` -- seed 000 (Wu & Hong), faithfully. Before each pass the inter-centroid
    distances ``ICD`` (k x k) and the ranked index ``RID`` (each row of ICD argsorted) are computed
    on the GPU. One lane per row scans the centroids in the order ``RID[old label]`` and stops at
    the first ``c_j`` with ``ICD[old][j] > 2 d(x, c_old)`` (Alg. 3): every later centroid is
    farther than the old one. The number of distances a row computed is its workload ``M``. While
    the mean of ``M`` still moves (Epoch 1) the rows are processed in their given order; once it
    changes by less than ``workload_tol`` between two passes, the rows (and their storage) are
    reordered by decreasing ``M`` (Alg. 4; Theorem 1: this minimises the imbalance ratio R of
    eq. 2), and Epoch 2 runs on the reordered copy. A program is one warp of 32 rows walking in
    lockstep until its slowest row stops, so its cost is the warp's largest ``M``, as in the paper.

``BoundsEngine`` -- the same idea at tensor-core granularity (Hamerly's bounds). Each row keeps a
    lower bound on its distance to every centroid but its own, taken from the second-best score of
    the exact pass and lowered by the largest centroid move after each update. A settle pass reads
    every row once: it computes the exact distance to the row's own (moved) centroid, and when
    that distance is below the bound the row keeps its cluster; otherwise it appends the row to a
    compact list. Only the listed rows go through the fused tensor-core search (persistent over the
    list, whose length stays on the device). The per-cluster sums are kept across passes in
    float64, and only the rows whose label changed move between them, so a converged row costs one
    read of x: no search, no atomics. The first pass searches every row on the dense engine's tiles
    where those differ. ``TORCHKM_TOP_MOVES`` (experiments, off: ``configs.top_moves``) measures
    each row against the centroids that moved most as well, lowering the bound by the next largest
    move only.

Exactness: the bounds carry relative margins larger than fp32 rounding, so a row is kept only when
its own centroid is nearer than every other by more than the rounding of an fp32 distance; the
search over the listed rows is the exact mode's. Labels then equal the dense exact pass's up to
ties within fp32 rounding, and those too where direct distances settle them: both passes (and the
scan) settle such a pair by float64 distances (``_common.fp32_tie``), not by fp32 sums whose order
differs between their launches. A tie the 3xTF32 re-search decides alone (a row with a third
candidate inside the fast products' bound) follows those products. The triangle engine
synchronises once per pass (to read the statistics), the bounds engine once per block of settle
passes (``BoundsEngine.run_block``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._common import (
    FLOAT64_TIES,
    UPDATE_NONE,
    accumulate_rows,
    fp32_tie,
    launcher,
    nearer64,
    onehot_max_k,
    onehot_width,
    sq_dist64_part,
    transform_rows,
)
from .assign import SMALL_D, AssignPass
from .centroids import block_frozen, finish_update, moves_reference, shift_top_reference
from .configs import assign_config, dense_settle_passes, settle_config, top_moves
from .lloyd import ReplayedEngine, ReplayedPass, device_tol, launch_key
from .update import float64_sums

__all__ = [
    "BoundsEngine", "PassInfo", "TriangleEngine", "distance_margin", "inter_centroid", "scan", "scan_reference",
    "settle_reference", "top_moves_reference", "workload_stats",
]

logger = logging.getLogger("torchkm")

MAX_TRIANGLE_K = 16_384  # ICD and RID: 2 GiB at this k
WARP = 32  # rows per program of the scan: one warp, the unit of divergence in seed 000


def distance_margin(d: int) -> float:
    """Relative margin on squared fp32 distances of d features: a few times their worst rounding."""
    return 8.0 * (d + 2) * 2.0**-24 + 2.0**-20


@dataclass
class PassInfo:
    """What one pass of a pruned engine did (read with its statistics, in the same sync).

    ``searched``: (row, centroid) distances computed by the search; ``processed``: those the hardware
    spent (a warp or tile runs as long as its slowest row); ``n_rows``/``k``: the dense pass's
    ``n * k``; ``kernel``: which engine ran. ``skipped`` = 1 - processed / (n k),
    ``skipped_bound`` = 1 - searched / (n k) (seed 000's theoretical upper bound), and
    ``imbalance`` = processed / searched - 1 (eq. 2).
    """

    kernel: str
    searched: float
    processed: float
    n_rows: int
    k: int

    @property
    def skipped(self) -> float:
        return 1.0 - self.processed / max(1.0, self.n_rows * self.k)

    @property
    def skipped_bound(self) -> float:
        return 1.0 - self.searched / max(1.0, self.n_rows * self.k)

    @property
    def imbalance(self) -> float:
        return self.processed / self.searched - 1.0 if self.searched else 0.0


def workload_stats(work: torch.Tensor, group: int = WARP) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of M, sum over groups of max M * group)`` for rows processed in groups of ``group``
    consecutive rows (eq. 2's numerator and denominator), as 0-d float64 device tensors."""
    n = work.numel()
    pad = (-n) % group
    w = torch.nn.functional.pad(work.to(torch.float64), (0, pad))
    return w.sum(), w.view(-1, group).amax(1).sum() * group


# ----------------------------------------------------------------------------------------------
# Seed 000: inter-centroid distances, ranked index, and the scan (Alg. 3) with the update fused.


def inter_centroid(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ICD, RID)``: float32 (k, k) distances between centroids from direct differences (no
    ``||a||^2 - 2ab + ||b||^2`` cancellation), and int32 (k, k) each row's centroids by increasing
    distance, the row's own centroid first."""
    c = c.to(torch.float32)
    icd = torch.cdist(c, c, compute_mode="donot_use_mm_for_euclid_dist")
    # The own centroid sorts first even among duplicates (which sit at distance 0 too).
    icd.fill_diagonal_(-1.0)
    rid = torch.argsort(icd, dim=1, stable=True).to(torch.int32)
    icd.fill_diagonal_(0.0)
    return icd, rid


# k is never specialised: Triton folds an argument equal to 1 into a constant, and the scan's loop
# bound then crashes the Triton 3.6 compiler (TritonGPUCoalesce).
@triton.jit(do_not_specialize=["k"])
def _scan_kernel(
    x_ptr, c_ptr, icd_ptr, rid_ptr, offset_ptr, scale_ptr, weight_ptr,
    labels_ptr, sq_dist_ptr, work_ptr, sums_ptr, counts_ptr, part_inertia_ptr, part_changed_ptr,
    n, k, d, stride_xn, stride_xd, margin,
    BLOCK_N: tl.constexpr, DP: tl.constexpr, KP: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_PREV: tl.constexpr, UPDATE: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    dims = tl.arange(0, DP)
    dim_mask = dims < d
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
    else:
        scale = tl.full((BLOCK_N,), 1.0, tl.float32)
    xr = transform_rows(
        tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
        row_mask, tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
    if HAS_PREV:
        old = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int32)
    else:
        # No previous label: scan from centroid 0 (the test holds for any reference centroid).
        old = tl.zeros((BLOCK_N,), tl.int32)
    old64 = old.to(tl.int64)
    c_old = tl.load(c_ptr + old64[:, None] * d + dims[None, :], mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    diff = xr - c_old
    best = tl.sum(diff * diff, axis=1)
    label = old
    # Stop at ICD[old][j] > 2 d(x, c_old), in squares, with a margin over fp32 rounding.
    limit = 4.0 * best * (1.0 + margin)
    work = row_mask.to(tl.int32)
    active = row_mask
    j = pid * 0 + 1
    go = (tl.max(active.to(tl.int32), axis=0) > 0) & (j < k)
    while go:
        cur = tl.load(rid_ptr + old64 * k + j, mask=active, other=0)
        cur64 = cur.to(tl.int64)
        icd = tl.load(icd_ptr + old64 * k + cur64, mask=active, other=0.0)
        active = active & (icd * icd <= limit)
        cj = tl.load(c_ptr + cur64[:, None] * d + dims[None, :], mask=active[:, None] & dim_mask[None, :], other=0.0)
        diff = xr - cj
        dist = tl.sum(diff * diff, axis=1)
        # Ties go to the lowest index, as in the dense pass (the scan order is not index order).
        better = active & ((dist < best) | ((dist == best) & (cur < label)))
        if FLOAT64_TIES:
            tie = active & fp32_tie(best, dist, d, DP)
            if tl.max(tie.to(tl.int32), axis=0) > 0:
                # Settled by float64 distances, as the dense pass settles its fp32 ties.
                c_best = tl.load(c_ptr + label.to(tl.int64)[:, None] * d + dims[None, :],
                                 mask=tie[:, None] & dim_mask[None, :], other=0.0)
                better = tl.where(tie, nearer64(sq_dist64_part(xr, c_best), sq_dist64_part(xr, cj), label, cur),
                                  better)
        best = tl.where(better, dist, best)
        label = tl.where(better, cur, label)
        work += active.to(tl.int32)
        j += 1
        go = (tl.max(active.to(tl.int32), axis=0) > 0) & (j < k)
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + rows, mask=row_mask, other=0.0)
    else:
        w = row_mask.to(tl.float32)
    if HAS_PREV:
        changed = tl.sum((row_mask & (label != old)).to(tl.int64), axis=0)
    else:
        changed = tl.sum(row_mask.to(tl.int64), axis=0)
    tl.store(labels_ptr + rows, label.to(labels_ptr.dtype.element_ty), mask=row_mask)
    tl.store(sq_dist_ptr + rows, best, mask=row_mask)
    tl.store(work_ptr + rows, work, mask=row_mask)
    tl.store(part_inertia_ptr + pid, tl.sum(tl.where(row_mask, best * w, 0.0), axis=0))
    tl.store(part_changed_ptr + pid, changed)
    if UPDATE != 0:
        accumulate_rows(sums_ptr, counts_ptr, label.to(tl.int64), w, row_mask, xr, dims, dim_mask, True, k, d, KP, UPDATE)


def scan(
    x: torch.Tensor, centroids: torch.Tensor, icd: torch.Tensor, rid: torch.Tensor, labels: torch.Tensor, *,
    has_prev: bool, offset: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None, sq_dist: torch.Tensor | None = None, work: torch.Tensor | None = None,
    sums: torch.Tensor | None = None, counts: torch.Tensor | None = None,
    part_inertia: torch.Tensor | None = None, part_changed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seed 000's labelling pass (Alg. 3) over the transformed rows of ``x``: ``labels`` (int32/int64,
    read as the previous labels when ``has_prev``, then overwritten), and returns
    ``(labels, sq_dist, work)``: the squared distance to the chosen centroid and each row's
    workload M (distances computed, the old centroid's included). ``sums``/``counts`` (float32 (k, d)
    and (k,)), when given, receive the rows of each cluster; ``part_inertia``/``part_changed`` one
    partial per 32-row program."""
    n, d = x.shape
    k = centroids.shape[0]
    device = x.device
    c32 = centroids.to(torch.float32).contiguous()
    sq_dist = torch.empty(n, dtype=torch.float32, device=device) if sq_dist is None else sq_dist
    work = torch.empty(n, dtype=torch.int32, device=device) if work is None else work
    grid = triton.cdiv(n, WARP)
    if part_inertia is None:
        part_inertia = torch.empty(max(1, grid), dtype=torch.float32, device=device)
        part_changed = torch.empty(max(1, grid), dtype=torch.int64, device=device)
    dummy = torch.empty(1, dtype=torch.float32, device=device)
    mode = UPDATE_NONE if sums is None else (1 if k <= 64 else 2)
    if grid:
        launcher(_scan_kernel)[(grid,)](
            x, c32, icd, rid, dummy if offset is None else offset, dummy if row_scale is None else row_scale,
            dummy if sample_weight is None else sample_weight, labels, sq_dist, work,
            dummy if sums is None else sums, dummy if counts is None else counts, part_inertia, part_changed,
            n, k, d, x.stride(0), x.stride(1), distance_margin(d),
            BLOCK_N=WARP, DP=max(16, triton.next_power_of_2(d)), KP=onehot_width(k) if mode == 1 else 16,
            HAS_OFFSET=offset is not None, HAS_SCALE=row_scale is not None, HAS_WEIGHT=sample_weight is not None,
            HAS_PREV=has_prev, UPDATE=mode, num_warps=1,
        )
    return labels, sq_dist, work


def scan_reference(
    x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch Alg. 3 on transformed rows (small sizes): ``(labels, sq_dist, work)`` in float64
    arithmetic, with the scan's own stopping rule (no margin)."""
    x = x.double()
    c = centroids.double()
    n, k = x.shape[0], c.shape[0]
    icd = torch.cdist(c, c)
    icd.fill_diagonal_(-1.0)
    rid = torch.argsort(icd, dim=1, stable=True)
    icd.fill_diagonal_(0.0)
    old = torch.zeros(n, dtype=torch.long) if labels is None else labels.long()
    out_labels = old.clone()
    out_sq = ((x - c[old]) ** 2).sum(1)
    work = torch.ones(n, dtype=torch.int32)
    for i in range(n):
        o = int(old[i])
        limit = 2.0 * math.sqrt(float(out_sq[i]))
        for j in range(1, k):
            cur = int(rid[o, j])
            if float(icd[o, cur]) > limit:
                break
            work[i] += 1
            dist = float(((x[i] - c[cur]) ** 2).sum())
            if dist < float(out_sq[i]) or (dist == float(out_sq[i]) and cur < int(out_labels[i])):
                out_sq[i] = dist
                out_labels[i] = cur
    return out_labels, out_sq, work


class TriangleEngine:
    """Lloyd iterations on seed 000's pruned pass (see the module docstring), with the update fused
    into the pass and ``finish_update`` moving the centroids.

    ``labels`` is in the caller's row order throughout; once reordered, the engine works on a
    permuted copy of the rows (``perm``) and scatters its labels back after each pass.
    """

    kernel = "triangle"

    def __init__(
        self, x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor, *, offset: torch.Tensor | None,
        row_scale: torch.Tensor | None, sample_weight: torch.Tensor | None, normalize: bool, tol: float,
        reorder: bool = True, workload_tol: float = 0.01,
    ):
        n, d = x.shape
        k = centroids.shape[0]
        if k > MAX_TRIANGLE_K:
            raise ValueError(f"the triangle scan keeps two k x k tables (ICD, RID); k={k} is above {MAX_TRIANGLE_K}")
        device = x.device
        self.block, self.tol_device, self.normalize = 1, tol, normalize
        self.x, self.offset, self.row_scale, self.weight = x, offset, row_scale, sample_weight
        self.labels = labels
        self.own_labels = labels  # the engine's labels, in its row order
        self.perm: torch.Tensor | None = None
        self.reorder, self.workload_tol = reorder, workload_tol
        self.c = centroids.to(torch.float32).contiguous().clone()
        self.c_old = torch.empty_like(self.c)
        self.sums = torch.empty(k, d, dtype=torch.float32, device=device)
        self.counts = torch.empty(k, dtype=torch.float32, device=device)
        self.acc_sums = torch.empty(1, k, d, dtype=torch.float32, device=device)
        self.acc_counts = torch.empty(1, k, dtype=torch.float32, device=device)
        self.sq_dist = torch.empty(n, dtype=torch.float32, device=device)
        self.work = torch.zeros(n, dtype=torch.int32, device=device)
        grid = max(1, triton.cdiv(n, WARP))
        self.part_inertia = torch.empty(grid, dtype=torch.float32, device=device)
        self.part_changed = torch.empty(grid, dtype=torch.int64, device=device)
        self.stats = torch.zeros(1, 4, dtype=torch.float64, device=device)
        self.mean_work: list[float] = []
        self.info: PassInfo | None = None
        self.epoch = 1
        self._work_sums: tuple[torch.Tensor, torch.Tensor] | None = None

    def _reorder(self) -> None:
        """Alg. 4 line 6: rows (and their storage) in decreasing order of their last workload."""
        perm = torch.argsort(self.work, descending=True, stable=True)
        self.perm = perm
        self.x = self.x[perm].contiguous()
        if self.row_scale is not None:
            self.row_scale = self.row_scale[perm].contiguous()
        if self.weight is not None:
            self.weight = self.weight[perm].contiguous()
        self.own_labels = self.labels[perm].contiguous()
        self.work = self.work[perm].contiguous()
        self.epoch = 2

    def iterate(self, has_prev: bool) -> None:
        if has_prev and self.perm is None and self.reorder and len(self.mean_work) >= 2:
            prev, last = self.mean_work[-2:]
            if abs(last - prev) <= self.workload_tol * prev:
                self._reorder()
        if self.perm is not None and not has_prev:
            raise RuntimeError("a reordered TriangleEngine continues from its labels")
        icd, rid = inter_centroid(self.c)
        self.acc_sums.zero_()
        self.acc_counts.zero_()
        self.stats.zero_()
        scan(self.x, self.c, icd, rid, self.own_labels, has_prev=has_prev, offset=self.offset, row_scale=self.row_scale,
             sample_weight=self.weight, sq_dist=self.sq_dist, work=self.work, sums=self.acc_sums[0],
             counts=self.acc_counts[0], part_inertia=self.part_inertia, part_changed=self.part_changed)
        if self.perm is not None:
            self.labels[self.perm] = self.own_labels
        finish_update(self.acc_sums, self.acc_counts, self.c, self.part_inertia, self.part_changed, self.stats[0],
                      normalize=self.normalize, old_centroids=self.c_old, sums=self.sums, counts=self.counts)
        self._work_sums = workload_stats(self.work)

    def read(self, rows: int) -> list[list[float]]:
        assert self._work_sums is not None
        values = torch.cat([self.stats[0], torch.stack(self._work_sums)]).tolist()
        n, k = self.x.shape[0], self.c.shape[0]
        self.mean_work.append(values[4] / max(1, n))
        self.info = PassInfo(self.kernel, values[4], values[5], n, k)
        return [values[:4]]


# ----------------------------------------------------------------------------------------------
# Bounds at tensor-core granularity: settle pass + compacted exact search.


@triton.jit
def _settle_kernel(
    x_ptr, c_ptr, offset_ptr, scale_ptr, weight_ptr, labels_ptr, sq_dist_ptr, lower_ptr, shift_top_ptr, top_ptr,
    active_rows_ptr, active_count_ptr, part_inertia_ptr, part_base, control_ptr, stats_prev_ptr, iteration, tol,
    n, d, stride_xn, stride_xd, margin,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ONE_CHUNK: tl.constexpr, TOP_M: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    HAS_CONTROL: tl.constexpr, CHECK_STOP: tl.constexpr,
):
    go = True
    if HAS_CONTROL:
        # This runs before the iteration's preparation, which sets the frozen flag: same rule.
        go = block_frozen(control_ptr, stats_prev_ptr, iteration, tol, CHECK_STOP) == 0
    if go:
        inertia = _settle_tile(
            tl.program_id(0), x_ptr, c_ptr, offset_ptr, scale_ptr, weight_ptr, labels_ptr, sq_dist_ptr, lower_ptr,
            active_rows_ptr, active_count_ptr, shift_top_ptr, top_ptr, n, d, stride_xn, stride_xd, margin,
            BLOCK_N, BLOCK_D, ONE_CHUNK, TOP_M, HAS_OFFSET, HAS_SCALE, HAS_WEIGHT)
        tl.store(part_inertia_ptr + part_base + tl.program_id(0), inertia)


@triton.jit
def _settle_tile(
    t, x_ptr, c_ptr, offset_ptr, scale_ptr, weight_ptr, labels_ptr, sq_dist_ptr, lower_ptr, active_rows_ptr,
    active_count_ptr, shift_top_ptr, top_ptr, n, d, stride_xn, stride_xd, margin,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ONE_CHUNK: tl.constexpr, TOP_M: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    """One tile of rows: settle the rows whose own centroid stays nearer than the lowered bound (their
    exact distance, new bound and inertia), list the others for the search. Returns the inertia
    of the settled rows; their cluster (and so the sums) does not change.

    ``TOP_M`` > 0 (with ``ONE_CHUNK``): ``top_ptr`` lists the TOP_M centroids that moved most
    (``_top_moves_kernel``), then the bits of the largest move among the rest. The bound is lowered
    by that move only, and the rows' exact distances to the listed centroids (but their own) bound
    those: late in a fit few centroids still move, and Hamerly's rule alone, lowering every bound
    by the largest move anywhere, kept listing rows that no move had come near."""
    rows = (tl.zeros((BLOCK_N,), tl.int64) + t) * BLOCK_N + tl.arange(0, BLOCK_N)  # t may be a Python int (interpreter)
    row_mask = rows < n
    # The other centroids moved by at most the largest move but the row's own centroid's
    # (``finish_update``'s keys: float32 bits << 32 | index).
    top_key = tl.load(shift_top_ptr)
    top1 = (top_key >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    top2 = (tl.load(shift_top_ptr + 1) >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    top_index = top_key & 0xFFFFFFFF
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
    else:
        scale = tl.full((BLOCK_N,), 1.0, tl.float32)
    label = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    if TOP_M > 0:
        moved = tl.zeros((BLOCK_N,), tl.float32) + tl.load(top_ptr + TOP_M).to(tl.float32, bitcast=True)
    else:
        moved = tl.where(label == top_index, top2, top1)
    lower = tl.sqrt(tl.load(lower_ptr + rows, mask=row_mask, other=0.0))
    lower = tl.maximum(lower * (1.0 - margin) - moved * (1.0 + margin), 0.0)
    # The exact distance to the row's own moved centroid: the bound's test and the inertia.
    dims0 = tl.arange(0, BLOCK_D)
    sq = tl.zeros((BLOCK_N,), tl.float32)
    if ONE_CHUNK:
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims0[None, :] * stride_xd, mask=row_mask[:, None] & (dims0 < d)[None, :], other=0.0),
            row_mask, tl.load(offset_ptr + dims0, mask=(dims0 < d) & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
        cr = tl.load(c_ptr + label[:, None] * d + dims0[None, :], mask=row_mask[:, None] & (dims0 < d)[None, :], other=0.0)
        diff = xr - cr
        sq = tl.sum(diff * diff, axis=1)
        if TOP_M > 0:
            # All listed centroids at once, as one product (fp32 FMAs, ``ieee``): a reduction per
            # centroid over the row tile cost the pass five times its time (H200, 2026-12-03).
            ids = tl.load(top_ptr + tl.arange(0, TOP_M))
            cm = tl.load(c_ptr + tl.maximum(ids, 0).to(tl.int64)[:, None] * d + dims0[None, :],
                         mask=(dims0 < d)[None, :], other=0.0)
            c_sq = tl.sum(cm * cm, axis=1)
            x_sq = tl.sum(xr * xr, axis=1)
            dots = tl.dot(xr, tl.trans(cm), input_precision="ieee")
            norms = x_sq[:, None] + c_sq[None, :]
            # Lowered by the rounding of |x|^2 + |c|^2 - 2 x.c in fp32: each of the three within
            # d + 2 units of |x|^2 + |c|^2 (2 |x.c| <= |x|^2 + |c|^2).
            near_sq = tl.maximum(norms - 2.0 * dots - (d + 4) * 1.1920928955078125e-07 * norms, 0.0)
            near_sq = tl.where((ids[None, :] == label[:, None]) | (ids[None, :] < 0), float("inf"), near_sq)
            near = tl.min(near_sq, axis=1)
            # Rounded down as the stored bounds are (a distance of d fp32 terms, ``margin``).
            lower = tl.minimum(lower, tl.sqrt(near) * (1.0 - margin))
    else:
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + dims0
            xr = transform_rows(
                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & (dims < d)[None, :], other=0.0),
                row_mask, tl.load(offset_ptr + dims, mask=(dims < d) & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
            cr = tl.load(c_ptr + label[:, None] * d + dims[None, :], mask=row_mask[:, None] & (dims < d)[None, :], other=0.0)
            diff = xr - cr
            sq += tl.sum(diff * diff, axis=1)
    settled = row_mask & (sq * (1.0 + margin) < lower * lower)
    unsettled = row_mask & (settled == 0)
    n_active = tl.sum(unsettled.to(tl.int32), axis=0)
    base = tl.atomic_add(active_count_ptr, n_active)
    pos = base + tl.cumsum(unsettled.to(tl.int32), axis=0) - 1
    tl.store(active_rows_ptr + pos, rows.to(tl.int32), mask=unsettled)
    tl.store(sq_dist_ptr + rows, sq, mask=settled)
    tl.store(lower_ptr + rows, lower * lower, mask=settled)
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + rows, mask=settled, other=0.0)
    else:
        w = tl.full((BLOCK_N,), 1.0, tl.float32)
    return tl.sum(tl.where(settled, sq * w, 0.0), axis=0)


def top_moves_reference(shifts: torch.Tensor, top_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_top_moves_kernel`` with torch: the indices of the ``top_m`` largest ``shifts`` (equal
    moves: the larger index first; -1 past the number of centroids) and the largest of the rest (0
    if none)."""
    keys = (shifts.float().view(torch.int32).to(torch.int64) << 32) | torch.arange(shifts.numel(), device=shifts.device)
    order = torch.sort(keys, descending=True).indices
    ids = torch.full((top_m,), -1, dtype=torch.int64, device=shifts.device)
    ids[: min(top_m, order.numel())] = order[:top_m]
    rest = shifts[order[top_m]].float() if order.numel() > top_m else shifts.new_zeros((), dtype=torch.float32)
    return ids, rest


def settle_reference(
    x_t: torch.Tensor, c: torch.Tensor, labels: torch.Tensor, lower_sq: torch.Tensor, shifts: torch.Tensor,
    top_m: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch settle test on transformed rows: ``(settled mask, exact sq distance to the own
    centroid, new lower bound (squared))``, with the kernel's margins. ``shifts``: each centroid's
    move since the bounds were taken; ``top_m``: the kernel's ``TOP_M`` (``configs.top_moves``)."""
    d = x_t.shape[1]
    margin = distance_margin(d)
    labels = labels.long()
    rows = x_t.float()
    if top_m > 0:
        ids, moved = top_moves_reference(shifts, top_m)
    else:
        top = torch.topk(shifts, min(2, shifts.numel())).indices
        top1 = shifts[top[0]]
        top2 = shifts[top[1]] if top.numel() > 1 else torch.zeros_like(top1)
        moved = torch.where(labels == top[0], top2, top1)
    lower = (lower_sq.sqrt() * (1 - margin) - moved * (1 + margin)).clamp_min(0)
    if top_m > 0:
        listed = ids[ids >= 0]
        near = ((rows[:, None, :] - c[listed][None]) ** 2).sum(-1)
        near = near.masked_fill(listed[None, :] == labels[:, None], float("inf"))
        if listed.numel():
            lower = torch.minimum(lower, near.min(1).values.sqrt() * (1 - margin))
    sq = ((rows - c[labels]) ** 2).sum(1)
    return sq * (1 + margin) < lower * lower, sq, lower * lower


@triton.jit
def _top_moves_kernel(moves_ptr, top_ptr, k, TOP_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: the indices of the TOP_M largest of the ``k`` centroid moves (equal moves: the
    larger index first; -1 where fewer than TOP_M), then the float32 bits of the largest move among
    the rest (0 if none). Keys (move bits << 32 | index) order as the moves (non-negative floats)."""
    cols = tl.arange(0, BLOCK_K)
    live = cols < k
    moves = tl.load(moves_ptr + cols, mask=live, other=0.0)
    keys = (moves.to(tl.int32, bitcast=True).to(tl.int64) << 32) | cols.to(tl.int64)
    keys = tl.where(live, keys, -1)
    best = tl.max(keys, axis=0)
    for j in tl.static_range(TOP_M + 1):
        if j > 0:
            best = tl.max(tl.where(keys < best, keys, -1), axis=0)
        if j < TOP_M:
            tl.store(top_ptr + j, tl.where(best >= 0, (best & 0xFFFFFFFF).to(tl.int32), -1))
        else:
            tl.store(top_ptr + j, tl.where(best >= 0, (best >> 32).to(tl.int32), 0))


class BoundsEngine(ReplayedEngine):
    """Lloyd iterations with per-row lower bounds and a compacted exact search (module docstring).

    The first pass searches every row (and records its bound and the sums); each later pass is:
    shifts of the centroids, the settle pass (all rows, one read), the preparation of the
    centroids, the search of the listed rows (persistent; the exact mode's re-search after it;
    rows that change cluster move between the float64 sums), and ``finish_update``.
    Needs the exact mode's best two candidates, so d > 8.
    """

    kernel = "pruned"
    warm_kind = "bounds"  # the settle pass's kernels (``ReplayedPass``'s warm key)
    dense_passes = True  # whether the passes after a start or a relocation may search every row (``__init__``)
    relocates_on_device = True
    # As ``LloydEngine``'s: a settle pass from the current ``c`` (its bounds already lowered by the
    # last update's moves) gives the labels an exact pass over ``c`` would, and their inertia.
    labels_by_one_more_pass = True

    def __init__(
        self, x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor, *, offset: torch.Tensor | None,
        row_scale: torch.Tensor | None, raw_norms: torch.Tensor | None, sample_weight: torch.Tensor | None,
        normalize: bool, tol: float, graphs: bool = False, block: int = 1, timed: bool = False,
    ):
        n, d = x.shape
        k = centroids.shape[0]
        if d <= SMALL_D:
            raise ValueError(f"the bounds engine needs d > {SMALL_D} (the exact tensor-core pass), got d={d}")
        device = x.device
        # ``block``: once the first settle pass has run, settle passes run in blocks of this many
        # (``run_block``, one host sync per block), frozen on the device past a stopping rule like
        # the dense engine's. With ``graphs``, every settle pass after the first (from the first,
        # once a pass of the same shape ran in this process) replays one captured pass (a block is
        # a few replays, not a graph of a whole block: capturing one costs the host as much as
        # running it, more than short fits gain).
        self.block, self.block_size, self.normalize = 1, max(1, block), normalize
        self.tol_device = device_tol(tol)
        self.x, self.labels = x, labels
        # The engine's own copy of the offset, which ``restart`` overwrites.
        self.inputs = {"offset": None if offset is None else offset.clone(), "row_scale": row_scale,
                       "raw_norms": raw_norms, "sample_weight": sample_weight}
        # Centroid moves are rounded up by this much: fp32 norms of d differences.
        self.shift_margin = distance_margin(d)
        self.settle_cfg = settle_config()
        self.settle_grid = triton.cdiv(n, self.settle_cfg["BLOCK_N"])
        # The row-oriented search: the transposed one was not measured (nor run on a GPU) with the
        # lower bounds and row lists of this engine. After the full pass, the sums are kept across
        # passes in float64 and only the rows whose label changed move between them (``moves``):
        # a settled row costs one read of x and no atomics.
        self.assign_pass = AssignPass(x, k, "exact", update=True, extra_partials=self.settle_grid,
                                      config=assign_config(n, k, d, x.dtype, "exact", transposed=False,
                                                           row_list=True),
                                      lower_bounds=True, moves=True, scaled=row_scale is not None, fixed_rows=True)
        # The full pass searches every row, without a list: there the dense engine's tiles are
        # faster where they differ (rows of at most 32 features, see ``assign_config``). H200,
        # 245,760 x 32, k = 1024, fp32, replayed: the full pass's search 0.410 ms on the row-list
        # tiles against 0.182 ms on the dense ones, while over lists of most rows the row-list
        # tiles took 0.25 ms and the dense ones 0.34 (2026-12-03). Its sums are never read
        # (``_full_pass`` takes the float64 base by ``_exact_sums``), so it adds none wherever it
        # is a launch of its own: over at most 64 clusters they would be carried through the
        # one-hot product that Triton 3.6 miscompiles beside the float64 tie settling of these
        # tiles (H100, compute-sanitizer, 2026-12-06: "out-of-range shared or local address" at
        # ``_common._dot_bf16``, the row-list tiles over 48 clusters of 32 features; its shared
        # memory shrinks with the tie code, 40,960 -> 24,576 bytes), and over more they were fp32
        # atomics for nothing. Over more than 64 clusters on the row-list tiles, the settle passes'
        # own launch (its sums by atomics) serves, one compile fewer.
        full_cfg = assign_config(n, k, d, x.dtype, "exact", transposed=False)
        dense_tiles = k > self.assign_pass.cfg["BLOCK_K"] and full_cfg != self.assign_pass.cfg
        if dense_tiles or k <= onehot_max_k(d):
            self.full_search = AssignPass(x, k, "exact", update=False,
                                          config=full_cfg if dense_tiles else self.assign_pass.cfg,
                                          lower_bounds=True, scaled=row_scale is not None, fixed_rows=True)
        else:
            self.full_search = self.assign_pass
        # The passes right after the first and after a relocation of empty clusters, while the
        # centroids still move far and most rows fail their bounds: there the row-list search over
        # most rows is slower than the dense tiles' over every row (H200, 245,760 x 32, k = 1,024:
        # 0.249 against 0.192 ms with every row listed; passes 2-4 of a fit list most rows; a
        # fit's GPU time 4-11 % less, H100: ``dense_settle_passes``). Where
        # those tiles differ, such passes search every row on them instead of settling any, move
        # the rows that change cluster between the same float64 sums, and take fresh bounds
        # (``configs.dense_settle_passes``: how many after a start, and after a relocation). Over
        # at most 64 clusters the dense tiles carry their sums, which moves over every row cannot
        # take (``AssignPass.__call__``). With the list search's register cap (``lazy_register_cap``,
        # 2026-12-06) a list of every row costs about what the dense tiles do over every row, and
        # the dense passes still gave the shortest fits (H100, 245,760 x 32 x 1,024, GPU ms, 5,2 /
        # 2,1 / 0,0 with the cap: 3.69 / 3.76 / 3.86 at sigma^2 0.0125, 5.53 / 5.68 / 5.74 at 0.05).
        self.dense_after = dense_settle_passes() if self.dense_passes and dense_tiles and k > onehot_max_k(d) else (0, 0)
        self.dense_search: AssignPass | None = None
        if any(self.dense_after):
            self.dense_search = AssignPass(x, k, "exact", update=True, config=full_cfg, lower_bounds=True, moves=True,
                                           scaled=row_scale is not None, fixed_rows=True)
            shared = self.assign_pass
            self.dense_search.move_acc = shared.move_acc
            self.dense_search.move_sums, self.dense_search.move_counts = shared.move_sums, shared.move_counts
        self._dense_left = 0  # dense passes still to run: set by the first pass and by relocations
        self.c = centroids.to(torch.float32).contiguous().clone()
        self.c_old = torch.empty_like(self.c)
        self.sums = torch.empty(k, d, dtype=torch.float32, device=device)
        self.counts = torch.empty(k, dtype=torch.float32, device=device)
        self.active_count = torch.zeros(1, dtype=torch.int32, device=device)
        # A pass's record: [inertia, shift, changed, empty] (``stats``), rows searched, rows
        # deferred, and the keys of the two largest centroid moves (``shift_top``, int64: see
        # ``finish_update``), which the next settle pass reads. ``finish_update`` writes all of it,
        # and in a block copies it into ``log`` and the statistics into ``stats_prev``, which the
        # next pass of the block checks.
        self.record = torch.zeros(8, dtype=torch.float64, device=device)
        self.stats = self.record[:4].view(1, 4)
        self.shift_top = self.record[6:].view(torch.int64)
        self.sq_dist = torch.empty(n, dtype=torch.float32, device=device)
        self.lower = torch.zeros(n, dtype=torch.float32, device=device)
        # Each centroid's last move (``finish_update``), and the settle pass's list of the ones that
        # moved most (``configs.top_moves``; 0 past the 64 features a settle tile holds whole).
        self.top_m = top_moves(k, d)
        self.moves = torch.zeros(k, dtype=torch.float32, device=device)
        self.top_moves = torch.zeros(self.top_m + 1, dtype=torch.int32, device=device)
        self.active_rows = torch.empty(max(1, n), dtype=torch.int32, device=device)
        self.info: PassInfo | None = None
        self.infos: list[PassInfo] = []  # one per row of the last ``read``
        # A settle pass is about five launches, more host time than a small pass takes on the GPU:
        # it is replayed as a CUDA graph from its second run on, or its first when warm (``ReplayedPass``).
        key = launch_key(self.warm_kind, k, {"x": x, "labels": labels, **self.inputs}, normalize=normalize)
        self._init_passes(self._settle_pass, device, graphs, timed, self.block_size, self.record.numel(), key)
        self._dense_passes = (ReplayedPass(self._dense_pass, device, graphs, timed, ("dense", *key))
                              if self.dense_search is not None else None)
        self._first = True  # the first pass searches every row: the bounds come from it ("full")
        # The full pass, by whether it has previous labels: eager the first time, then (a fit that
        # restarts this engine, see ``restart``) captured and replayed. Eagerly its launches cost the
        # host about 0.7 ms at 245,760 x 32, k = 1024 (H200), three times its GPU time.
        self._full_passes = {has_prev: ReplayedPass(lambda has_prev=has_prev: self._full_pass(has_prev), device, graphs)
                             for has_prev in (False, True)}
        self.assign_pass.part_changed[self.assign_pass.extra_base:].zero_()  # settled rows never change

    def restart(self, centroids: torch.Tensor, offset: torch.Tensor | None = None) -> None:
        """Start another run on the same rows from ``centroids`` (``ReplayedEngine._start_from``):
        the next pass searches every row again."""
        self._start_from(centroids, offset)
        self._first = True
        self.block = 1
        self.info, self.infos = None, []

    def unreplayed_passes(self) -> int:
        """How many passes of a run handed over to this engine (its full pass with previous labels,
        then settle passes) would cost the host their launches, eagerly or captured, rather than a
        replay: 3 for a new engine (the full pass, the first settle pass, the capture of the next),
        fewer for one kept from an earlier fit (``torchkm._loop._Hybrid.trial_cost``)."""

        def unreplayed(run: ReplayedPass, eager_calls: int) -> int:
            if run.graph is not None:
                return 0
            warm = run.warm_key is not None and run.warm_key in ReplayedPass._warm_keys
            return 1 if run.use_graphs and (run.calls >= 1 or warm) else eager_calls

        return unreplayed(self._full_passes[True], 1) + unreplayed(self._passes, 2)

    def iterate(self, has_prev: bool) -> None:
        """One pass: the engine's first searches every row (a dense pass that records the bounds),
        later ones are settle passes."""
        if self._first:
            self._first = False
            # A run the hybrid hands over (previous labels) starts from centroids that already
            # settled some: its settle passes list fewer rows from the start.
            self._dense_left = 0 if has_prev else self.dense_after[0]
            self._passes.begin(single="full")
            self._full_passes[has_prev]()
            self._queue_single()
            return
        self._settle_passes_run(1)

    def _full_pass(self, has_prev: bool) -> None:
        """Search every row (a dense pass), recording each row's bound."""
        p = self.full_search
        p.part_inertia[p.extra_base:].zero_()
        self.active_count.fill_(self.x.shape[0])
        p(self.x, self.c, **self.inputs, prev_labels=self.labels if has_prev else None, labels=self.labels,
          sq_dist=self.sq_dist, zero=(self.record,), lower=self.lower)
        # The sums every later pass changes by the rows that change cluster (before any relocation
        # of empty clusters, which changes no label), and this pass's update too: so that every
        # update is of float64 sums, as a dense fit's with ``moves`` (``lloyd.LloydEngine``).
        moves = self.assign_pass
        self._exact_sums(moves.move_sums[0], moves.move_counts[0])
        self._finish(None, moves.move_sums, moves.move_counts, p)
        self.log[0].copy_(self.record)

    def _exact_sums(self, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """The float64 sums and counts of the rows, as the kernels transform them, by their current
        labels (``update.float64_sums``).

        Later passes only add the rows that move, so the base they start from stays in every later
        centroid. The pass's own fp32 atomic sums, chains of up to 10^5 additions into clusters
        that are large at the first pass, were that base before: H200, 2026-12-03, 3.9M x 32 x 128,
        bf16 rows, one cluster's sum 3.2 off float64 after the first pass and still after the sixth,
        when it held 31k rows instead of 174k, so its centroid was 7e-5 (relative) off the float64
        mean of its rows; the dense passes' were near 1e-7 (fp32 rows: 1e-7 to 1.4e-4, depending
        on the start)."""
        inp = self.inputs
        float64_sums(self.x, self.labels, self.c.shape[0], sample_weight=inp["sample_weight"], offset=inp["offset"],
                     row_scale=inp["row_scale"], out=(sums, counts))

    def _dense_pass(self) -> None:
        """A pass that settles no row: every row searched on the dense tiles, with its bound taken
        afresh, and the rows that change cluster moved between the float64 sums (see ``__init__``)."""
        p = self.dense_search
        self.active_count.fill_(self.x.shape[0])
        p(self.x, self.c, **self.inputs, prev_labels=self.labels, labels=self.labels, sq_dist=self.sq_dist,
          zero=(self.record,), lower=self.lower, clear=False, control=self.control, stats_prev=self.stats_prev,
          iteration=0, tol=self.tol_device, moves=True)
        self._finish(self.control, p.move_sums, p.move_counts, p)

    def _settle_pass(self) -> None:
        self._settle()
        # Settled rows keep their cluster: the listed rows that change it move between the sums.
        p = self.assign_pass
        p(self.x, self.c, **self.inputs, prev_labels=self.labels, labels=self.labels, sq_dist=self.sq_dist,
          zero=(self.record,), lower=self.lower, rows=(self.active_rows, self.active_count), clear=False,
          control=self.control, stats_prev=self.stats_prev, iteration=0, tol=self.tol_device, moves=True)
        self._finish(self.control, p.move_sums, p.move_counts)

    def _settle(self) -> None:
        """The settle pass's first part: each row against its own moved centroid, the rows its
        bound cannot settle listed in ``active_rows`` (``active_count`` of them)."""
        p = self.assign_pass
        n, d = self.x.shape
        inp = self.inputs
        # How far the centroids moved since the bounds were taken: the last ``finish_update``
        # wrote the two largest moves into ``shift_top`` (``centroids_changed`` after a relocation).
        # In a frozen pass the kernels do nothing, and what this clears is not read.
        self.active_count.zero_()
        one_chunk = d <= 64
        block_d = max(16, triton.next_power_of_2(d)) if one_chunk else 32
        dummy = torch.empty(1, dtype=torch.float32, device=self.x.device)
        if self.top_m:
            k = self.c.shape[0]
            launcher(_top_moves_kernel)[(1,)](self.moves, self.top_moves, k, TOP_M=self.top_m,
                                              BLOCK_K=max(16, triton.next_power_of_2(k)))
        launcher(_settle_kernel)[(self.settle_grid,)](
            self.x, self.c, dummy if inp["offset"] is None else inp["offset"],
            dummy if inp["row_scale"] is None else inp["row_scale"],
            dummy if inp["sample_weight"] is None else inp["sample_weight"],
            self.labels, self.sq_dist, self.lower, self.shift_top, self.top_moves, self.active_rows, self.active_count,
            p.part_inertia, p.extra_base, self.control, self.stats_prev, 0, self.tol_device,
            n, d, self.x.stride(0), self.x.stride(1), distance_margin(d),
            BLOCK_D=block_d, ONE_CHUNK=one_chunk, TOP_M=self.top_m, HAS_OFFSET=inp["offset"] is not None,
            HAS_SCALE=inp["row_scale"] is not None, HAS_WEIGHT=inp["sample_weight"] is not None, HAS_CONTROL=True,
            CHECK_STOP=True, **self.settle_cfg,
        )

    def _settle_passes_run(self, passes: int, follow: bool = False) -> None:
        """``passes`` settle passes without a host sync, each record into ``log`` (the first ones
        after a start or a relocation over every row, see ``__init__``); ``follow``: see ``run_block``."""
        self._run_passes(passes, self.record, follow)
        # Later settle passes run in blocks (``run_block``), where asked for.
        self.block = self.block_size

    def _next_pass(self) -> ReplayedPass:
        if self._dense_left > 0 and self._dense_passes is not None:
            self._dense_left -= 1
            return self._dense_passes
        return self._passes

    def _replayed_passes(self) -> list[ReplayedPass]:
        return [self._passes] + ([self._dense_passes] if getattr(self, "_dense_passes", None) is not None else [])

    def relocate(self, n_empty: int, follow: bool = False) -> torch.Tensor:
        shift = super().relocate(n_empty, follow)
        self._dense_left = self.dense_after[1]
        return shift

    def run_block(self, iterations: int, follow: bool = False) -> None:
        """Up to ``iterations`` (<= ``block_size``) settle passes with one host sync (at the ``read``):
        a pass after one that met a stopping rule, or left a cluster empty, does nothing.
        ``follow``: as ``LloydEngine.run_block``'s."""
        self._settle_passes_run(iterations, follow)

    def _finish(self, control: torch.Tensor | None, acc_sums: torch.Tensor, acc_counts: torch.Tensor,
                p: AssignPass | None = None) -> None:
        """``finish_update`` of a pass of ``p`` (the settle passes' search by default)."""
        p = p or self.assign_pass
        finish_update(acc_sums, acc_counts, self.c, p.part_inertia, p.part_changed, self.record,
                      normalize=self.normalize, old_centroids=self.c_old, sums=self.sums, counts=self.counts,
                      control=control, shift_top=self.shift_top, shift_margin=self.shift_margin,
                      tallies=(self.active_count, p.flag_count), record=None if control is None else self.recording,
                      moves=self.moves if self.top_m else None)

    @property
    def sq_distances(self) -> torch.Tensor:
        """Each row's squared distance (fp32, transformed rows) to its centroid of the last pass that
        ran: what an empty cluster's relocation picks the farthest rows by. Settled rows stored it
        in the settle pass, searched rows in the search."""
        return self.sq_dist

    def _relocation_outputs(self) -> dict:
        # The moves from ``c_old`` to the relocated centroids, as ``centroids_changed`` sets them.
        self.shift_top.zero_()
        return {"shift_top": self.shift_top, "shift_margin": self.shift_margin,
                "moves": self.moves if self.top_m else None}

    def centroids_changed(self) -> None:
        """Call after changing ``c`` outside the engine's passes (empty-cluster relocation): the
        next settle pass lowers the bounds by the moves from ``c_old`` to the new ``c``."""
        self.shift_top.copy_(shift_top_reference(self.c, self.c_old, self.shift_margin))
        self._dense_left = self.dense_after[1]
        if self.top_m:
            self.moves.copy_(moves_reference(self.c, self.c_old, self.shift_margin))

    def read(self, rows: int) -> list[list[float]]:
        """The statistics of the first ``rows`` passes of the oldest block (or ``iterate``) not yet
        read (``LloydEngine.read``); their ``PassInfo`` in ``infos`` (the last one also in ``info``)."""
        values = self._read_log(rows)
        n, k = self.x.shape[0], self.c.shape[0]
        block = self.assign_pass.cfg["BLOCK_N"]
        self.infos = []
        for row in values:
            active, flagged = row[4], row[5]
            tiles = math.ceil(active / block) * block
            self.infos.append(PassInfo(self.kernel, (active + flagged) * k, (tiles + flagged) * k, n, k))
        self.info = self.infos[-1]
        return [row[:4] for row in values]
