"""Greedy k-means++ on the device: one centroid per step, with no host synchronisation.

A step of greedy k-means++ (scikit-learn's variant) draws ``trials`` candidate rows with
probability proportional to weight x D^2 (D^2: a row's squared distance to its nearest chosen
centroid), scores each candidate by the potential ``sum w * min(D^2, ||x - cand||^2)`` it would
leave, and keeps the best. Chosen one step at a time from the host, each step waited for the
host (the best candidate's index) and took about a dozen launches: on an H200 at 245,760 x 32,
k = 1024, 0.47 ms a step against 0.07 ms of GPU work (2026-11-23). Here every step is three
launches whose state stays on the device, so a CUDA graph of a few steps replays to the end:

- ``_sample_kernel`` (one program per trial) finds the row at which the cumulative weighted D^2
  first reaches ``u * total``, in two levels: the block of rows, from the blocks' sums, then the
  row inside the block. No pass over all rows.
- ``_score_kernel`` (one program per block of rows) takes each row's squared distances to the
  trials' rows (from the differences, as ``distances.py``: exact 0 for a row equal to a
  candidate), keeps the minimum with its D^2 as that trial's D^2 (``sq[trial, row]``), and writes
  the block's weighted sum of each.
- ``_choose_kernel`` (one program) sums the blocks' sums into each trial's potential (float64,
  in a fixed order: reruns choose alike), keeps the lowest (the first on ties), and records its
  row as the next centroid's and its potential as the next draws' total.

D^2 itself is the chosen trial's row of ``sq`` (``best``): nothing is copied between steps. The
uniforms come from the caller, one row of ``trials`` per step, so a seed draws the same rows as
the pure-torch loop (up to floating-point ties).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import capture, launcher, transform_rows, unused

__all__ = ["PlusPlus", "kmeans_plusplus", "kmeans_plusplus_reference"]

_INF = tl.constexpr(float("inf"))


@triton.jit
def _sample_kernel(
    sq_ptr, w_ptr, block_pot_ptr, total_ptr, uniforms_ptr, step_ptr, best_ptr, picked_ptr,
    n, n_blocks, m,
    BLOCK_ROWS: tl.constexpr, CHUNK_BLOCKS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):
    t = tl.program_id(0)
    step = tl.load(step_ptr)
    best = tl.load(best_ptr).to(tl.int64)
    u = tl.load(uniforms_ptr + step.to(tl.int64) * m + t)
    pots = block_pot_ptr + best * n_blocks
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
    wv = tl.load(sq_ptr + best * n + rows, mask=live, other=0.0)
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
def _candidate(x_ptr, scale_ptr, picked_ptr, j, dims, dim_mask, shift, stride_xn, stride_xd,
               HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    """Trial ``j``'s row, transformed, over the features ``dims``."""
    row = tl.load(picked_ptr + j)
    c = tl.load(x_ptr + row * stride_xn + dims * stride_xd, mask=dim_mask, other=0.0).to(tl.float32)
    if HAS_OFFSET:
        c = tl.where(dim_mask, c - shift, 0.0)
    if HAS_SCALE:
        c = c * tl.load(scale_ptr + row)
    return c


