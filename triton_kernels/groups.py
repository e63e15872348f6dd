"""Lloyd iterations with Yinyang's group bounds: a row searches only the groups of centroids that can
still hold its nearest one. An experiment (``TORCHKM_BOUNDS=groups``): it skips far more distances
than the per-row bounds of ``prune.BoundsEngine`` but, so far, takes longer (BENCHMARKS.md, 2026-12-01).

The centroids are split once per fit into groups of at most ``GROUP_SIZE`` (one tile of the
search's product) by recursive median bisection, so that a group's members lie close together.
Each row keeps, for every group, a lower bound on its distance to the group's members other than
its own centroid (``bounds``, group-major G x n). After an update every bound drops by its group's
largest centroid move (the drift); the bounds are stored as ``sqrt(lower) + D_g`` with ``D_g`` the
group's drift summed over the fit so far, so a pass reads them all and writes only those it searches.

The first pass searches every row with the dense exact pass (as ``prune.BoundsEngine``), whose
second-best distance starts every group's bound. The rows are then copied in order of their label
(seed 000's reordering, here for memory): the rows that need a group lie close together, so the
search's row reads and the bounds' writes are mostly coalesced. Each later pass (one CUDA graph
when replayed):
1. ``_drift_kernel``: each group's move since the last pass, added to ``D_g``; its members'
   largest norm (for the error bound); the stopping rule of a block; the counters cleared.
2. ``_settle_kernel``: per row, the direct fp32 distance to its own (moved) centroid; the groups
   whose bound is not above it by more than the rounding of an fp32 distance are listed, as (row,
   group) pairs bucketed by group, and as bits of the row. A row with no listed group keeps its
   cluster and is not read again in the pass.
3. ``_search_kernel``: persistent over the tiles of the buckets. A tile is up to ``BLOCK_N`` rows of
   one group against its members through ``tl.dot`` (3xTF32), the row's own centroid left out: the
   group's lowest and second-lowest estimates and the lowest's index. The estimates less their
   error bound ``E`` become the new bounds.
4. ``_finish_kernel``: per listed row, every candidate whose estimate can lie within ``2 E`` of the
   lowest (its own centroid, each searched group's best, and every member of a group whose second
   estimate can lie there too) is compared by direct fp32 distance, ties to the lowest index. So
   the label is the exact mode's (an fp32 computation, up to ties within fp32 rounding). A row that
   changes cluster moves between float64 sums kept across passes, and its old centroid's group
   takes the old distance into its bound. Labels are copied back to the caller's order.
5. ``finish_update``.

Where the time goes (H200, 3.9M x 32, k = 1,024, sigma^2 = 0.05, passes 5-10 with 20 % of the
distances left): search 5.8 ms, finish 1.7, settle 0.9, against 2.9 for a dense exact pass. The
search is bound by memory traffic per (row, group) pair (a gathered row and three scattered
writes for 32 distances); bounds in row-major order and an atomic per pair had taken 10 ms.
Memory: 16 n G + 8 n bytes beyond the bounds engine's, and a copy of the rows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from ._common import launcher, move_rows, transform_rows, unused
from .centroids import block_frozen, finish_update
from .configs import num_persistent_programs
from .prune import BoundsEngine, PassInfo, distance_margin

__all__ = ["GROUP_SIZE", "GroupBoundsEngine", "centroid_groups", "estimate_error_coefficient"]

GROUP_SIZE = 32
MAX_GROUPS = 64  # a listed row's groups are the bits of an int64
MAX_D = 64  # the search and the finish hold a row tile in one chunk (d = 129: out of shared memory)
# The search's tile rows and warps; it runs ``num_persistent_programs`` programs (4 an SM). On an
# H200 tiles of 32-256 rows, 2-8 warps and 4-16 programs an SM all took 9.5-11.1 ms a pass before
# the rows were sorted (BENCHMARKS.md, 2026-12-01).
SEARCH_BLOCK_N = 128
SEARCH_WARPS = 4
SETTLE_BLOCK_N = 64
FINISH_BLOCK_N = 64


def centroid_groups(c: torch.Tensor, size: int = GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """``(members, group_of)``: int32 (G, size) the centroid indices of each group (ascending, -1
    past the group's end) and int32 (k,) each centroid's group, for G = ceil(k / size) groups of
    nearby centroids: the set is split at the median of its widest feature (by variance) into
    parts of whole multiples of ``size``, recursively. Computed on the CPU (k x d values)."""
    k = c.shape[0]
    points = c.detach().float().cpu().numpy()
    groups: list[np.ndarray] = []

    def split(index: np.ndarray) -> None:
        if index.size <= size:
            groups.append(np.sort(index))
            return
        part = points[index]
        feature = int(np.argmax(part.var(axis=0)))
        order = index[np.argsort(part[:, feature], kind="stable")]
        left = math.ceil(math.ceil(index.size / size) / 2) * size
        split(order[:left])
        split(order[left:])

    split(np.arange(k))
    members = np.full((len(groups), size), -1, dtype=np.int32)
    group_of = np.empty(k, dtype=np.int32)
    for g, index in enumerate(groups):
        members[g, : index.size] = index
        group_of[index] = g
    return torch.from_numpy(members).to(c.device), torch.from_numpy(group_of).to(c.device)


def estimate_error_coefficient(d: int) -> float:
    """``coef`` with ``|estimate - fp32 direct distance| <= coef (|x| + max |c|)^2`` for the search's
    estimate ``|x|^2 + |c|^2 - 2 x.c`` with 3xTF32 products (each operand a tf32 part plus a tf32
    rest, the rests' product dropped: about 2^-20 relative per product, 2^-18 taken) accumulated
    in fp32, and fp32 norms; with room to spare. (The search is bound by its memory traffic, so its
    three products cost little; plain tf32 left a window 150 times wider to compare directly.)"""
    return 1.25 * (2.0**-18 + (2 * d + 16) * 2.0**-22)


@triton.jit
def _drift_kernel(c_ptr, c_old_ptr, members_ptr, drift_ptr, drift32_ptr, c_norm_ptr, counters_ptr, record_ptr,
                  control_ptr, stats_prev_ptr, tol, n_counters, n_record, d, margin,
                  S: tl.constexpr, BLOCK_D: tl.constexpr, CP: tl.constexpr):
    g = tl.program_id(0)
    frozen = block_frozen(control_ptr, stats_prev_ptr, 0, tol, True)
    if frozen:
        if g == 0:
            tl.store(control_ptr, 1)
    else:
        slots = tl.arange(0, S)
        member = tl.load(members_ptr + g * S + slots)
        valid = member >= 0
        member = tl.where(valid, member, 0).to(tl.int64)
        moved = tl.zeros((S,), tl.float32)
        norm = tl.zeros((S,), tl.float32)
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            m = valid[:, None] & (dims < d)[None, :]
            cn = tl.load(c_ptr + member[:, None] * d + dims[None, :], mask=m, other=0.0)
            co = tl.load(c_old_ptr + member[:, None] * d + dims[None, :], mask=m, other=0.0)
            moved += tl.sum((cn - co) * (cn - co), axis=1)
            norm += tl.sum(cn * cn, axis=1)
        drift = tl.max(tl.where(valid, tl.sqrt(moved), 0.0), axis=0) * (1.0 + margin)
        total = tl.load(drift_ptr + g) + drift.to(tl.float64)
        tl.store(drift_ptr + g, total)
        tl.store(drift32_ptr + g, total.to(tl.float32))
        tl.store(c_norm_ptr + g, tl.max(tl.where(valid, tl.sqrt(norm), 0.0), axis=0) * (1.0 + margin))
        if g == 0:
            offs = tl.arange(0, CP)
            tl.store(counters_ptr + offs, tl.zeros((CP,), tl.int32), mask=offs < n_counters)
            tl.store(record_ptr + offs, tl.zeros((CP,), tl.float64), mask=offs < n_record)


@triton.jit
def _own_distance(x_ptr, c_ptr, offset_ptr, rows, row_mask, label, scale, d, stride_xn, stride_xd,
                  BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    """Direct fp32 squared distance of each transformed row to centroid ``label``, the rows read
    here (the settle's test; the finish compares candidates with ``_distance_to`` on its own tile,
    own centroid included, so every comparison of a row uses one sum)."""
    sq = tl.zeros(rows.shape, tl.float32)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dm = dims < d
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=row_mask[:, None] & dm[None, :], other=0.0),
            row_mask, tl.load(offset_ptr + dims, mask=dm & HAS_OFFSET, other=0.0), scale, HAS_OFFSET, HAS_SCALE)
        cr = tl.load(c_ptr + label[:, None] * d + dims[None, :], mask=row_mask[:, None] & dm[None, :], other=0.0)
        diff = xr - cr
        sq += tl.sum(diff * diff, axis=1)
    return sq


@triton.jit
def _settle_kernel(
    x_ptr, c_ptr, offset_ptr, scale_ptr, weight_ptr, labels_ptr, sq_dist_ptr, bounds_ptr, need_ptr, drift32_ptr,
    counters_ptr, group_rows_ptr, active_rows_ptr, part_inertia_ptr, control_ptr,
    n, d, G, stride_xn, stride_xd, margin,
    BLOCK_N: tl.constexpr, GP: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    # counters: [rows listed, (row, group) pairs, then one per group]
    if tl.load(control_ptr) == 0:
        t = tl.program_id(0)
        rows = t.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_mask = rows < n
        if HAS_SCALE:
            scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0)
        else:
            scale = tl.full((BLOCK_N,), 1.0, tl.float32)
        label = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int64)
        sq = _own_distance(x_ptr, c_ptr, offset_ptr, rows, row_mask, label, scale, d, stride_xn, stride_xd,
                           BLOCK_D, HAS_OFFSET, HAS_SCALE)
        groups = tl.arange(0, GP)
        group_mask = groups < G
        pair_mask = row_mask[:, None] & group_mask[None, :]
        stored = tl.load(bounds_ptr + groups.to(tl.int64)[None, :] * n + rows[:, None], mask=pair_mask, other=float("inf"))
        drift = tl.load(drift32_ptr + groups, mask=group_mask, other=0.0)
        # ``stored - drift`` rounds by a few ulps of the larger term: the margin covers them.
        lower = stored - drift[None, :] - margin * (stored + drift[None, :])
        lower = tl.where(stored == float("inf"), float("inf"), lower)  # a group holding only the own centroid
        own = tl.sqrt(sq) * (1.0 + margin)
        needs = pair_mask & (own[:, None] >= lower)
        listed = tl.sum(needs.to(tl.int32), axis=1) > 0
        settled = row_mask & (listed == 0)
        tl.store(sq_dist_ptr + rows, sq, mask=row_mask)
        # Which groups a listed row searches: one bit a group.
        bits = tl.sum(tl.where(needs, tl.full((BLOCK_N, GP), 1, tl.int64) << groups.to(tl.int64)[None, :], 0), axis=1)
        tl.store(need_ptr + rows, bits, mask=listed)
        n_listed = tl.sum(listed.to(tl.int32), axis=0)
        base = tl.atomic_add(counters_ptr, n_listed)
        pos = base + tl.cumsum(listed.to(tl.int32), axis=0) - 1
        tl.store(active_rows_ptr + pos, rows.to(tl.int32), mask=listed)
        per_group = tl.sum(needs.to(tl.int32), axis=0)
        tl.atomic_add(counters_ptr + 1, tl.sum(per_group, axis=0))
        group_base = tl.atomic_add(counters_ptr + 2 + groups, per_group, mask=group_mask)
        slot = group_base[None, :] + tl.cumsum(needs.to(tl.int32), axis=0) - 1
        tl.store(group_rows_ptr + groups.to(tl.int64)[None, :] * n + slot, tl.broadcast_to(rows.to(tl.int32)[:, None], (BLOCK_N, GP)),
                 mask=needs)
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + rows, mask=settled, other=0.0)
        else:
            w = tl.full((BLOCK_N,), 1.0, tl.float32)
        tl.store(part_inertia_ptr + t, tl.sum(tl.where(settled, sq * w, 0.0), axis=0))


@triton.jit
def _search_kernel(
    x_ptr, c_ptr, offset_ptr, scale_ptr, labels_ptr, members_ptr, counters_ptr, group_rows_ptr, bounds_ptr,
    second_ptr, args_ptr, drift32_ptr, c_norm_ptr, control_ptr,
    n, d, G, stride_xn, stride_xd, coef,
    BLOCK_N: tl.constexpr, S: tl.constexpr, GP: tl.constexpr, DP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    if tl.load(control_ptr) == 0:
        groups = tl.arange(0, GP)
        group_mask = groups < G
        counts = tl.load(counters_ptr + 2 + groups, mask=group_mask, other=0)
        tiles = (counts + BLOCK_N - 1) // BLOCK_N
        ends = tl.cumsum(tiles, axis=0)
        total = tl.sum(tiles, axis=0)
        c_max = tl.max(tl.load(c_norm_ptr + groups, mask=group_mask, other=0.0), axis=0)
        slots = tl.arange(0, S)
        dims = tl.arange(0, DP)
        dim_mask = dims < d
        shift = tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0)
        for t in range(tl.program_id(0), total, tl.num_programs(0)):
            g = tl.sum((ends <= t).to(tl.int32), axis=0)
            first = tl.sum(tl.where(groups == g, ends - tiles, 0), axis=0)
            count = tl.sum(tl.where(groups == g, counts, 0), axis=0)
            at = (t - first) * BLOCK_N + tl.arange(0, BLOCK_N)
            live = at < count
            rows = tl.load(group_rows_ptr + g.to(tl.int64) * n + at, mask=live, other=0).to(tl.int64)
            if HAS_SCALE:
                scale = tl.load(scale_ptr + rows, mask=live, other=1.0)
            else:
                scale = tl.full((BLOCK_N,), 1.0, tl.float32)
            xr = transform_rows(
                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=live[:, None] & dim_mask[None, :], other=0.0),
                live, shift, scale, HAS_OFFSET, HAS_SCALE)
            member = tl.load(members_ptr + g * S + slots)
            valid = member >= 0
            cg = tl.load(c_ptr + tl.where(valid, member, 0).to(tl.int64)[:, None] * d + dims[None, :],
                         mask=valid[:, None] & dim_mask[None, :], other=0.0)
            x_sq = tl.sum(xr * xr, axis=1)
            c_sq = tl.sum(cg * cg, axis=1)
            prod = tl.dot(xr, tl.trans(cg), input_precision="tf32x3")
            est = tl.maximum(x_sq[:, None] + c_sq[None, :] - 2.0 * prod, 0.0)
            label = tl.load(labels_ptr + rows, mask=live, other=-1)
            est = tl.where(valid[None, :] & (member[None, :] != label[:, None]), est, float("inf"))
            low = tl.min(est, axis=1)
            best = tl.min(tl.where(est == low[:, None], member[None, :], 0x7FFFFFFF), axis=1)
            second = tl.min(tl.where(member[None, :] == best[:, None], float("inf"), est), axis=1)
            err = coef * (tl.sqrt(x_sq) + c_max) * (tl.sqrt(x_sq) + c_max)
            drift = tl.load(drift32_ptr + g)
            # Stored as sqrt(lower) + D_g, sqrt rounded down a little (the settle's margin covers
            # the rest of the rounding).
            low_bound = tl.sqrt(tl.maximum(low - err, 0.0)) * (1.0 - 2.0**-22) + drift
            second_bound = tl.sqrt(tl.maximum(second - err, 0.0)) * (1.0 - 2.0**-22) + drift
            found = live & (low < float("inf"))
            at_pair = g.to(tl.int64) * n + rows
            tl.store(bounds_ptr + at_pair, low_bound, mask=live)
            tl.store(second_ptr + at_pair, second_bound, mask=live)
            tl.store(args_ptr + at_pair, tl.where(found, best, -1), mask=live)


@triton.jit
def _distance_to(xr, c_ptr, cand, ok, dims, dim_mask, d):
    """Direct fp32 squared distance of each row of the loaded tile ``xr`` to centroid ``cand``."""
    cr = tl.load(c_ptr + tl.where(ok, cand, 0).to(tl.int64)[:, None] * d + dims[None, :],
                 mask=ok[:, None] & dim_mask[None, :], other=0.0)
    diff = xr - cr
    return tl.sum(diff * diff, axis=1)


@triton.jit
def _better(dist, index, best_dist, best_index):
    return (dist < best_dist) | ((dist == best_dist) & (index < best_index))


@triton.jit
def _finish_kernel(
    x_ptr, c_ptr, offset_ptr, scale_ptr, weight_ptr, labels_ptr, sq_dist_ptr, members_ptr, group_of_ptr,
    counters_ptr, active_rows_ptr, bounds_ptr, second_ptr, args_ptr, need_ptr, drift32_ptr, c_norm_ptr,
    sums_ptr, counts_ptr, part_inertia_ptr, part_changed_ptr, part_base, control_ptr,
    n, d, G, stride_xn, stride_xd, coef, margin,
    BLOCK_N: tl.constexpr, S: tl.constexpr, GP: tl.constexpr, DP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    pid = tl.program_id(0)
    inertia = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
    changed = tl.sum(tl.zeros((BLOCK_N,), tl.int64), axis=0)
    if tl.load(control_ptr) == 0:
        groups = tl.arange(0, GP)
        group_mask = groups < G
        c_max = tl.max(tl.load(c_norm_ptr + groups, mask=group_mask, other=0.0), axis=0)
        drift = tl.load(drift32_ptr + groups, mask=group_mask, other=0.0)
        dims = tl.arange(0, DP)
        dim_mask = dims < d
        shift = tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0)
        n_rows = tl.load(counters_ptr)
        for t in range(pid, tl.cdiv(n_rows, BLOCK_N), tl.num_programs(0)):
            at = t * BLOCK_N + tl.arange(0, BLOCK_N)
            live = at < n_rows
            rows = tl.load(active_rows_ptr + at, mask=live, other=0).to(tl.int64)
            if HAS_SCALE:
                scale = tl.load(scale_ptr + rows, mask=live, other=1.0)
            else:
                scale = tl.full((BLOCK_N,), 1.0, tl.float32)
            xr = transform_rows(
                tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=live[:, None] & dim_mask[None, :], other=0.0),
                live, shift, scale, HAS_OFFSET, HAS_SCALE)
            own = tl.load(labels_ptr + rows, mask=live, other=0).to(tl.int64)
            own_sq = _distance_to(xr, c_ptr, own, live, dims, dim_mask, d)
            x_sq = tl.sum(xr * xr, axis=1)
            err = coef * (tl.sqrt(x_sq) + c_max) * (tl.sqrt(x_sq) + c_max)
            pair = groups.to(tl.int64)[None, :] * n + rows[:, None]
            pair_mask = live[:, None] & group_mask[None, :]
            bits = tl.load(need_ptr + rows, mask=live, other=0)
            listed = pair_mask & (((bits[:, None] >> groups.to(tl.int64)[None, :]) & 1) != 0)
            args = tl.load(args_ptr + pair, mask=listed, other=-1)  # -1: no member but the own centroid
            searched = args >= 0
            low_stored = tl.load(bounds_ptr + pair, mask=searched, other=float("inf"))
            low_g = low_stored - drift[None, :]
            second_g = tl.load(second_ptr + pair, mask=searched, other=float("inf")) - drift[None, :]
            # The lowest estimate is at most a searched group's root (its estimate less err, rounded
            # down, less the drift it was stored with) squared, plus err.
            slack = 2.0**-20 * (low_stored + drift[None, :]) * (low_stored + drift[None, :])
            low = tl.min(tl.where(searched, low_g * low_g * (1.0 + 4.0 * margin) + slack, float("inf")), axis=1) + err
            # Every centroid whose fp32 distance could be at most the winner's has an estimate
            # within 2 err of the lowest one (or of the own distance, itself a candidate).
            window = tl.minimum(low, own_sq) + 2.0 * err
            # The stored roots are the estimates less err, rounded down: compare with slack.
            near = searched & (low_g * low_g * (1.0 - 2.0 * margin) <= window[:, None])
            again = searched & (second_g * second_g * (1.0 - 2.0 * margin) <= window[:, None])
            best_d = own_sq
            best_i = own
            # Each searched group's best, where it lies within the window: one group a row a step.
            # (A loop of counted steps: the interpreter cannot run a ``while`` on a tensor.)
            for _ in range(0, tl.max(tl.sum(near.to(tl.int32), axis=1), axis=0)):
                pick = tl.min(tl.where(near, groups[None, :], GP), axis=1)
                ok = pick < GP
                cand = tl.sum(tl.where(groups[None, :] == pick[:, None], args, 0), axis=1).to(tl.int64)
                dist = _distance_to(xr, c_ptr, cand, ok, dims, dim_mask, d)
                take = ok & _better(dist, cand, best_d, best_i)
                best_d = tl.where(take, dist, best_d)
                best_i = tl.where(take, cand, best_i)
                near = near & (groups[None, :] != pick[:, None])
            # A group whose second estimate lies within the window too: all its members, directly.
            for _ in range(0, tl.max(tl.sum(again.to(tl.int32), axis=1), axis=0)):
                pick = tl.min(tl.where(again, groups[None, :], GP), axis=1)
                ok = pick < GP
                for s in range(0, S):
                    member = tl.load(members_ptr + tl.where(ok, pick, 0) * S + s, mask=ok, other=-1).to(tl.int64)
                    has = ok & (member >= 0)
                    dist = _distance_to(xr, c_ptr, member, has, dims, dim_mask, d)
                    take = has & _better(dist, member, best_d, best_i)
                    best_d = tl.where(take, dist, best_d)
                    best_i = tl.where(take, member, best_i)
                again = again & (groups[None, :] != pick[:, None])
            moved = live & (best_i != own)
            # The new centroid's group: bounded by its second estimate where the winner was its
            # lowest (else by the lowest, which bounds every member); then the old centroid's
            # group takes the old centroid's distance.
            new_group = tl.load(group_of_ptr + best_i, mask=moved, other=0).to(tl.int64)
            old_group = tl.load(group_of_ptr + own, mask=moved, other=0).to(tl.int64)
            new_arg = tl.load(args_ptr + new_group * n + rows, mask=moved, other=-1)
            new_bound = tl.where(new_arg.to(tl.int64) == best_i,
                                 tl.load(second_ptr + new_group * n + rows, mask=moved, other=0.0),
                                 tl.load(bounds_ptr + new_group * n + rows, mask=moved, other=0.0))
            tl.store(bounds_ptr + new_group * n + rows, new_bound, mask=moved)
            old_bound = tl.load(bounds_ptr + old_group * n + rows, mask=moved, other=0.0)
            old_bound = tl.where(old_group == new_group, new_bound, old_bound)
            own_bound = tl.sqrt(own_sq) * (1.0 - 2.0**-22) + tl.load(drift32_ptr + old_group, mask=moved, other=0.0)
            tl.store(bounds_ptr + old_group * n + rows, tl.minimum(old_bound, own_bound), mask=moved)
            tl.store(labels_ptr + rows, best_i.to(labels_ptr.dtype.element_ty), mask=moved)
            tl.store(sq_dist_ptr + rows, best_d, mask=live)
            if HAS_WEIGHT:
                w = tl.load(weight_ptr + rows, mask=live, other=0.0)
            else:
                w = tl.where(live, 1.0, 0.0)
            inertia += tl.sum(tl.where(live, best_d * w, 0.0), axis=0)
            changed += tl.sum(moved.to(tl.int64), axis=0)
            if tl.sum(moved.to(tl.int32), axis=0) > 0:
                move_rows(sums_ptr, counts_ptr, best_i, own, w, moved, xr, dims, dim_mask, True, d)
    tl.store(part_inertia_ptr + part_base + pid, inertia)
    tl.store(part_changed_ptr + part_base + pid, changed)


class GroupBoundsEngine(BoundsEngine):
    """``prune.BoundsEngine`` with a lower bound per (row, group of centroids) instead of one per
    row (module docstring): a row that cannot settle searches only its groups that can still hold
    its nearest centroid, on tensor-core tiles bucketed by group. Same interface, same labels.

    After the full pass the engine works on a copy of the rows sorted by label (seed 000's
    reordering, for memory rather than warps): the rows that need a group then lie close together,
    so the search's row reads and the group-major bounds' writes are mostly coalesced. ``labels``
    stays in the caller's order (copied back after every pass)."""

    kernel = "pruned"
    warm_kind = "groups"
    relocates_on_device = False  # (not measured with the sorted copy: the torch relocation)
    dense_passes = False  # (a dense pass would take no group bounds)

    def __init__(self, x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor, *,
                 group_size: int = GROUP_SIZE, **kwargs):
        if group_size < 16 or group_size & (group_size - 1):
            raise ValueError(f"group_size must be a power of two of at least 16 (one tile), got {group_size}")
        if x.shape[1] > MAX_D:
            raise ValueError(f"the group bounds engine reads a row in one chunk: d <= {MAX_D}, got {x.shape[1]}")
        if math.ceil(centroids.shape[0] / group_size) > MAX_GROUPS:
            raise ValueError(f"at most {MAX_GROUPS} groups: k <= {MAX_GROUPS * group_size} for groups of {group_size}")
        super().__init__(x, centroids, labels, **kwargs)
        n, d = x.shape
        device = x.device
        self.group_size = group_size
        self.members, self.group_of = centroid_groups(self.c, group_size)
        G = self.members.shape[0]
        self.n_groups = G
        # Group-major: a group's bounds of consecutive (sorted) rows are consecutive.
        self.bounds = torch.empty(G, n, dtype=torch.float32, device=device)
        self.second = torch.empty(G, n, dtype=torch.float32, device=device)
        self.args = torch.empty(G, n, dtype=torch.int32, device=device)
        self.need = torch.empty(n, dtype=torch.int64, device=device)
        self.group_rows = torch.empty(G, max(1, n), dtype=torch.int32, device=device)
        # The rows sorted by label, and what goes with them.
        self.perm = torch.empty(n, dtype=torch.int64, device=device)
        self.sorted_labels = torch.empty(n, dtype=labels.dtype, device=device)
        self.x_sorted = torch.empty(n, d, dtype=x.dtype, device=device)
        self.sq_sorted = torch.empty(n, dtype=torch.float32, device=device)
        self.root_sorted = torch.empty(n, dtype=torch.float32, device=device)
        self.sorted_inputs = {name: None if t is None else torch.empty_like(t)
                              for name, t in (("row_scale", self.inputs["row_scale"]),
                                              ("sample_weight", self.inputs["sample_weight"]))}
        self.drift = torch.zeros(G, dtype=torch.float64, device=device)
        self.drift32 = torch.zeros(G, dtype=torch.float32, device=device)
        self.c_norm = torch.zeros(G, dtype=torch.float32, device=device)
        # [rows listed, (row, group) pairs, rows per group...]
        self.counters = torch.zeros(2 + G, dtype=torch.int32, device=device)
        self.group_settle_grid = triton.cdiv(n, SETTLE_BLOCK_N)
        self.finish_programs = num_persistent_programs(device)
        self.search_programs = num_persistent_programs(device)
        self.part_inertia = torch.zeros(self.group_settle_grid + self.finish_programs, dtype=torch.float32,
                                        device=device)
        self.part_changed = torch.zeros_like(self.part_inertia, dtype=torch.int64)
        self.coef = estimate_error_coefficient(d)
        self.margin = distance_margin(d)

    def restart(self, centroids: torch.Tensor, offset: torch.Tensor | None = None) -> None:
        super().restart(centroids, offset)
        members, group_of = centroid_groups(self.c, self.group_size)
        self.members.copy_(members)  # same k, so the same number of groups
        self.group_of.copy_(group_of)

    def _full_pass(self, has_prev: bool) -> None:
        super()._full_pass(has_prev)
        # The rows sorted by label; every group starts from the row's second-best distance: a
        # bound on every centroid but its own.
        torch.sort(self.labels, stable=True, out=(self.sorted_labels, self.perm))
        torch.index_select(self.x, 0, self.perm, out=self.x_sorted)
        torch.index_select(self.sq_dist, 0, self.perm, out=self.sq_sorted)
        for name, t in self.sorted_inputs.items():
            if t is not None:
                torch.index_select(self.inputs[name], 0, self.perm, out=t)
        torch.index_select(self.lower, 0, self.perm, out=self.root_sorted)
        self.root_sorted.sqrt_().mul_(1.0 - 2.0**-22)
        self.bounds.copy_(self.root_sorted[None, :].expand_as(self.bounds))
        self.drift.zero_()
        self.drift32.zero_()

    def _settle_pass(self) -> None:
        n, d = self.x.shape
        inp = self.inputs
        device = self.x.device
        G, S = self.n_groups, self.group_size
        block_d = min(64, max(16, triton.next_power_of_2(d)))
        flags = {"HAS_OFFSET": inp["offset"] is not None, "HAS_SCALE": inp["row_scale"] is not None}
        x = self.x_sorted

        def given(t: torch.Tensor | None) -> torch.Tensor:
            return unused(device) if t is None else t

        offset, scale, weight = (given(inp["offset"]), given(self.sorted_inputs["row_scale"]),
                                 given(self.sorted_inputs["sample_weight"]))
        launcher(_drift_kernel)[(G,)](
            self.c, self.c_old, self.members, self.drift, self.drift32, self.c_norm, self.counters, self.record,
            self.control, self.stats_prev, self.tol_device, self.counters.numel(), self.record.numel(), d, self.margin,
            S=S, BLOCK_D=block_d, CP=triton.next_power_of_2(max(self.counters.numel(), self.record.numel())),
        )
        gp = max(2, triton.next_power_of_2(G))
        launcher(_settle_kernel)[(self.group_settle_grid,)](
            x, self.c, offset, scale, weight, self.sorted_labels, self.sq_sorted,
            self.bounds, self.need, self.drift32, self.counters, self.group_rows, self.active_rows,
            self.part_inertia, self.control, n, d, G, x.stride(0), x.stride(1), self.margin,
            BLOCK_N=SETTLE_BLOCK_N, GP=gp, BLOCK_D=block_d, HAS_WEIGHT=inp["sample_weight"] is not None,
            num_warps=4, **flags,
        )
        launcher(_search_kernel)[(self.search_programs,)](
            x, self.c, offset, scale, self.sorted_labels, self.members, self.counters,
            self.group_rows, self.bounds, self.second, self.args, self.drift32, self.c_norm, self.control,
            n, d, G, x.stride(0), x.stride(1), self.coef,
            BLOCK_N=SEARCH_BLOCK_N, S=S, GP=gp, DP=max(16, triton.next_power_of_2(d)),
            num_warps=SEARCH_WARPS, **flags,
        )
        p = self.assign_pass
        launcher(_finish_kernel)[(self.finish_programs,)](
            x, self.c, offset, scale, weight, self.sorted_labels, self.sq_sorted,
            self.members, self.group_of, self.counters, self.active_rows, self.bounds, self.second, self.args, self.need,
            self.drift32, self.c_norm, p.move_sums, p.move_counts, self.part_inertia, self.part_changed,
            self.group_settle_grid, self.control, n, d, G, x.stride(0), x.stride(1), self.coef, self.margin,
            BLOCK_N=FINISH_BLOCK_N, S=S, GP=gp, DP=max(16, triton.next_power_of_2(d)),
            HAS_WEIGHT=inp["sample_weight"] is not None,
            num_warps=4, **flags,
        )
        # The caller's order (a frozen pass copies what it left unchanged).
        self.labels.index_copy_(0, self.perm, self.sorted_labels)
        finish_update(p.move_sums, p.move_counts, self.c, self.part_inertia, self.part_changed, self.record,
                      normalize=self.normalize, old_centroids=self.c_old, sums=self.sums, counts=self.counts,
                      control=self.control, tallies=(self.counters[0:1], self.counters[1:2]), record=self.recording)

    @property
    def sq_distances(self) -> torch.Tensor:
        """Each row's squared distance to its centroid of the last pass, in the caller's order."""
        if self._first:
            return self.sq_dist
        return torch.empty_like(self.sq_sorted).index_copy_(0, self.perm, self.sq_sorted)

    def centroids_changed(self) -> None:
        """Nothing to do: each pass takes the groups' moves from ``c_old`` to ``c`` as it starts."""

    def read(self, rows: int) -> list[list[float]]:
        values = self._read_log(rows)
        n, k = self.x.shape[0], self.c.shape[0]
        per_group = k / self.n_groups
        self.infos = []
        for row in values:
            pairs = row[5]
            if row is values[0] and self.pass_kinds and self.pass_kinds[0] == "full":
                self.infos.append(PassInfo(self.kernel, n * k, n * k, n, k))
                continue
            # (Tiles: a bucket's last tile is partial, at most one a group.)
            self.infos.append(PassInfo(self.kernel, pairs * per_group, pairs * self.group_size, n, k))
        self.info = self.infos[-1]
        return [row[:4] for row in values]
