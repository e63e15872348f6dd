"""Greedy k-means++ on the device: one centroid per step, with no host synchronisation.

A step of greedy k-means++ (scikit-learn's variant) draws ``trials`` candidate rows with
probability proportional to weight x D^2 (D^2: a row's squared distance to its nearest chosen
centroid), scores each candidate by the potential ``sum w * min(D^2, ||x - cand||^2)`` it would
leave, and keeps the best. Chosen one step at a time from the host, each step waited for the
host (the best candidate's index) and took about a dozen launches: on an H200 at 245,760 x 32,
k = 1024, 0.47 ms a step against 0.07 ms of GPU work (2026-11-23). Here every step is four
launches whose state stays on the device, so a CUDA graph of a few steps replays to the end:

- ``_sample_kernel`` (one program per trial) finds the row at which the cumulative weighted D^2
  first reaches ``u * total``, in two levels: the block of rows, from the blocks' sums, then the
  row inside the block. No pass over all rows.
- ``_gaps_kernel`` takes the squared distances between the centroids chosen so far and the
  trials (``gap``), and each centroid's smallest.
- ``_score_kernel`` (one program per block of rows) leaves alone the rows that no trial can come
  nearer to: by the triangle inequality, a trial at least twice a row's distance D from the row's
  nearest centroid is at least D from the row (with room for fp32 rounding, ``_margin``). It
  lists the other rows; for rows of many features it screens them with lower bounds from the
  tensor cores (``_screened_sq_distances``); the rows still listed get their exact distances to
  the trials, from the differences (exact 0 for a row equal to a candidate). It writes the block's
  weighted sum of each trial's potential.
- ``_choose_kernel`` (one program) sums the blocks' sums into each trial's potential (float64,
  in a fixed order: reruns choose alike), keeps the lowest (the first on ties), and records its
  row as the next centroid's and its potential as the next draws' total.

A row left alone would have taken its own D^2 as the minimum anyway, bit for bit, so the rows
chosen are those of computing every distance. Per row the state is D^2 (``closest``), the chosen
centroid at that distance (``owner``) and a word of the trials that came nearer in the last step,
whose distances alone are written (``sq``): the next step takes the chosen trial's. The uniforms
come from the caller, one row of ``trials`` per step, so a seed draws the same rows as the
pure-torch loop (up to floating-point ties).

How much is left alone depends on the data: on blobs with as many centres as centroids (the
benchmarks' data), about half the rows a step, since until every blob holds a centroid, the rows
of blobs without one are as far from their nearest centroid as from the trials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import capture, launcher, transform_rows, unused

__all__ = ["PlusPlus", "kmeans_plusplus", "kmeans_plusplus_reference"]

_INF = tl.constexpr(float("inf"))
# Below this D^2, subnormal squares would make the rounding of a distance absolute, not relative.
_TINY = tl.constexpr(1e-20)


@triton.jit
def _closest(rows, live, sq_ptr, closest_ptr, bits_ptr, best, n):
    """The rows' D^2 after the last choice (the chosen trial's distance where it came nearer,
    ``changed``), and their words of trials that came nearer (bit t: trial t's ``sq`` holds it)."""
    # All three loaded at once (``sq`` holds stale values where the word says so): masks taken
    # from the word would make the other two wait for it.
    word = tl.load(bits_ptr + rows, mask=live, other=0)
    now = tl.load(sq_ptr + best.to(tl.int64) * n + rows, mask=live, other=0.0)
    before = tl.load(closest_ptr + rows, mask=live, other=0.0)
    changed = ((word >> best) & 1) != 0
    return tl.where(changed, now, before), changed, word


@triton.jit
def _sample_kernel(
    sq_ptr, closest_ptr, bits_ptr, w_ptr, block_pot_ptr, total_ptr, uniforms_ptr, step_ptr, best_ptr, picked_ptr,
    n, n_blocks, m,
    BLOCK_ROWS: tl.constexpr, CHUNK_BLOCKS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    t = tl.program_id(0)
    step = tl.load(step_ptr)
    best = tl.load(best_ptr)
    u = tl.load(uniforms_ptr + step.to(tl.int64) * m + t)
    pots = block_pot_ptr + best.to(tl.int64) * n_blocks
    lanes = tl.arange(0, CHUNK_BLOCKS)
    target = u * tl.load(total_ptr)  # the best trial's potential, summed by ``_choose_kernel``
    # The first block whose cumulative sum reaches the target: as many blocks lie below it as have
    # cumulative sums under the target (the sums never decrease). ``base``: what those blocks hold.
    below = tl.zeros((), tl.int32)
    base = tl.zeros((), tl.float64)
    running = tl.zeros((), tl.float64)
    last = tl.zeros((), tl.int32)
    for b0 in range(0, n_blocks, CHUNK_BLOCKS):
        live = b0 + lanes < n_blocks
        v = tl.load(pots + b0 + lanes, mask=live, other=0.0)
        under = (running + tl.cumsum(v, axis=0) < target) & live
        below += tl.sum(under.to(tl.int32), axis=0)
        base += tl.sum(tl.where(under, v, 0.0), axis=0)
        running += tl.sum(v, axis=0)
        last = tl.maximum(last, tl.max(tl.where((v > 0) & live, b0 + lanes, 0), axis=0))
    # Rounding can leave the target above every cumulative sum: the last block that holds weight.
    past = below >= n_blocks
    block = tl.where(past, last, below).to(tl.int64)
    rows = block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = rows < n
    wv, _, _ = _closest(rows, live, sq_ptr, closest_ptr, bits_ptr, best, n)
    if HAS_WEIGHT:
        wv = wv * tl.load(w_ptr + rows, mask=live, other=0.0)
    wv = wv.to(tl.float64)
    inside = tl.where(past, live, tl.cumsum(wv, axis=0) < target - base)
    offset = tl.sum((inside & live).to(tl.int32), axis=0)
    last_row = tl.max(tl.where((wv > 0) & live, tl.arange(0, BLOCK_ROWS), 0), axis=0)
    n_live = tl.sum(live.to(tl.int32), axis=0)
    offset = tl.where(offset < n_live, offset, last_row)
    tl.store(picked_ptr + t, block * BLOCK_ROWS + offset)


@triton.jit
def _trial_sq_distances(x_ptr, offset_ptr, scale_ptr, picked_ptr, rows, row_mask, d, stride_xn, stride_xd,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M: tl.constexpr, MP: tl.constexpr,
                        HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    """(BLOCK_N x MP) squared distances of the rows ``rows`` (int64) to the M trials' rows, from the
    differences in fp32 (exactly 0 between equal rows). Every distance of this module is taken here,
    so the triangle-inequality test of ``_score_kernel`` compares like with like."""
    trials = tl.arange(0, MP)
    scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else row_mask.to(tl.float32)
    # Every trial's partial sums, chunk by chunk, in one (rows x trials) accumulator: each chunk of
    # the rows is read once. (Whole rows in one tile, each trial's distances taken from it in turn,
    # measured slower at 32,768 x 256 and 1M x 128 on an H200.)
    acc = tl.zeros((BLOCK_N, MP), tl.float32)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dim_mask = dims < d
        shift = tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0)
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                    mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
            row_mask, shift, scale, HAS_OFFSET, HAS_SCALE)
        for j in tl.static_range(M):
            trial_row = tl.load(picked_ptr + j)
            c = tl.load(x_ptr + trial_row * stride_xn + dims * stride_xd, mask=dim_mask, other=0.0).to(tl.float32)
            if HAS_OFFSET:
                c = tl.where(dim_mask, c - shift, 0.0)
            if HAS_SCALE:
                c = c * tl.load(scale_ptr + trial_row)
            diff = tl.where(dim_mask[None, :], xr - c[None, :], 0.0)
            acc = tl.where(trials[None, :] == j, acc + tl.sum(diff * diff, axis=1)[:, None], acc)
    return acc


@triton.jit
def _screened_sq_distances(x_ptr, offset_ptr, scale_ptr, picked_ptr, rows, row_mask, d, m, stride_xn, stride_xd,
                           slack, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MP: tl.constexpr,
                           HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    """(BLOCK_N x MP) lower bounds of the squared distances to the trials: ||x||^2 + ||c||^2 - 2 x.c
    with the product on the tensor cores (tf32), less ``slack`` (``_screen_slack``) times the norms,
    which covers the product's rounding. Where the bound reaches D^2, so does the exact distance."""
    trials = tl.arange(0, MP)
    trial_live = trials < m
    cand = tl.load(picked_ptr + trials, mask=trial_live, other=0)
    scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else row_mask.to(tl.float32)
    cand_scale = tl.load(scale_ptr + cand, mask=trial_live, other=1.0) if HAS_SCALE else trial_live.to(tl.float32)
    dot = tl.zeros((BLOCK_N, MP), tl.float32)
    row_sq = tl.zeros((BLOCK_N,), tl.float32)
    cand_sq = tl.zeros((MP,), tl.float32)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        dim_mask = dims < d
        shift = tl.load(offset_ptr + dims, mask=dim_mask & HAS_OFFSET, other=0.0)
        xr = transform_rows(
            tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                    mask=row_mask[:, None] & dim_mask[None, :], other=0.0),
            row_mask, shift, scale, HAS_OFFSET, HAS_SCALE)
        c = transform_rows(
            tl.load(x_ptr + cand[:, None] * stride_xn + dims[None, :] * stride_xd,
                    mask=trial_live[:, None] & dim_mask[None, :], other=0.0),
            trial_live, shift, cand_scale, HAS_OFFSET, HAS_SCALE)
        dot = tl.dot(xr, tl.trans(c), dot, input_precision="tf32")
        row_sq += tl.sum(xr * xr, axis=1)
        cand_sq += tl.sum(c * c, axis=1)
    norms = row_sq[:, None] + cand_sq[None, :]
    return norms - 2.0 * dot - slack * norms


@triton.jit
def _gaps_kernel(
    x_ptr, offset_ptr, scale_ptr, picked_ptr, chosen_ptr, step_ptr, gap_ptr, gap_min_ptr,
    d, m, stride_xn, stride_xd,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M: tl.constexpr, MP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    """Squared distances between the centroids chosen so far and this step's trials: ``gap[j, t]``
    and, per centroid, the smallest over the trials."""
    j0 = tl.program_id(0) * BLOCK_N
    step = tl.load(step_ptr)
    if j0 < step:
        js = j0 + tl.arange(0, BLOCK_N)
        live = js < step
        rows = tl.load(chosen_ptr + js, mask=live, other=0)
        acc = _trial_sq_distances(x_ptr, offset_ptr, scale_ptr, picked_ptr, rows, live, d, stride_xn, stride_xd,
                                  BLOCK_N, BLOCK_D, M, MP, HAS_OFFSET, HAS_SCALE)
        trials = tl.arange(0, MP)
        out = live[:, None] & (trials < m)[None, :]
        tl.store(gap_ptr + js[:, None].to(tl.int64) * MP + trials[None, :], acc, mask=out)
        tl.store(gap_min_ptr + js, tl.min(tl.where(out, acc, _INF), axis=1), mask=live)


@triton.jit
def _settled(closest, gap, margin):
    """Whether no trial at squared distance ``gap`` from a row's nearest centroid can come nearer
    to the row than its ``closest`` (D^2): the triangle inequality (``gap >= 4 D^2``) with room
    for fp32 rounding (``margin``, see ``_margin``). A row already on a centroid (D^2 = 0) always
    is; tiny D^2 (where rounding is no longer relative) and infinite ones never are."""
    bound = closest * margin
    return (closest == 0.0) | ((gap >= bound) & (bound < _INF) & (closest > _TINY))


@triton.jit
def _score_kernel(
    x_ptr, offset_ptr, scale_ptr, w_ptr, picked_ptr, best_ptr, step_ptr, sq_ptr, block_pot_ptr,
    closest_ptr, owner_ptr, bits_ptr, gap_ptr, gap_min_ptr, list_ptr, listed_ptr, recomputed_ptr,
    n, d, n_blocks, m, stride_xn, stride_xd, margin, slack, screen_margin,
    BLOCK_ROWS: tl.constexpr, SCAN_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    M: tl.constexpr, MP: tl.constexpr, SCREEN: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_CLOSEST: tl.constexpr,
):
    block = tl.program_id(0).to(tl.int64)
    base = block * BLOCK_ROWS
    step = tl.load(step_ptr)
    best = tl.load(best_ptr)
    trials = tl.arange(0, MP)
    trial_live = trials < m
    pot = tl.zeros((MP,), tl.float64)
    kept = tl.zeros((), tl.float64)  # the weighted D^2 of rows that every trial leaves as they are
    count = tl.zeros((), tl.int32)
    # Pass 1, over the block's rows in order: bring D^2 and the nearest centroid up to date with
    # the last choice, keep the rows that no trial can change as they are, and list the others.
    for r0 in range(0, BLOCK_ROWS, SCAN_N):
        rows = base + r0 + tl.arange(0, SCAN_N)
        row_mask = rows < n
        if HAS_CLOSEST:
            closest, changed, word = _closest(rows, row_mask, sq_ptr, closest_ptr, bits_ptr, best, n)
            tl.store(closest_ptr + rows, closest, mask=changed)
            tl.store(owner_ptr + rows, step - 1, mask=changed)
            owner = tl.where(changed, step - 1, tl.load(owner_ptr + rows, mask=row_mask & ~changed, other=0))
            settled = _settled(closest, tl.load(gap_min_ptr + owner, mask=row_mask, other=0.0), margin) & row_mask
            wv = tl.load(w_ptr + rows, mask=settled, other=0.0) if HAS_WEIGHT else settled.to(tl.float32)
            kept += tl.sum(tl.where(settled, closest * wv, 0.0).to(tl.float64), axis=0)
            # A word left set would claim this step's ``sq`` for the next draws: cleared (listed
            # rows get their new word below).
            tl.store(bits_ptr + rows, tl.zeros((SCAN_N,), tl.int32), mask=settled & (word != 0))
            listed = row_mask & ~settled
        else:
            listed = row_mask
        at = count + tl.cumsum(listed.to(tl.int32), axis=0) - 1
        tl.store(list_ptr + base + at, rows.to(list_ptr.dtype.element_ty), mask=listed)
        count += tl.sum(listed.to(tl.int32), axis=0)
    # The list, D^2 and the nearest centroids were stored by other threads of this program.
    tl.debug_barrier()
    n_exact = count
    if SCREEN and HAS_CLOSEST:
        # Pass 2, over the listed rows: lower bounds of their distances to the trials from the
        # tensor cores. Rows that no trial can come nearer to are kept as they are; the others
        # stay listed (compacted in place: a row never moves past the tile being read).
        n_exact = tl.zeros((), tl.int32)
        for i0 in range(0, count, BLOCK_N):
            lanes = i0 + tl.arange(0, BLOCK_N)
            live = lanes < count
            rows = tl.load(list_ptr + base + lanes, mask=live, other=0, cache_modifier=".cg").to(tl.int64)
            closest = tl.load(closest_ptr + rows, mask=live, other=0.0, cache_modifier=".cg")
            owner = tl.load(owner_ptr + rows, mask=live, other=0, cache_modifier=".cg")
            out = live[:, None] & trial_live[None, :]
            gap = tl.load(gap_ptr + owner[:, None].to(tl.int64) * MP + trials[None, :], mask=out, other=0.0)
            lower = _screened_sq_distances(x_ptr, offset_ptr, scale_ptr, picked_ptr, rows, live, d, m,
                                           stride_xn, stride_xd, slack, BLOCK_N, BLOCK_D, MP,
                                           HAS_OFFSET, HAS_SCALE)
            sure = _settled(closest[:, None], gap, margin) | (lower >= closest[:, None] * screen_margin)
            exact = live & (tl.sum((out & ~sure).to(tl.int32), axis=1) > 0)
            done = live & ~exact
            wv = tl.load(w_ptr + rows, mask=done, other=0.0) if HAS_WEIGHT else done.to(tl.float32)
            kept += tl.sum(tl.where(done, closest * wv, 0.0).to(tl.float64), axis=0)
            tl.store(bits_ptr + rows, tl.zeros((BLOCK_N,), tl.int32), mask=done)
            at = n_exact + tl.cumsum(exact.to(tl.int32), axis=0) - 1
            tl.store(list_ptr + base + at, rows.to(list_ptr.dtype.element_ty), mask=exact)
            n_exact += tl.sum(exact.to(tl.int32), axis=0)
        tl.debug_barrier()
    # Pass 3, over the rows still listed: their exact distances to the trials. (Where a trial
    # was settled, the exact minimum is D^2 itself.)
    for i0 in range(0, n_exact, BLOCK_N):
        lanes = i0 + tl.arange(0, BLOCK_N)
        live = lanes < n_exact
        rows = tl.load(list_ptr + base + lanes, mask=live, other=0, cache_modifier=".cg").to(tl.int64)
        out = live[:, None] & trial_live[None, :]
        acc = _trial_sq_distances(x_ptr, offset_ptr, scale_ptr, picked_ptr, rows, live, d, stride_xn, stride_xd,
                                  BLOCK_N, BLOCK_D, M, MP, HAS_OFFSET, HAS_SCALE)
        if HAS_CLOSEST:
            closest = tl.load(closest_ptr + rows, mask=live, other=0.0, cache_modifier=".cg")
            new = tl.minimum(acc, closest[:, None])
            nearer = out & (new < closest[:, None])
        else:
            new = acc
            nearer = out
        # Only the trials that came nearer: D^2 elsewhere stays in ``closest``.
        tl.store(sq_ptr + trials[None, :].to(tl.int64) * n + rows[:, None], new, mask=nearer)
        tl.store(bits_ptr + rows, tl.sum(tl.where(nearer, 1 << trials[None, :], 0), axis=1), mask=live)
        wv = tl.load(w_ptr + rows, mask=live, other=0.0) if HAS_WEIGHT else live.to(tl.float32)
        pot += tl.sum(tl.where(out, new * wv[:, None], 0.0).to(tl.float64), axis=0)
    tl.store(block_pot_ptr + trials.to(tl.int64) * n_blocks + block, pot + kept, mask=trial_live)
    # Per block, over the steps (each program its own slot: atomics on one counter per step, from
    # every program, would queue).
    tl.store(listed_ptr + block, tl.load(listed_ptr + block) + count.to(tl.int64))
    tl.store(recomputed_ptr + block, tl.load(recomputed_ptr + block) + n_exact.to(tl.int64))


@triton.jit
def _choose_kernel(
    block_pot_ptr, picked_ptr, best_ptr, total_ptr, step_ptr, rows_ptr, n_blocks, m,
    MP: tl.constexpr, CHUNK_BLOCKS: tl.constexpr,
):
    trials = tl.arange(0, MP)
    trial_live = trials < m
    lanes = tl.arange(0, CHUNK_BLOCKS)
    pots = tl.zeros((MP,), tl.float64)
    for b0 in range(0, n_blocks, CHUNK_BLOCKS):
        cols = b0 + lanes
        pots += tl.sum(tl.load(block_pot_ptr + trials[:, None].to(tl.int64) * n_blocks + cols[None, :],
                               mask=trial_live[:, None] & (cols < n_blocks)[None, :], other=0.0), axis=1)
    pots = tl.where(trial_live, pots, _INF)
    lowest = tl.min(pots, axis=0)
    best = tl.min(tl.where(pots == lowest, trials, MP), axis=0)
    best = tl.minimum(best, m - 1)  # all potentials NaN (never for finite rows): the last trial
    tl.store(best_ptr, best)
    tl.store(total_ptr, lowest)
    step = tl.load(step_ptr)
    tl.store(rows_ptr + step, tl.load(picked_ptr + best))
    tl.store(step_ptr, step + 1)


def _screen_slack(d: int) -> tuple[float, float]:
    """``(slack, factor)`` for the tensor-core screen: its bound on a squared distance is
    ``||x||^2 + ||c||^2 - 2 x.c - slack (||x||^2 + ||c||^2)``, and it settles a pair where the bound
    is at least ``factor`` D^2.

    tf32 operands keep 10 bits (truncated on Hopper: relative error below 2^-10 each), so each
    product is within 2^-9 of the fp32 one and the dot product within about 2^-9 sum |x_i c_i| <=
    2^-10 (||x||^2 + ||c||^2) of it, with fp32 accumulation adding gamma = (d + 4) 2^-24 of the
    same; the norms are within gamma. ``slack`` = 2^-7 + 4 gamma leaves a factor of 2 or more.
    The exact distance, rounded in fp32 (relative gamma), is then at least D^2 when the bound is at
    least ``factor`` = 1 + 4 gamma times it.
    """
    gamma = (d + 4) * 2.0 ** -24
    return 2.0 ** -7 + 4.0 * gamma, 1.0 + 4.0 * gamma


def _margin(d: int) -> float:
    """``4 (1 + mu)``: the factor by which a gap must exceed D^2 for ``_settled``.

    Computed in fp32, a squared distance over d features is within gamma = (d + 4) u (u = 2^-24)
    of the distance between the fp32 rows, relatively, whatever the order of the sums. If the
    computed gap is at least 4 (1 + mu) D^2 with mu = 8 gamma, the true distances then give
    ||x - c|| >= ||c - a|| - ||x - a|| >= (1 + 3 gamma) ||x - a||, and the computed ||x - c||^2 is
    at least the computed D^2: the minimum the kernel would have taken is D^2 itself, bit for bit.
    """
    gamma = (d + 4) * 2.0 ** -24
    return 4.0 * (1.0 + 8.0 * gamma)


def _block_rows(n: int, device: torch.device) -> int:
    """Rows per block: about 16 blocks per SM, whose programs hide each other's load latency (on
    an H200 at 1M x 128 and 1M x 768, blocks of 64-256 rows scored in 0.35-0.45 and 1.4-1.6 ms,
    of 2048 rows in 0.41-0.55 and 1.8-2.0 ms), and few enough that one program sums them quickly."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 128
    return max(64, min(4096, triton.next_power_of_2(triton.cdiv(n, 16 * sms))))


class PlusPlus:
    """Greedy k-means++ of the rows ``(x - offset) * row_scale`` with its state on the device.

    ``uniforms`` (n_clusters, trials) float64 in [0, 1): row s holds step s's draws (row 0 unused).
    ``start(first_row)`` takes row ``first_row`` (a (1,) int64 tensor) as the first centroid;
    ``steps(count)`` chooses the next ``count``. ``rows`` (int64, (n_clusters,)) holds the chosen
    rows' indices, in order. ``rows_read()`` is how many rows the steps after the first read (the
    others were settled by the triangle inequality), ``rows_recomputed()`` how many of those got
    exact distances (the others were settled by the tensor-core screen). ``screen`` (default:
    wide rows, many of them) turns the screen on or off; ``block_rows`` and ``block_n`` override
    the tiles (tests, ``scripts/diag_init.py``).
    """

    def __init__(self, x: torch.Tensor, n_clusters: int, uniforms: torch.Tensor, *, offset: torch.Tensor | None = None,
                 row_scale: torch.Tensor | None = None, sample_weight: torch.Tensor | None = None,
                 block_rows: int | None = None, block_n: int | None = None, screen: bool | None = None) -> None:
        n, d = x.shape
        device = x.device
        self.x, self.n, self.d, self.n_clusters = x, n, d, n_clusters
        self.trials = uniforms.shape[1]
        if self.trials > 30:
            raise ValueError(f"at most 30 trials a step (one bit each in a word per row), got {self.trials}")
        self.uniforms = uniforms.to(device, torch.float64).contiguous()
        self.offset = None if offset is None else offset.to(device, torch.float32).contiguous()
        self.row_scale = None if row_scale is None else row_scale.to(device, torch.float32).contiguous()
        self.weight = None if sample_weight is None else sample_weight.to(device, torch.float32).contiguous()
        self.block_rows = block_rows or _block_rows(n, device)
        self.n_blocks = triton.cdiv(n, self.block_rows)
        # The tensor-core screen pays where a row's exact distances cost more than reading it.
        self.screen = d >= _SCREEN_FEATURES and n >= _SCREEN_ROWS if screen is None else screen
        self.mp = max(16 if self.screen else 2, triton.next_power_of_2(self.trials))
        self.rows = torch.zeros(n_clusters, dtype=torch.int64, device=device)
        self.listed = torch.zeros(self.n_blocks, dtype=torch.int64, device=device)
        self.recomputed = torch.zeros(self.n_blocks, dtype=torch.int64, device=device)
        # Per row: D^2, the chosen centroid at that distance, and the word of this step's trials that
        # came nearer, whose distances alone are stored in ``sq`` (trials x rows).
        self.closest = torch.empty(n, dtype=torch.float32, device=device)
        self.owner = torch.zeros(n, dtype=torch.int32, device=device)
        self.bits = torch.zeros(n, dtype=torch.int32, device=device)
        self.sq = torch.empty(self.trials, n, dtype=torch.float32, device=device)
        # Each block's listed rows (rows no trial is sure to leave alone), in the block's slots.
        self.row_list = torch.empty(n, dtype=torch.int32 if n < 2**31 else torch.int64, device=device)
        # Squared distances from each chosen centroid to the step's trials, and their minimum.
        self.gap = torch.empty(n_clusters, self.mp, dtype=torch.float32, device=device)
        self.gap_min = torch.empty(n_clusters, dtype=torch.float32, device=device)
        self.margin = _margin(d)
        self.slack, self.screen_margin = _screen_slack(d)
        self.block_pot = torch.zeros(self.trials, self.n_blocks, dtype=torch.float64, device=device)
        self.picked = torch.zeros(self.trials, dtype=torch.int64, device=device)
        self.best = torch.zeros(1, dtype=torch.int32, device=device)
        self.total = torch.zeros(1, dtype=torch.float64, device=device)  # the best trial's potential
        self.step = torch.zeros(1, dtype=torch.int32, device=device)
        # Tiles of 32 listed rows: a block's list is short once most rows are settled. H200, whole
        # runs (scripts/diag_init.py --configs): 245,760 x 32 x 1024 42 ms against 55 with 128-row
        # tiles; 32,768 x 256 x 8192 0.32 s against 0.41 with 64; 1M x 768 bf16 screened 6.8 s
        # against 7.0 with 64 and 9.1 with 16.
        self.block_d = max(16 if self.screen else 1, min(64, triton.next_power_of_2(d)))  # tl.dot: K >= 16
        self.num_warps = 4
        self.block_n = min(self.block_rows, block_n or 32)
        # The gaps: few centroids a program and wide chunks, so that a program's chain of loads is
        # short (with 32 centroids and 64-feature chunks, 29 us a step at 1M x 768 while the first
        # few dozen centroids were chosen, on an H200).
        self.gap_block_d = max(self.block_d, min(128, triton.next_power_of_2(d)))
        self.scan_n = min(self.block_rows, 512)
        self.chunk_blocks = min(1024, max(16, triton.next_power_of_2(self.n_blocks)))
        self._flags = dict(HAS_OFFSET=self.offset is not None, HAS_SCALE=self.row_scale is not None)
        self._unused = [unused(device) for _ in range(4)]

    def rows_read(self) -> int:
        """Rows read by the steps after the first (which reads them all), summed over the steps."""
        return int(self.listed.sum()) - self.n

    def rows_recomputed(self) -> int:
        """Rows whose exact distances the steps after the first took, summed over the steps."""
        return int(self.recomputed.sum()) - self.n

    def _score(self, m: int, has_closest: bool) -> None:
        launcher(_score_kernel)[(self.n_blocks,)](
            self.x, self.offset if self.offset is not None else self._unused[0],
            self.row_scale if self.row_scale is not None else self._unused[1],
            self.weight if self.weight is not None else self._unused[2],
            self.picked, self.best, self.step, self.sq, self.block_pot,
            self.closest, self.owner, self.bits, self.gap, self.gap_min, self.row_list, self.listed, self.recomputed,
            self.n, self.d, self.n_blocks, m, self.x.stride(0), self.x.stride(1), self.margin, self.slack,
            self.screen_margin,
            BLOCK_ROWS=self.block_rows, SCAN_N=self.scan_n, BLOCK_N=self.block_n, BLOCK_D=self.block_d,
            M=m, MP=self.mp, SCREEN=self.screen, HAS_WEIGHT=self.weight is not None, HAS_CLOSEST=has_closest,
            num_warps=self.num_warps, **self._flags,
        )

    def _gaps(self) -> None:
        launcher(_gaps_kernel)[(triton.cdiv(self.n_clusters, _GAP_ROWS),)](
            self.x, self.offset if self.offset is not None else self._unused[0],
            self.row_scale if self.row_scale is not None else self._unused[1],
            self.picked, self.rows, self.step, self.gap, self.gap_min,
            self.d, self.trials, self.x.stride(0), self.x.stride(1),
            BLOCK_N=_GAP_ROWS, BLOCK_D=self.gap_block_d, M=self.trials, MP=self.mp,
            num_warps=self.num_warps, **self._flags,
        )

    def _choose(self, m: int) -> None:
        launcher(_choose_kernel)[(1,)](
            self.block_pot, self.picked, self.best, self.total, self.step, self.rows, self.n_blocks, m,
            MP=self.mp, CHUNK_BLOCKS=self.chunk_blocks, num_warps=8,
        )

    def start(self, first_row: torch.Tensor) -> None:
        self.picked[:1].copy_(first_row.reshape(1))
        self.step.zero_()
        self.best.zero_()
        self.listed.zero_()
        self.recomputed.zero_()
        self.closest.fill_(float("inf"))
        self._score(1, has_closest=False)
        self._choose(1)

    def steps(self, count: int) -> None:
        for _ in range(count):
            launcher(_sample_kernel)[(self.trials,)](
                self.sq, self.closest, self.bits, self.weight if self.weight is not None else self._unused[3],
                self.block_pot, self.total, self.uniforms,
                self.step, self.best, self.picked, self.n, self.n_blocks, self.trials,
                BLOCK_ROWS=self.block_rows, CHUNK_BLOCKS=self.chunk_blocks, HAS_WEIGHT=self.weight is not None,
                num_warps=4,
            )
            self._gaps()
            self._score(self.trials, has_closest=True)
            self._choose(self.trials)



# Chosen centroids a program of ``_gaps_kernel``.
_GAP_ROWS = 16

# Rows of at least this many features, this many of them, are screened on the tensor cores before
# their exact distances. H200, whole k-means++ runs on blobs (scripts/diag_init.py --configs,
# 2026-11-23): at 1M x 768 bf16, k = 8192, 6.8 s screened against 8.5 s not; at d = 32-128 the screen
# recomputed 1-2 % of the rows instead of 50 % but took longer (245,760 x 32 x 1024 67 against 42 ms,
# 1M x 128 x 4096 1.19 against 1.07 s), and so it did on 80,000 x 768 (k-means||'s pool for k = 8192:
# 2.46 against 1.34 s). There the exact distances cost little more than the screen's own pass.
_SCREEN_FEATURES = 512
_SCREEN_ROWS = 1 << 19

# Steps per captured CUDA graph: a capture costs the host about as much as a few eager steps.
_GRAPH_STEPS = 16


def kmeans_plusplus(
    x: torch.Tensor,
    n_clusters: int,
    first_row: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
    graphs: bool = False,
    block_rows: int | None = None,
    block_n: int | None = None,
    screen: bool | None = None,
) -> torch.Tensor:
    """Greedy k-means++ (module docstring): the indices (int64, (n_clusters,)) of the rows chosen
    as centroids, in order. ``graphs``: replay the steps as CUDA graphs (CUDA only; the host then
    issues one graph per ``_GRAPH_STEPS`` steps). ``screen``, ``block_rows`` and ``block_n``:
    as ``PlusPlus``'s (each choice picks the same rows)."""
    state = PlusPlus(x, n_clusters, uniforms, offset=offset, row_scale=row_scale, sample_weight=sample_weight,
                     block_rows=block_rows, block_n=block_n, screen=screen)
    state.start(first_row)
    remaining = n_clusters - 1
    if remaining:
        state.steps(1)  # compiles the kernels before any capture
        remaining -= 1
    if graphs and remaining >= 2 * _GRAPH_STEPS:
        graph = capture(lambda: state.steps(_GRAPH_STEPS), x.device)
        for _ in range(remaining // _GRAPH_STEPS):
            graph.replay()
        remaining %= _GRAPH_STEPS
    state.steps(remaining)
    return state.rows


def kmeans_plusplus_reference(
    x: torch.Tensor,
    n_clusters: int,
    first_row: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch reference of ``kmeans_plusplus``: one cumulative sum over all rows per step.

    Squared distances in float32 from the differences, as the kernel takes them (else which row a
    draw lands on would differ wherever the cumulative sum passes a row boundary within float32's
    rounding: about n * 1e-7 of the draws); sums and potentials in float64.
    """
    rows = x.float()
    if offset is not None:
        rows = rows - offset.float()
    if row_scale is not None:
        rows = rows * row_scale.float()[:, None]
    n = rows.shape[0]
    w = torch.ones(n, dtype=torch.float32, device=x.device) if sample_weight is None else sample_weight.float()
    chosen = [int(first_row.reshape(-1)[0])]
    closest = ((rows - rows[chosen[0]]) ** 2).sum(1)
    for step in range(1, n_clusters):
        cumulative = torch.cumsum((closest * w).double(), 0)
        picked = torch.searchsorted(cumulative, uniforms[step].double().to(x.device) * cumulative[-1]).clamp_max_(n - 1)
        cand = torch.minimum(((rows[:, None, :] - rows[picked][None, :, :]) ** 2).sum(-1), closest[:, None])
        best = int(torch.argmin((cand * w[:, None]).double().sum(0)))
        chosen.append(int(picked[best]))
        closest = cand[:, best]
    return torch.tensor(chosen, dtype=torch.int64, device=x.device)