@triton.jit
def _score_kernel(
    x_ptr, offset_ptr, scale_ptr, w_ptr, picked_ptr, best_ptr, sq_ptr, block_pot_ptr,
    n, d, n_blocks, m, stride_xn, stride_xd,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M: tl.constexpr, MP: tl.constexpr,
    HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_CLOSEST: tl.constexpr,
):
    block = tl.program_id(0).to(tl.int64)
    trials = tl.arange(0, MP)
    trial_live = trials < m
    pot = tl.zeros((MP,), tl.float64)
    best = tl.load(best_ptr).to(tl.int64)
    for r0 in range(0, BLOCK_ROWS, BLOCK_N):
        rows = block * BLOCK_ROWS + r0 + tl.arange(0, BLOCK_N)
        row_mask = rows < n
        scale = tl.load(scale_ptr + rows, mask=row_mask, other=1.0) if HAS_SCALE else row_mask.to(tl.float32)
        wv = tl.load(w_ptr + rows, mask=row_mask, other=0.0) if HAS_WEIGHT else row_mask.to(tl.float32)
        # Read before this tile's stores overwrite it: the best trial's row is D^2.
        closest = tl.load(sq_ptr + best * n + rows, mask=row_mask & HAS_CLOSEST, other=float("inf"))
        # Every trial's partial sums, chunk by chunk, in one (rows x trials) accumulator: each chunk
        # of the rows is read once. (Whole rows in one tile, each trial's distances taken from it
        # in turn, measured slower at 32,768 x 256 and 1M x 128 on an H200.)
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
                c = _candidate(x_ptr, scale_ptr, picked_ptr, j, dims, dim_mask, shift, stride_xn, stride_xd,
                               HAS_OFFSET, HAS_SCALE)
                diff = tl.where(dim_mask[None, :], xr - c[None, :], 0.0)
                acc = tl.where(trials[None, :] == j, acc + tl.sum(diff * diff, axis=1)[:, None], acc)
        acc = tl.minimum(acc, closest[:, None])
        out_mask = row_mask[:, None] & trial_live[None, :]
        tl.store(sq_ptr + trials[None, :].to(tl.int64) * n + rows[:, None], acc, mask=out_mask)
        pot += tl.sum(tl.where(out_mask, acc * wv[:, None], 0.0).to(tl.float64), axis=0)
    tl.store(block_pot_ptr + trials.to(tl.int64) * n_blocks + block, pot, mask=trial_live)


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
    rows' indices, in order. ``block_rows`` and ``block_n`` override the tiles (tests,
    ``scripts/diag_init.py``).
    """

    def __init__(self, x: torch.Tensor, n_clusters: int, uniforms: torch.Tensor, *, offset: torch.Tensor | None = None,
                 row_scale: torch.Tensor | None = None, sample_weight: torch.Tensor | None = None,
                 block_rows: int | None = None, block_n: int | None = None) -> None:
        n, d = x.shape
        device = x.device
        self.x, self.n, self.d = x, n, d
        self.trials = uniforms.shape[1]
        self.uniforms = uniforms.to(device, torch.float64).contiguous()
        self.offset = None if offset is None else offset.to(device, torch.float32).contiguous()
        self.row_scale = None if row_scale is None else row_scale.to(device, torch.float32).contiguous()
        self.weight = None if sample_weight is None else sample_weight.to(device, torch.float32).contiguous()
        self.block_rows = block_rows or _block_rows(n, device)
        self.n_blocks = triton.cdiv(n, self.block_rows)
        self.rows = torch.zeros(n_clusters, dtype=torch.int64, device=device)
        self.sq = torch.empty(self.trials, n, dtype=torch.float32, device=device)
        self.block_pot = torch.zeros(self.trials, self.n_blocks, dtype=torch.float64, device=device)
        self.picked = torch.zeros(self.trials, dtype=torch.int64, device=device)
        self.best = torch.zeros(1, dtype=torch.int32, device=device)
        self.total = torch.zeros(1, dtype=torch.float64, device=device)  # the best trial's potential
        self.step = torch.zeros(1, dtype=torch.int32, device=device)
        self.mp = max(2, triton.next_power_of_2(self.trials))
        # About 4096 values a tile of rows, 32 a thread; for rows of 65-128 features (two chunks)
        # half that. H200, a step's launches: 1M x 128, 0.39 ms with 32-row tiles against 0.48 with
        # 64; 1M x 768 (bf16), 1.41 ms with 64-row tiles against 1.62 with 32 (scripts/diag_init.py --tiles).
        self.block_d = min(64, triton.next_power_of_2(d))
        self.num_warps = 4
        values = 2048 if 64 < d <= 128 else 4096
        self.block_n = min(self.block_rows, block_n or max(16, min(128, values // self.block_d)))
        self.chunk_blocks = min(1024, max(16, triton.next_power_of_2(self.n_blocks)))
        self._flags = dict(HAS_OFFSET=self.offset is not None, HAS_SCALE=self.row_scale is not None)
        self._unused = [unused(device) for _ in range(4)]

    def _score(self, m: int, has_closest: bool) -> None:
        launcher(_score_kernel)[(self.n_blocks,)](
            self.x, self.offset if self.offset is not None else self._unused[0],
            self.row_scale if self.row_scale is not None else self._unused[1],
            self.weight if self.weight is not None else self._unused[2],
            self.picked, self.best, self.sq, self.block_pot,
            self.n, self.d, self.n_blocks, m, self.x.stride(0), self.x.stride(1),
            BLOCK_ROWS=self.block_rows, BLOCK_N=self.block_n, BLOCK_D=self.block_d, M=m, MP=self.mp,
            HAS_WEIGHT=self.weight is not None, HAS_CLOSEST=has_closest, num_warps=self.num_warps,
            **self._flags,
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
        self._score(1, has_closest=False)
        self._choose(1)

    def steps(self, count: int) -> None:
        for _ in range(count):
            launcher(_sample_kernel)[(self.trials,)](
                self.sq, self.weight if self.weight is not None else self._unused[3], self.block_pot, self.total,
                self.uniforms,
                self.step, self.best, self.picked, self.n, self.n_blocks, self.trials,
                BLOCK_ROWS=self.block_rows, CHUNK_BLOCKS=self.chunk_blocks, HAS_WEIGHT=self.weight is not None,
                num_warps=4,
            )
            self._score(self.trials, has_closest=True)
            self._choose(self.trials)


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
) -> torch.Tensor:
    """Greedy k-means++ (module docstring): the indices (int64, (n_clusters,)) of the rows chosen
    as centroids, in order. ``graphs``: replay the steps as CUDA graphs (CUDA only; the host then
    issues one graph per ``_GRAPH_STEPS`` steps)."""
    state = PlusPlus(x, n_clusters, uniforms, offset=offset, row_scale=row_scale, sample_weight=sample_weight,
                     block_rows=block_rows, block_n=block_n)
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
