"""The Lloyd loop and the fit driver around it.

init -> (assign -> update -> fix empty clusters -> stats -> converged?)* -> final assign, repeated
``n_init`` times keeping the run of lowest inertia.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import torch

from . import _ops, _workspace
from ._distributed import Comm, resolve_group
from ._reference import DataView, accumulator_dtype, weighted_sum
from ._streaming import StreamedView, default_chunk_rows, fits_on_device
from ._validation import (
    as_data_tensor,
    check_centroids,
    check_device,
    check_n_clusters,
    check_nonnegative_float,
    check_nonzero_rows,
    check_positive_int,
    check_precision,
    check_sample_weight,
    compute_dtype,
    ensure_finite,
    overflow_limit,
)
from .init import kmeans_parallel, kmeans_plusplus, random_rows, sample_shard

logger = logging.getLogger("torchkm")

InitLike = Union[str, torch.Tensor, np.ndarray, Callable[..., Any]]
SeedLike = Union[int, torch.Generator, np.random.RandomState, np.random.Generator, None]

METRICS = ("euclidean", "cosine")
INIT_NAMES = ("auto", "k-means++", "random", "k-means||")

# init="auto" (the default) takes k-means|| where greedy k-means++'s k passes over the rows cost
# far more than k-means||'s 6 passes and its k-means++ over about 10 k candidates: at least
# AUTO_PARALLEL_MIN_CLUSTERS clusters, at least AUTO_PARALLEL_MIN_ELEMENTS row elements (there a
# k-means++ step is bound by reading the rows, not by its launches' latency) and at least
# AUTO_PARALLEL_ROWS_PER_CLUSTER rows per cluster (the candidates stay well below n). Elsewhere
# greedy k-means++. H200, fit times in ms, k-means++ / k-means|| (scripts/diag_init.py,
# BENCHMARKS.md 2026-12-03): 1M x 128 x 4096 1153 / 219 (blobs), 887 / 597 (mixed spreads); level
# at 245,760 x 32 x 1024 (52 / 44, 71 / 73) and 32,768 x 256 x 8192 (334 / 335); 245,760 x 32 x 32
# 6.8 / 22.0.
AUTO_PARALLEL_MIN_CLUSTERS = 256
AUTO_PARALLEL_MIN_ELEMENTS = 1 << 25
AUTO_PARALLEL_ROWS_PER_CLUSTER = 32
ALGORITHMS = ("lloyd", "pruned", "triangle", "auto")


class ConvergenceWarning(UserWarning):
    """The fit finished but its result is degenerate (e.g. fewer distinct clusters than asked for)."""


@dataclass(frozen=True)
class IterationStats:
    """What one Lloyd iteration did.

    ``inertia`` is that of the assignment made at the start of the iteration (before the update);
    ``center_shift`` is the total squared movement of the centroids in the update;
    ``labels_changed`` counts rows whose label differs from the previous iteration's (all rows on
    the first iteration); ``empty_clusters`` counts clusters that received no weight and were
    relocated to far-away rows.

    Pruning (``algorithm="pruned"``, ``"triangle"`` or ``"auto"``): ``kernel`` is the pass that ran
    (``"lloyd"``, ``"pruned"`` or ``"triangle"``); ``skipped`` the fraction of the dense pass's
    ``n * k`` distance computations the hardware did not spend (a warp or tile of rows runs as long
    as its slowest row); ``skipped_bound`` the fraction the pruning rule itself skipped, row by row
    (seed 000's theoretical upper bound); ``imbalance`` seed 000's ratio R (eq. 2): work spent over
    work needed, minus one. All zero for dense passes.
    """

    iteration: int
    inertia: float
    center_shift: float
    labels_changed: int
    empty_clusters: int
    seconds: float
    kernel: str = "lloyd"
    skipped: float = 0.0
    skipped_bound: float = 0.0
    imbalance: float = 0.0


@dataclass
class KMeansResult:
    """What ``torchkm.fit`` returns.

    Attributes:
        centroids: (n_clusters, n_features) tensor on the input's device, float32 (float64 for
            float64 input).
        labels: (n_samples,) int64 index of each row's centroid; matches ``centroids``.
        inertia: sum of (weighted) distances of rows to their centroid: squared Euclidean for
            ``metric="euclidean"``, cosine distance ``1 - cos`` for ``metric="cosine"``.
        n_iter: Lloyd iterations run by the best of the ``n_init`` runs.
        history: one :class:`IterationStats` per iteration of that run.
        converged: whether that run met a convergence criterion before ``max_iter``.
    """

    centroids: torch.Tensor
    labels: torch.Tensor
    inertia: float
    n_iter: int
    history: list[IterationStats] = field(default_factory=list)
    converged: bool = False


def _metric_distance(sq_distances: torch.Tensor, normalize: bool) -> torch.Tensor:
    # For unit vectors ||x - c||^2 = 2 (1 - cos), so cosine distance is half the squared distance.
    return sq_distances * 0.5 if normalize else sq_distances


def make_generator(random_state: SeedLike, comm: Comm | None = None) -> torch.Generator:
    """A CPU generator: from an int seed, a torch.Generator's or numpy random state's stream (each
    advanced by one draw), or torch's global RNG for None. With ``comm``, rank 0's seed on every rank."""
    if isinstance(random_state, torch.Generator):
        seed = int(torch.randint(0, 2**62, (1,), generator=random_state))
    elif isinstance(random_state, np.random.RandomState):
        seed = int(random_state.randint(0, 2**62, dtype=np.int64))
    elif isinstance(random_state, np.random.Generator):
        seed = int(random_state.integers(0, 2**62))
    elif random_state is None:
        # Draw from torch's global RNG so that torch.manual_seed(...) makes fits reproducible.
        seed = int(torch.randint(0, 2**62, (1,)))
    elif isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        seed = int(random_state)
        if seed < 0:
            raise ValueError(f"random_state must be >= 0, got {seed}")
    else:
        raise TypeError("random_state must be None, an int, a torch.Generator or a numpy RandomState or Generator, "
                        f"got {random_state!r}")
    if comm is not None:
        seed = comm.same_seed(seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


def _relocate_empty(
    data: DataView,
    labels: torch.Tensor,
    sq_distances: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    empty: torch.Tensor,
    sample_weight: torch.Tensor | None,
    comm: Comm,
) -> None:
    """Move each empty cluster onto one of the rows farthest from their centroid (scikit-learn's rule).

    The moved rows leave their old clusters' sums, so the centroids stay means of their members.
    With several ranks the farthest rows of the whole data set are chosen, and every rank applies
    the same moves to the (all-reduced) sums. (On one process the dense and bounds engines do the
    same on the device instead: their ``relocate``.)
    """
    empty_ids = empty.nonzero().flatten()
    scores, far = _ops.farthest_rows(sq_distances, sample_weight, empty_ids.numel())
    rows = data.take(far).to(sums.dtype)
    w = torch.ones(far.numel(), dtype=sums.dtype, device=sums.device) if sample_weight is None else sample_weight[far].to(sums.dtype)
    old = labels[far]
    if comm.active:
        scores = comm.gather_rows(scores.to(sums.dtype))
        rows, w, old = comm.gather_rows(rows), comm.gather_rows(w), comm.gather_rows(old.long())
        pick = torch.topk(scores, empty_ids.numel()).indices
        rows, w, old = rows[pick], w[pick], old[pick]
    weighted_rows = rows * w.unsqueeze(1)
    sums.index_add_(0, old, -weighted_rows)
    counts.index_add_(0, old, -w)
    sums[empty_ids] = weighted_rows
    counts[empty_ids] = w


def new_centroids(sums: torch.Tensor, counts: torch.Tensor, old: torch.Tensor, normalize: bool) -> torch.Tensor:
    # Clusters with no weight keep their centroid: never NaN.
    filled = counts > 0
    means = sums / torch.where(filled, counts, torch.ones_like(counts)).unsqueeze(1)
    new = torch.where(filled.unsqueeze(1), means.to(old.dtype), old)
    if normalize:
        norms = torch.linalg.vector_norm(new, dim=1, keepdim=True)
        # A mean of opposing unit vectors can vanish; keep the old direction then.
        new = torch.where(norms > 1e-12, new / norms.clamp_min(1e-30), old)
    return new


def _sum_step(step: _ops.StepResult, comm: Comm) -> None:
    """All-reduce a step's sums, weights, inertia and changed count (one float64 buffer)."""
    if not comm.active:
        return
    k, d = step.sums.shape
    packed = torch.cat([step.sums.reshape(-1).double(), step.counts.double(),
                        step.inertia.double().reshape(1), step.changed.double().reshape(1)])
    comm.sum_(packed)
    step.sums = packed[: k * d].view(k, d).to(step.sums.dtype)
    step.counts = packed[k * d: k * d + k].to(step.counts.dtype)
    step.inertia = packed[-2]
    step.changed = packed[-1]


def _iterate(
    data: DataView,
    c: torch.Tensor,
    prev_labels: torch.Tensor | None,
    sample_weight: torch.Tensor | None,
    comm: Comm,
    deterministic: bool,
) -> tuple[_ops.StepResult, torch.Tensor, torch.Tensor]:
    """One Lloyd iteration outside the kernels' engine (pure torch, deterministic, or streamed), with
    no host synchronisation: the step, the new centroids (empty clusters keep theirs) and the
    statistics ``[inertia, shift, changed, empty]`` (float64, device), over all ranks."""
    step = _ops.lloyd_step(data, c, prev_labels, sample_weight, deterministic)
    _sum_step(step, comm)
    new_c = new_centroids(step.sums, step.counts, c, data.normalize)
    shift = ((new_c - c) ** 2).sum()
    stats = torch.stack([step.inertia.double(), shift.double(), step.changed.double(), (step.counts <= 0).sum().double()])
    return step, new_c, stats


# CUDA iterations replay a captured CUDA graph, in blocks of _GRAPH_BLOCK per host sync. Small
# problems need it most (launches and a per-iteration sync cost more than the pass), but large ones
# gain too: H200, 1M x 128, k = 4096, ms per iteration eager / replayed (second block), exact fp32
# 5.0 / 4.55, fast fp32 4.15 / 3.5, exact bf16 4.05 / 3.37, fast bf16 2.6 / 2.4; a first block with
# its capture took no longer than eager iterations (2026-11-22). Until then only passes of at most
# 2^37 (n * k * d) took graphs.
_GRAPH_BLOCK = 8


def _pipelined(engine: Any, hybrid: _Hybrid | None) -> bool:
    """Whether ``lloyd`` launches an engine's next block before it reads the current one.

    The host's work between two blocks (reading one, checking its iterations, launching the next)
    otherwise leaves the device idle. A block launched ahead continues the state the last one
    leaves (``run_block(follow=True)``): where that one stopped (convergence, an empty cluster) it
    is frozen from its first pass and is dropped unread, at the cost of its frozen passes'
    launches on the device. H100, 2026-12-06, 245,760 x 32, k = 1,024, fp32, paired fits: dense
    1.016x / 1.034x and pruned 1.028x / 1.028x faster than blocks read in turn (sigma^2 0.0125 /
    0.05), 1.003-1.010x at 16x the rows; the same labels, centroids and iteration counts. Not
    while the hybrid times the passes of its trial or of its dense reference (its verdict may
    change the engine at the next block), nor for engines without blocks.
    ``TORCHKM_PIPELINE=0``: never (to measure what it saves)."""
    return (getattr(engine, "recording", None) is not None and engine.block > 1 and not engine.timed
            and (hybrid is None or hybrid.done) and os.environ.get("TORCHKM_PIPELINE", "1") != "0")


def _cuda_graphs_allowed(data: DataView, comm: Comm | None = None) -> bool:
    # Collectives stay outside graphs: a replay would also replay the all-reduce of a stale buffer.
    return _ops.cuda_graphs_enabled(data.device) and not (comm is not None and comm.active)


def _use_cuda_graphs(data: DataView, k: int, comm: Comm) -> bool:
    return _cuda_graphs_allowed(data, comm)


def _decay_steps(series: list[float], floor: float) -> float:
    """Steps until a series decaying geometrically, at the mean rate from its first value to its
    last, falls to ``floor``; infinite where it does not decay (or ``floor`` <= 0)."""
    first, last = series[0], series[-1]
    if floor <= 0 or first <= 0 or last <= 0 or last >= first:
        return math.inf
    if last <= floor:
        return 0.0
    ratio = (last / first) ** (1.0 / (len(series) - 1))
    return float(math.ceil(math.log(floor / last) / math.log(ratio)))


class _Hybrid:
    """``algorithm="auto"``: seed 000's hybrid, deciding from times measured on the running device.

    The dense engine starts, as for ``"lloyd"``. Its iterations after the first are timed on the
    device (CUDA events around each graph replay or eager iteration) until a block has given a time;
    the fastest is the dense reference. Trying the bounds engine costs a few host-bound passes: its
    full pass (which records the bounds), its first settle pass and the capture of one (a bounds
    engine kept from an earlier fit of the same rows replays those it captured then: its trial
    counts the others, at least one). Each costs the host about what the dense engine's own eager
    and captured iterations cost it, measured in the first block. The trial starts once the fit has
    spent ``1 / trial_share`` times that estimate, so that a failed trial costs at most about
    ``trial_share`` of the fit. Each pruned pass after the full pass and the first settle pass
    (which search every row or most of them) is then timed and judged the same way: it counts
    against pruning when it took longer than the reference while its skipped fraction had stopped
    rising (early passes settle few rows and get better quickly). After ``patience`` such passes in
    a row, or once the judged passes together have cost more than the dense reference by
    ``trial_share`` of the time spent before the trial (rising or not: settling in too slowly does
    not pay either), the dense engine, kept from the start, takes the run back. It may try once more
    (``trials``), once the fit has run ``retry_after`` times as long as when the failed trial ended:
    bounds taken later, from centroids that move less, settle more rows, and the time spent then
    gives the new trial a budget in proportion (H200, 3.9M x 32, k = 1024, sigma^2 = 0.05,
    2026-11-29: a trial started after 8 dense iterations ended after 6 pruned passes in three runs
    out of three, and the fits took 1.02x dense Lloyd's time where ``"pruned"`` took 0.47x). The
    trials share one budget: a later trial's is ``trial_share`` of the time spent (and projected)
    less what the failed ones cost beyond dense passes: every pass of theirs in wall time, the
    unjudged full and first settle passes too (at 3.9M x 32, k = 1024, sigma^2 = 0.2, counting
    judged passes only let two failed trials cost 5.3-5.7 % of the fit; H200, 2026-11-29). After the
    last trial the decision is final. ``patience`` is long because the bounds engine's skipped
    fraction is noisy from pass to pass while centroids still move (a large move loosens many bounds
    at once): at 3.9M x 32, k = 1024, sigma^2 = 0.05 (H200, bench_prune's data seed 85711) the
    trial's passes 3-7 skipped 0.00, 0.20, 0.21, 0.20 and 0.10 of the rows, each slower than a dense
    pass, and the next two 0.75 and 0.79 in 0.34-0.38x its time; with a patience of 3 that trial
    ended there and the fit took 1.00x dense Lloyd's time where ``"pruned"`` took 0.47x. A failing
    trial still ends on its budget. Problems too small for the choice to matter (``min_work``) and
    data no pruned engine serves (4 to 8 features) stay dense; so do fits whose passes are
    host-bound once, after ``window`` iterations, the fit is projected to end before the
    ``trial_share`` rule could start a trial (judging then only costs time).

    At d <= 3 the trial runs the box engine (``torchkm._kernels.boxes``), judged the same way. Its
    cost is mostly a once-per-fit set-up (a sort of the rows: about 7 dense passes at 100M x 2,
    k = 32), measured on the running device (``torchkm._kernels.boxes.setup_seconds``) and added
    to the trial's estimate. A trial pays back in proportion to how long the fit has left to run.
    So where a dense pass outlasts an iteration's host work, the trial (box or bounds engine) also
    starts as soon as the dense passes the fit is projected to still run cost ``payback`` times the
    trial (``remaining_iterations``), and its budget is then ``trial_share`` of the time spent plus
    those projected passes. The bounds engine's early start waits for ``window`` iterations: its
    first passes still search most rows, and the projection (capped at the iterations run) gives
    an early trial little budget for them.
    """

    patience = 6
    trials = 2  # trials of the pruned engine in one fit, at most
    retry_after = 2.0  # a failed trial is tried again once the fit has run this many times as long
    trial_block = 4  # a trial's blocks (and the dense blocks while one is near): hand-over within 4 passes
    plateau = 0.02  # a rise of the skipped fraction below this is no longer the bounds settling in
    trial_share = 0.05
    # The trial's host-bound passes: the full pass, the first settle pass, the capture of the next
    # (fewer for a bounds engine kept from an earlier fit, whose passes replay: ``lloyd`` sets it).
    trial_passes = 3
    # n * k * d below which the hybrid does not run: there a fit is a few milliseconds, no trial
    # pays, and timing the dense engine costs the fit about 0.35 ms (1M x 2, k = 32, 6.3e7: 4-9 %
    # of 4-7 ms fits on an H200, 2026-11-27; 2^24 before). 2^27 before 2026-11-29: at 245,760 x
    # 32, k = 32 (2.5e8) the hybrid never tried (its passes host-bound, its fits too short) and
    # its timing cost 2-5 % of 5-6 ms fits (engines kept between fits), where "pruned" took
    # 1.07-1.32x the time of dense Lloyd.
    min_work = 1 << 28
    payback = 2.0  # an early trial starts once the dense passes projected to remain cost this many trials
    window = 8  # the recent dense iterations whose shifts project the fit's length

    def __init__(self, data: DataView, k: int, tol: float = -1.0, max_iter: int | None = None):
        self.enabled = _ops.pruned_supported(data) and data.n_samples * k * data.n_features >= self.min_work
        self.box = data.n_features <= _ops.BOX_MAX_D
        self.data = data
        self.tol = tol
        self.max_iter = max_iter
        self._shifts: list[float] = []
        self._changed: list[float] = []
        self._setup: float | None = None
        # Whether an early trial may start within a few iterations: dense blocks are then cut short
        # (``max_block``), so that the switch does not wait for the rest of a long block.
        self.near = False
        self.done = not self.enabled
        self.trying = False
        self.slow = 0
        self.judged = 0
        self.skipped = 0.0
        self.dense_seconds: float | None = None
        self.spent = 0.0
        self.excess = 0.0  # the judged pruned passes' time less the dense reference's, summed
        self.trial_excess = 0.0  # every pass of the trial: its wall time less the dense reference's, summed
        self.trial_seen = 0  # pruned passes since the trial started
        self.budget = 0.0  # the excess at which the trial ends: trial_share of the time spent (and projected)
        self.trials_run = 0
        self.wasted = 0.0  # what failed trials cost beyond dense passes, which later trials' budgets leave out
        self.elapsed = 0.0  # seconds of every iteration so far, dense or pruned
        self.retry_at = 0.0  # ``elapsed`` from which a failed trial may be tried again
        # Host seconds of the dense engine's eager and captured passes (a kept engine's: from the
        # fit that made it; see ``lloyd``), and of their launches alone.
        self.host_costs: list[float] = []
        self.launch_costs: list[float] = []

    @property
    def trial_cost(self) -> float | None:
        """Estimated host seconds of a trial of the bounds engine (class docstring)."""
        if not self.host_costs:
            return None
        return self.trial_passes * sum(self.host_costs) / len(self.host_costs)

    def max_block(self, block: int) -> int:
        """The dense engine's next block: at most ``trial_block`` passes while an early trial is near."""
        shorten = self.near and self._device_bound() and not (self.trying or self.done)
        return min(block, self.trial_block) if shorten else block

    def _device_bound(self) -> bool:
        """Whether a dense pass outlasts the host's work per iteration (there extra syncs are free):
        the launches of an eager pass, which a capture records before it builds its graph. (A
        capture's whole host time had judged bf16 passes at 3.9M x 32, k = 1,024 host-bound on a
        slower host: 2.50 ms passes against a 3.56 ms capture, whose launches take about two
        thirds of it; H100, 2026-12-06.)"""
        costs = self.launch_costs
        return self.dense_seconds is not None and bool(costs) and self.dense_seconds >= sum(costs) / len(costs)

    def setup_seconds(self) -> float:
        """Estimated seconds of the pruned engine's set-up: the box engine's sort of the rows
        (measured on the device when first asked), none for the bounds engine (whose full pass is
        one of ``trial_passes``)."""
        if self._setup is None:
            self._setup = _ops.box_setup_seconds(self.data) if self.box else 0.0
        return self._setup

    def remaining_iterations(self, iteration: int) -> float:
        """Dense iterations the fit is projected to still run after ``iteration``: the fewest of
        (a) the last ``window`` centre shifts' decay, taken as geometric, extrapolated down to
        ``tol``; (b) the changed-label counts' decay extrapolated below one row (the strict stop);
        (c) ``iteration`` (a fit is taken to be at most half done: slowly decaying shifts project
        hundreds of iterations where the labels stop changing much sooner; at 1M x 2, k = 32 that
        started a trial which cost 1.6x the dense fit). A series that does not decay sets no
        bound. At most ``max_iter`` in all; 0 before three iterations."""
        if len(self._shifts) < 3:
            return 0.0
        left = math.inf if self.max_iter is None else max(0, self.max_iter - iteration)
        if self._shifts[-1] <= max(self.tol, 0.0) or self._changed[-1] == 0:
            return 0.0
        return float(min(left, iteration, _decay_steps(self._shifts[-self.window:], self.tol),
                         _decay_steps(self._changed[-self.window:], 0.5)))

    def after(self, stats: IterationStats, how: str, seconds: float | None, host_seconds: float | None,
              launch_seconds: float | None = None) -> str | None:
        """Record an iteration (``how`` it ran, its ``seconds`` on the device, the ``host_seconds``
        it cost the host and the ``launch_seconds`` of those spent issuing its launches, None where
        not measured); returns the engine to run from the next block on: ``"pruned"`` to try the
        bounds engine, ``"lloyd"`` to go back to the dense one."""
        if self.done:
            return None
        self.elapsed += stats.seconds
        timed = seconds is not None and how in ("replay", "capture", "eager")
        if not self.trying and stats.kernel != "lloyd":
            return None  # a failed trial's passes left in its last block: no dense reference
        if not self.trying:
            self.spent += stats.seconds
            self._shifts.append(stats.center_shift)
            self._changed.append(float(stats.labels_changed))
            if timed:
                self.dense_seconds = seconds if self.dense_seconds is None else min(self.dense_seconds, seconds)
            if how in ("eager", "capture") and host_seconds is not None:
                self.host_costs.append(host_seconds)
                self.launch_costs.append(host_seconds if launch_seconds is None else launch_seconds)
            cost = self.trial_cost
            if self.dense_seconds is None or cost is None or self.elapsed < self.retry_at:
                return None
            # The early start is for device-bound passes: where a pass is shorter than an
            # iteration's launches (10M x 2, k = 32 on an H200: 0.2 against about 1 ms), the trial's
            # host-bound passes cost more than its passes save, and a trial started on projection
            # cost 16 % of the fit.
            # The bounds engine starts early only from a full window of shifts. Its first passes
            # search most rows, and an early trial's budget is small: the projection behind it is
            # capped at the iterations run. H200, 3.9M x 32, k = 1024, sigma^2 = 0.05, bench_prune's
            # data seed 76264: from three shifts, 93 dense iterations and 6 pruned (1.013x of
            # dense; pruned alone 0.40x); from a window, 9 dense and 91 pruned (0.373x). The box
            # engine's set-up is what its early start pays back (it settles rows at once).
            early = self._device_bound() and (self.box or len(self._shifts) >= self.window)
            if not early and len(self._shifts) >= self.window:
                # Host-bound passes: only the trial_share rule could start a trial. Where the fit is
                # projected to end before it does, judging costs the fit and gains nothing (timed
                # passes and this bookkeeping: about 0.9 ms of 8-10 ms fits at 245,760 x 32, k = 32).
                projected = self.spent * (1.0 + self.remaining_iterations(stats.iteration) / len(self._shifts))
                if projected * self.trial_share < cost:
                    self.done = True
                    logger.debug("auto: a %.3g ms fit leaves no room for a trial of %.3g ms; staying dense",
                                 projected * 1e3, cost * 1e3)
                    return None
            remaining = self.remaining_iterations(stats.iteration) * self.dense_seconds if early else 0.0
            self.near = early and remaining >= cost + (self._setup or 0.0)
            # The cheap test first: the set-up's estimate may take a measurement.
            if self.spent * self.trial_share < cost and remaining < self.payback * cost:
                return None
            cost += self.setup_seconds()
            if self.spent * self.trial_share < cost and remaining < self.payback * cost:
                return None
            # A failed trial may cost trial_share of the fit: of the time spent so far and, where
            # projected, of the dense passes still to come (an early trial, whose own first passes
            # still search many rows, is not cut off by the little spent before it).
            budget = (self.spent + remaining) * self.trial_share - self.wasted
            if budget <= 0.0:
                return None
            self.budget = budget
            self.trying = True
            self.trials_run += 1
            self.slow = self.judged = self.trial_seen = 0
            self.skipped = self.excess = self.trial_excess = 0.0
            logger.info("auto: trying %s passes after %d dense iterations (%.3g ms each, %.3g ms more projected; trial "
                        "cost about %.3g ms)", "box engine" if self.box else "pruned", stats.iteration,
                        self.dense_seconds * 1e3, remaining * 1e3, cost * 1e3)
            return "pruned"
        if stats.kernel != "pruned":
            return None
        self.trial_seen += 1
        # What the trial costs beyond dense passes, its unjudged passes included (wall time, which
        # holds their host work): what a failed trial takes from the next one's budget.
        self.trial_excess += stats.seconds - (self.dense_seconds or 0.0)
        # The full pass and the first settle pass are never judged, however they ran (a process
        # that ran this shape before captures the first settle pass at once): they search every
        # row or most of them, and an early trial's budget is too small for them.
        if not timed or self.trial_seen <= 2 or self.dense_seconds is None:
            return None
        self.judged += 1
        settling = stats.skipped_bound > self.skipped + self.plateau
        self.skipped = stats.skipped_bound
        self.slow = self.slow + 1 if seconds > self.dense_seconds and not settling else 0
        self.excess += seconds - self.dense_seconds
        if self.slow >= self.patience or self.excess > self.budget:
            self.trying = False
            self.wasted += max(0.0, self.excess, self.trial_excess)
            self.done = self.trials_run >= self.trials
            self.retry_at = self.elapsed * self.retry_after
            logger.info("auto: pruned passes (%.3g ms) cost more than a dense one (%.3g ms; %.3g ms more over %d "
                        "passes); %s", seconds * 1e3, self.dense_seconds * 1e3, self.excess * 1e3, self.judged,
                        "finishing dense" if self.done else f"back to dense, trying again after {self.retry_at:.3g} s")
            return "lloyd"
        return None


@_ops.eager_launches
def lloyd(
    data: DataView,
    centroids: torch.Tensor,
    *,
    sample_weight: torch.Tensor | None,
    max_iter: int,
    tol: float,
    deterministic: bool = False,
    algorithm: str = "lloyd",
    on_iteration: Callable[[IterationStats], None] | None = None,
    comm: Comm | None = None,
) -> KMeansResult:
    """Lloyd iterations from ``centroids`` (in the data's transformed space) until convergence.

    Converges when no label changes (strict) or the total squared centroid shift is at most ``tol``
    (already scaled to the data), or after ``max_iter`` iterations; then assigns once more so the
    labels returned match the centroids returned. On the kernels an iteration is a few launches;
    on CUDA, blocks of iterations run, each a replay of one captured CUDA graph, and synchronise
    once per block (the device freezes the rest of a block once a stopping rule fires, so the state
    read back is that of the stopping iteration); the next block is launched before the last one
    is read (``_pipelined``). Elsewhere (``TORCHKM_CUDA_GRAPHS=0``, a
    distributed fit) each iteration synchronises once to read its statistics; a second time only
    when a cluster went empty.

    ``algorithm``: ``"pruned"`` and ``"triangle"`` run the engines of ``torchkm._kernels.prune``
    (``"pruned"`` with d <= 3: ``torchkm._kernels.boxes``; labels equal the dense exact pass's),
    ``"auto"`` the hybrid (:class:`_Hybrid`). They need the kernels; on the pure-torch engine (and
    for ``"pruned"`` with 4 <= d <= 8) the dense loop runs and the history says so (``kernel="lloyd"``).

    ``comm``: the rows are this rank's shard of a data-parallel fit; sums, weights and statistics
    are all-reduced every iteration, so all ranks take the same steps and hold the same centroids.
    Streamed data (``not data.in_memory``) runs the fused pass chunk by chunk.
    """
    comm = comm or Comm()
    c = centroids.to(data.dtype).clone()
    prev_labels: torch.Tensor | None = None
    history: list[IterationStats] = []
    strict = converged = False
    labels: torch.Tensor | None = None
    inertia_f = float("nan")
    engine = None
    first_in_block = False
    hybrid = None
    kernels = _ops.uses_kernels(data) and not deterministic and data.in_memory
    kind = "lloyd"
    # "auto" (the default) says why it runs dense only at DEBUG level: it is not an instruction.
    say = logger.debug if algorithm == "auto" else logger.info
    if algorithm != "lloyd" and not kernels:
        say("algorithm=%r needs the Triton kernels (CUDA, not deterministic, in GPU memory); running dense Lloyd",
            algorithm)
    elif algorithm != "lloyd" and comm.active:
        say("algorithm=%r runs on one process; running dense Lloyd on every rank", algorithm)
    elif algorithm == "pruned" and not _ops.pruned_supported(data):
        logger.info("algorithm='pruned' needs d > 8 (the bounds engine) or d <= %d (the box engine); running dense "
                    "Lloyd", _ops.BOX_MAX_D)
    elif algorithm == "auto":
        hybrid = _Hybrid(data, c.shape[0], tol, max_iter)
    else:
        kind = algorithm
    workspace = None
    if kernels:
        graphs = _use_cuda_graphs(data, c.shape[0], comm)
        timed = hybrid is not None and not hybrid.done
        # One int32 label buffer updated in place (the kernels read a row's previous label before
        # writing it): half the label traffic of int64, which matters when rows are short. It and
        # the engines that can restart come from the last fit of these rows, where kept.
        workspace = _workspace.take(data, c.shape[0], sample_weight, tol, graphs) if not comm.active else None
        label_buffer = workspace.labels if workspace is not None else torch.empty(
            data.n_samples, dtype=torch.int32, device=data.device)
        engines: dict[Any, Any] = workspace.engines if workspace is not None else {}

        def engine_block(kind: str) -> int:
            # The hybrid reads its trial in short blocks: it hands over within a block of the verdict.
            block = _GRAPH_BLOCK if kind == "lloyd" or not timed else min(_GRAPH_BLOCK, _Hybrid.trial_block)
            return block if graphs else 1

        def make_engine(kind: str, start: torch.Tensor):
            block = engine_block(kind)
            engine = engines.get((kind, block))
            if engine is not None:  # an earlier fit's, or the hybrid's dense engine taking the run back
                engine.restart(start, data.offset)
                engine.timed = timed
                return engine
            if kind == "lloyd":
                engine = _ops.lloyd_engine(data, start, label_buffer, sample_weight, tol, block, graphs,
                                           comm.sum_ if comm.active else None, timed)
            else:
                engine = _ops.pruned_engine(data, start, label_buffer, sample_weight, tol, kind,
                                            _cuda_graphs_allowed(data), block, timed)
            if hasattr(engine, "restart"):
                engines[(kind, block)] = engine
            return engine

        engine = make_engine(kind, c)
        if hybrid is not None:
            # A kept dense engine only replays: the trial's estimate takes the host costs of the
            # eager and captured passes it ran before (none for a new engine: measured as it runs).
            hybrid.host_costs = engine.setup_host_seconds
            hybrid.launch_costs = engine.setup_launch_seconds
            # A bounds engine kept from an earlier fit replays most of a trial's passes (its full
            # pass too, from its third fit); the estimate keeps at least one host-bound pass.
            trial_engine = engines.get(("pruned", engine_block("pruned")))
            if trial_engine is not None and hasattr(trial_engine, "unreplayed_passes"):
                hybrid.trial_passes = max(1, trial_engine.unreplayed_passes())
        # The dense engine's first iteration is the first of a block (no eager iteration of its own
        # and no host sync after it): previous labels of -1 count every row as changed, as a first
        # iteration does. The hybrid too: that first call compiles and is not timed, as the eager
        # iteration was not. Its own iteration and sync had made the hybrid's fits 4-12 % slower
        # than "lloyd" at 245,760 x 32, k = 32 (H200, 2026-11-27).
        first_in_block = engine.kernel == "lloyd"
        if first_in_block:
            label_buffer.fill_(-1)
    it = 0
    ahead = 0  # passes of the block queued behind the one being read
    while it < max_iter:
        t0 = time.perf_counter()
        if engine is not None:
            # A pruned engine's first iteration has no previous labels: its first pass searches every row.
            if (it == 0 and not first_in_block) or engine.block == 1:
                engine.iterate(has_prev=it > 0 or first_in_block)
                rows = engine.read(1)
            else:
                if ahead:
                    block = ahead
                else:
                    block = min(engine.block if hybrid is None else hybrid.max_block(engine.block), max_iter - it)
                    engine.run_block(block)
                # Once no pass is timed, the next block is launched before this one is read: the
                # device runs it while the host reads and checks this one (``_pipelined``).
                ahead = min(engine.block, max_iter - it - block) if _pipelined(engine, hybrid) else 0
                if ahead:
                    engine.run_block(ahead, follow=True)
                rows = engine.read(block)
            # Pruned engines describe their passes; the hybrid reads how each pass ran and its time.
            infos = getattr(engine, "infos", None) or [getattr(engine, "info", None)] * len(rows)
            timings = list(zip(engine.pass_kinds, engine.pass_seconds, engine.pass_host_seconds,
                               engine.pass_launch_seconds)) if timed else []
        else:
            infos, timings = [None], []
            step, new_c, device_stats = _iterate(data, c, prev_labels, sample_weight, comm, deterministic)
            rows = [device_stats.tolist()]
        seconds = (time.perf_counter() - t0) / len(rows)
        switch_to = None
        relocated_ahead = False  # (a block queued behind a relocation, to be read next)
        for row, ((inertia_f, shift_f, changed_f, empty_f), info) in enumerate(zip(rows, infos)):
            if not math.isfinite(inertia_f):
                # The rows are finite (checked), so their distances overflowed the compute dtype:
                # every later step would be meaningless (labels collapse onto a few clusters).
                raise ValueError(
                    f"the rows' squared distances to their centroids overflow {data.dtype} (inertia {inertia_f}): x "
                    f"is spread too widely for it (centred values beyond about {overflow_limit(data.dtype, data.n_features):.1e}); "
                    "rescale x, or pass x.double()")
            if engine is not None:
                # (The box engine writes its labels into the caller's order when they are read.)
                labels, sums, counts, old_c, new_c = None, engine.sums, engine.counts, engine.c_old, engine.c
                sq = None
            else:
                labels, sums, counts, old_c, sq = step.labels, step.sums, step.counts, c, step.sq_distances
            n_empty = int(empty_f)
            # Where the device froze the rest of a block (see LloydEngine): this row is the last valid one.
            block_ends = engine is not None and (n_empty > 0 or changed_f == 0 or shift_f <= engine.tol_device)
            if n_empty:
                if getattr(engine, "relocates_on_device", False) and not comm.active:
                    # The same moves on the device (a replayed graph), its centroids updated in
                    # place. With blocks launched ahead, the next block starts behind it before
                    # its shift is read (the one sync, for the relocation alone): frozen from its
                    # first pass where the relocation met tol, and then dropped.
                    follow = _pipelined(engine, hybrid)
                    if follow and ahead:
                        engine.discard_queued()  # (the block behind this one: frozen by the empty cluster)
                    engine.relocate(n_empty, follow=follow)
                    if follow:
                        ahead = min(engine.block, max_iter - it - 1)
                        if ahead:
                            engine.run_block(ahead, follow=True)
                    shift_f = engine.relocation_shift()
                    if ahead and shift_f <= engine.tol_device:
                        engine.discard_queued()
                        ahead = 0
                    relocated_ahead = ahead > 0
                else:
                    labels_now = engine.labels if labels is None else labels
                    if sq is None:
                        # Engines that keep every row's distance to its centroid from the pass
                        # (``sq_distances``: groups, bounds) lend it; for the others, each row's
                        # distance to the centroid the pass gave it.
                        sq = getattr(engine, "sq_distances", None)
                        sq = _ops.labelled_sq_distances(data, old_c, labels_now) if sq is None else sq
                    _relocate_empty(data, labels_now, sq, sums, counts, counts <= 0, sample_weight, comm)
                    relocated = new_centroids(sums, counts, old_c, data.normalize)
                    shift_f = float(((relocated - old_c) ** 2).sum())
                    new_c = new_c.copy_(relocated) if engine is not None else relocated
                    if engine is not None and hasattr(engine, "centroids_changed"):
                        engine.centroids_changed()  # the bounds engine lowers its bounds by the moves
            if data.normalize:
                inertia_f *= 0.5
            c = new_c
            it += 1
            pruning = () if info is None else (info.kernel, info.skipped, info.skipped_bound, info.imbalance)
            stats = IterationStats(it, inertia_f, shift_f, int(changed_f), n_empty, seconds, *pruning)
            history.append(stats)
            if hybrid is not None and row < len(timings):
                switch_to = hybrid.after(stats, *timings[row]) or switch_to
            if on_iteration is not None:
                on_iteration(stats)
            if it > 1 and stats.labels_changed == 0 and n_empty == 0:
                # The centroids are the means of unchanged clusters, so the labels and inertia stand.
                strict = converged = True
            elif shift_f <= tol:
                converged = True
            prev_labels = labels
            if converged or block_ends:
                break
        if ahead and block_ends and not relocated_ahead:
            # The block behind one that stopped: frozen from its first pass, nothing to read.
            engine.discard_queued()
            ahead = 0
        if converged:
            break
        if hybrid is not None and engine is not None:
            # Timing reads events after each block's sync, while the GPU waits: only while judging.
            engine.timed = not hybrid.done and (hybrid.trying or hybrid.dense_seconds is None)
        if switch_to is not None:
            logger.debug("auto: switching to the %s engine at iteration %d", switch_to, it)
            # The engines share one label buffer, which the box engine writes only when read.
            _ = engine.labels
            engine = make_engine(switch_to, c)
    if engine is not None:
        # The engine's buffers are reused by its replays: hand out copies.
        c = c.clone()
    if strict:
        labels = (engine.labels if labels is None else labels).long()
        inertia = inertia_f
    elif engine is not None and getattr(engine, "labels_by_one_more_pass", False) and not comm.active:
        # One more iteration of the engine (a replay): its assignment is that of ``c``, with its
        # inertia; the centroids it then moves are dropped. Saves a separate assignment's launches
        # and buffers, and for the bounds engine the search of the rows its bounds settle. (An
        # engine the hybrid has just handed the run to, with no pass yet, makes that pass its first.)
        engine.iterate(has_prev=True)
        inertia = engine.read(1)[0][0] * (0.5 if data.normalize else 1.0)
        labels = engine.labels.long()
    else:
        labels, sq = _ops.assign(data, c)
        inertia = float(comm.sum_(weighted_sum(_metric_distance(sq, data.normalize), sample_weight).double().reshape(1))[0])
    assert labels is not None
    if workspace is not None:
        _workspace.give_back(workspace)
    return KMeansResult(c, labels, inertia, len(history), history, converged)


def _feature_variance_mean(data: DataView, sample_weight: torch.Tensor | None, comm: Comm) -> float:
    """Mean over features of the (weighted) variance: the scale that ``tol`` is relative to."""
    acc = accumulator_dtype(data)
    total = torch.zeros(data.n_features, dtype=acc, device=data.device)
    total_sq = torch.zeros_like(total)
    for start, stop, rows in data.chunks(data.n_features):
        rows = rows.to(acc)
        w = None if sample_weight is None else sample_weight[start:stop].to(acc)
        total += rows.sum(0) if w is None else w @ rows
        total_sq += (rows * rows).sum(0) if w is None else w @ (rows * rows)
    n_eff = torch.tensor(float(data.n_samples), dtype=torch.float64, device=data.device) if sample_weight is None \
        else sample_weight.to(torch.float64).sum()
    packed = comm.sum_(torch.cat([total.double(), total_sq.double(), n_eff.reshape(1)]))
    d = data.n_features
    mean = packed[:d] / packed[-1]
    return float((packed[d: 2 * d] / packed[-1] - mean * mean).clamp_min(0).mean())


def _data_mean(
    data: DataView, sample_weight: torch.Tensor | None, comm: Comm, with_variance: bool = False
) -> tuple[torch.Tensor, float | None]:
    """The (weighted) mean row of all ranks' raw rows (``data`` has no offset), on the host for CPU
    data, and with ``with_variance`` the mean feature variance (``_feature_variance_mean``) from the
    same pass: streamed rows are then read once for both. Those second moments are taken about rank
    0's first row in float64, so that data far from the origin keep their variance. Non-finite
    streamed input shows up here and is reported with its rows."""
    acc = torch.float64 if data.device.type == "cpu" or with_variance else data.dtype
    d = data.n_features
    shift = torch.zeros(d, dtype=acc, device=data.device)
    if with_variance:
        comm.broadcast_(shift.copy_(data.take(torch.zeros(1, dtype=torch.int64))[0]))
    total = torch.zeros(d, dtype=acc, device=data.device)
    total_sq = torch.zeros(d if with_variance else 0, dtype=acc, device=data.device)
    for start, stop, rows in data.chunks(d):
        rows = rows.to(acc) - shift if with_variance else rows.to(acc)
        w = None if sample_weight is None else sample_weight[start:stop].to(acc)
        total += rows.sum(0) if w is None else w @ rows
        if with_variance:
            total_sq += (rows * rows).sum(0) if w is None else w @ (rows * rows)
    n_eff = torch.tensor(float(data.n_samples), dtype=torch.float64, device=data.device) if sample_weight is None \
        else sample_weight.to(torch.float64).sum()
    packed = comm.sum_(torch.cat([total.double(), total_sq.double(), n_eff.reshape(1)]))
    if not data.in_memory and not bool(torch.isfinite(packed).all()):
        ensure_finite(data.x, "x")  # names the first bad row (on the host: only on this error path)
    moment = packed[:d] / packed[-1]
    variance = float((packed[d:2 * d] / packed[-1] - moment * moment).clamp_min(0).mean()) if with_variance else None
    return (shift.double() + moment).to(data.dtype), variance


def _moments(data: DataView) -> tuple[torch.Tensor, float]:
    """The mean row (``data.dtype``) and the mean feature variance of unweighted in-memory rows, in
    one pass: ``torch.var_mean`` per chunk (one kernel each; fp32 rows are one chunk, as they need
    no converted copy), merged in float64 by Chan's formula, and one host sync for the variance.

    The variance is finite exactly when the rows are, short of overflow: a non-finite variance is
    reported as ``ensure_finite`` reports rows (naming the first bad one), or as overflow. This is
    what ``torchkm.fit`` checks its GPU rows with, instead of a pass of its own."""
    d = data.n_features
    whole = data.x.dtype == data.dtype and data.offset is None and not data.normalize
    count, mean, m2 = 0, None, None
    for start, stop, rows in data.chunks(d, chunk_size=data.n_samples if whole else None):
        var_c, mean_c = torch.var_mean(rows, dim=0, correction=0)
        size = stop - start
        mean_c, m2_c = mean_c.double(), var_c.double() * size
        if mean is None:
            count, mean, m2 = size, mean_c, m2_c
            continue
        delta = mean_c - mean
        total = count + size
        mean = mean + delta * (size / total)
        m2 = m2 + m2_c + delta * delta * (count * size / total)
        count = total
    assert mean is not None and m2 is not None
    variance = float((m2 / count).mean())
    if not math.isfinite(variance):
        ensure_finite(data.x, "x")
        raise ValueError("x's values are too large: their squared deviations from the mean overflow "
                         f"{data.dtype} (rescale the data)")
    return mean.to(data.dtype), variance


def coarse_offset(mean: torch.Tensor, variance: float | None, source_dtype: torch.dtype) -> torch.Tensor:
    """The centring offset of ``source_dtype`` rows: their mean, or for 16-bit rows the mean rounded
    to a power-of-two grid near sigma / 256 (sigma: the root of the mean feature variance).

    The passes centre rows in float32 as ``x - offset``. A float32 mean has low bits that a bf16 or
    fp16 row lacks, so that difference is rounded, and the same way for every row of equal value:
    the rounding errors of a cluster's sums add up instead of cancelling (H200, 3.9M x 32 x 128 bf16,
    dense sums 3e-5 to 7e-5 off float64 relative, growing with n; ``scripts/sim_offset_sums.py``
    models it on the CPU). On the grid, that difference is exact for most rows (for every bf16 value
    of magnitude at least sigma / 2 within 2^16 sigma of the offset). A residual mean of at most
    sigma / 512 is nothing to the accuracy that centring is for."""
    if source_dtype not in (torch.float16, torch.bfloat16) or variance is None or not variance > 0:
        return mean
    step = 2.0 ** (math.floor(math.log2(math.sqrt(variance))) - 8)
    return torch.round(mean / step) * step


# k-means++ on streamed data runs on a uniform sample of the rows held on the GPU, at most this
# many bytes of it: k-means++ takes one pass per centroid, which over the host link would take hours.
_INIT_SAMPLE_BYTES = 1 << 31


def _init_sample(data: DataView, n_clusters: int, n_total: int, generator: torch.Generator, comm: Comm) -> DataView:
    """A uniform sample of all ranks' rows, transformed, the same on every rank, for k-means++."""
    cap = max(n_clusters, _INIT_SAMPLE_BYTES // (4 * data.n_features))
    size = min(n_total, max(1 << 18, 64 * n_clusters), cap)
    sample = comm.gather_rows(data.take(sample_shard(data.n_samples, size, n_total, generator, comm)))
    logger.info("init: k-means++ on a uniform sample of %d of %d rows (the data are streamed from the host)",
                sample.shape[0], n_total)
    return DataView(sample, data.dtype)


def resolve_init(init: InitLike, n_samples: int, n_features: int, n_clusters: int, in_memory: bool = True) -> InitLike:
    """The initialisation ``init="auto"`` stands for on data of this shape (``INIT_NAMES``' note):
    ``"k-means||"`` for many clusters over many rows held in memory, ``"k-means++"`` otherwise
    (streamed data: k-means++ on a sample, as that init's default there). Other values as given."""
    if not (isinstance(init, str) and init == "auto"):
        return init
    parallel = (in_memory and n_clusters >= AUTO_PARALLEL_MIN_CLUSTERS
                and n_samples * n_features >= AUTO_PARALLEL_MIN_ELEMENTS
                and n_samples >= AUTO_PARALLEL_ROWS_PER_CLUSTER * n_clusters)
    return "k-means||" if parallel else "k-means++"


def _initial_centroids(
    init: InitLike,
    data: DataView,
    n_clusters: int,
    generator: torch.Generator,
    sample_weight: torch.Tensor | None,
    given: torch.Tensor | None,
    comm: Comm | None = None,
    n_total: int | None = None,
) -> torch.Tensor:
    comm = comm or Comm()
    if given is not None:
        return given
    resolved = resolve_init(init, n_total or data.n_samples, data.n_features, n_clusters, data.in_memory)
    if resolved is not init:
        logger.debug("init='auto': %s for %d clusters over %d x %d rows", resolved, n_clusters,
                     n_total or data.n_samples, data.n_features)
        init = resolved
    if isinstance(init, str):
        if init == "k-means||":
            return kmeans_parallel(data, n_clusters, generator, sample_weight, comm)
        if init == "random":
            return random_rows(data, n_clusters, generator, sample_weight, comm)
        if not data.in_memory:
            sample = _init_sample(data, n_clusters, n_total or data.n_samples, generator, comm)
            return kmeans_plusplus(sample, n_clusters, generator)
        return kmeans_plusplus(data, n_clusters, generator, sample_weight, comm=comm)
    # A callable gets the data as the user passed it (this rank's shard) and returns centroids in
    # that space; rank 0's answer is the one every rank uses.
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    produced = init(data.x, n_clusters, seed)
    c = _to_data_space(check_centroids(produced, n_clusters, data.n_features, "init(...)"), data)
    return comm.broadcast_(c.contiguous())


def initial_centroids(
    x: torch.Tensor,
    n_clusters: int,
    *,
    init: InitLike = "auto",
    metric: str = "euclidean",
    sample_weight: torch.Tensor | None = None,
    random_state: SeedLike = None,
) -> torch.Tensor:
    """Initial centroids of ``x`` (a validated 2-D tensor) in its own space, without Lloyd iterations:
    what ``KMeans.partial_fit`` starts from, as scikit-learn's ``MiniBatchKMeans`` does."""
    check_n_clusters(n_clusters, x.shape[0])
    dtype = compute_dtype(x.dtype)
    normalize = metric == "cosine"
    if normalize:
        check_nonzero_rows(x)
    offset = None if normalize else _data_mean(DataView(x, dtype), sample_weight, Comm())[0]
    data = DataView(x, dtype, offset, normalize)
    given = None
    if not isinstance(init, str) and not callable(init):
        given = _to_data_space(check_centroids(init, n_clusters, x.shape[1], "init"), data)
    c = _initial_centroids(init, data, n_clusters, make_generator(random_state), sample_weight, given)
    return c if offset is None else c + offset


def _to_data_space(centroids: torch.Tensor, data: DataView) -> torch.Tensor:
    c = centroids.to(device=data.device, dtype=data.dtype)
    if data.offset is not None:
        c = c - data.offset
    if data.normalize:
        norms = torch.linalg.vector_norm(c, dim=1, keepdim=True)
        if bool((norms == 0).any()):
            raise ValueError('metric="cosine" needs non-zero initial centroids; init has an all-zero row')
        c = c / norms
    return c


def check_algorithm(algorithm: Any) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return algorithm


def check_params(
    n_clusters: Any, init: Any, n_init: Any, max_iter: Any, tol: Any, metric: Any
) -> tuple[int, int, int, float]:
    n_clusters = check_n_clusters(n_clusters)
    if isinstance(n_init, str):
        if n_init != "auto":
            raise TypeError(f"n_init must be an int or 'auto', got {n_init!r}")
        # scikit-learn's rule: one run from a seeding that spreads the centroids (or given ones),
        # ten from random rows or a callable.
        n_init = 10 if (isinstance(init, str) and init == "random") or callable(init) else 1
    n_init = check_positive_int(n_init, "n_init")
    max_iter = check_positive_int(max_iter, "max_iter")
    tol = check_nonnegative_float(tol, "tol")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if isinstance(init, str):
        if init not in INIT_NAMES:
            raise ValueError(f"init must be one of {INIT_NAMES}, an array of shape (n_clusters, n_features) or a callable; got {init!r}")
    elif not (isinstance(init, (torch.Tensor, np.ndarray)) or callable(init)):
        raise TypeError(f"init must be a string, a tensor/array or a callable, got {type(init).__name__}")
    return n_clusters, n_init, max_iter, tol


def _as_view(x: torch.Tensor, dtype: torch.dtype, offset: torch.Tensor | None, normalize: bool, precision: str,
             stream_to: torch.device | None, chunk_rows: int | None) -> DataView:
    if stream_to is None:
        return DataView(x, dtype, offset, normalize, precision)
    return StreamedView(x, dtype, offset, normalize, precision, compute_device=stream_to,
                        chunk_rows=chunk_rows or default_chunk_rows(x))


def _streams(x: torch.Tensor, target: torch.device, streaming: bool | None) -> bool:
    """Whether a fit of host rows ``x`` on ``target`` streams them (see ``fit``'s ``streaming``)."""
    if streaming not in (None, True, False):
        raise TypeError(f"streaming must be None, True or False, got {streaming!r}")
    if x.device.type != "cpu" or target.type == "cpu":
        if streaming:
            raise ValueError(f"streaming=True needs rows in host memory and a GPU to compute on; x is on {x.device}, "
                             f"the fit computes on {target} (pass device='cuda')")
        return False
    if streaming is None:
        streaming = not fits_on_device(x, target)
        if streaming:
            logger.info("x (%.3g GB) does not fit the free memory of %s: streaming it from the host each pass",
                        x.numel() * x.element_size() / 1e9, target)
    return streaming


def _subsample(data: DataView, sample_weight: torch.Tensor | None, size: int, n_total: int,
               generator: torch.Generator, comm: Comm) -> tuple[DataView, torch.Tensor | None]:
    """A uniform sample of about ``size`` of all ranks' rows, each rank sampling its shard in
    proportion, held on the compute device with the view's transform."""
    index = sample_shard(data.n_samples, size, n_total, generator, comm)
    rows = data.x.index_select(0, index.to(data.x.device)).to(data.device)
    w = None if sample_weight is None else sample_weight.index_select(0, index.to(sample_weight.device))
    return DataView(rows, data.dtype, data.offset, data.normalize, data.precision), w


@torch.no_grad()
@_ops.eager_launches
def fit(
    x: Any,
    n_clusters: int,
    *,
    init: InitLike = "auto",
    n_init: int | str = 1,
    max_iter: int = 300,
    tol: float = 1e-4,
    metric: str = "euclidean",
    sample_weight: Any = None,
    random_state: SeedLike = None,
    precision: str = "exact",
    deterministic: bool | None = None,
    algorithm: str = "auto",
    max_points_per_centroid: int | None = None,
    device: str | torch.device | None = None,
    streaming: bool | None = None,
    chunk_rows: int | None = None,
    distributed: Any = False,
    verbose: bool = False,
    progress: bool = False,
) -> KMeansResult:
    """Cluster the rows of ``x`` into ``n_clusters`` groups with Lloyd's k-means.

    Args take the meaning of :class:`torchkm.KMeans`'s (``precision``, ``deterministic``,
    ``max_points_per_centroid``, ``device``, ``streaming``, ``chunk_rows`` and ``distributed``
    included); ``x`` is a (n_samples, n_features) float tensor on any device, or a numpy array (a
    memory-mapped ``.npy`` too). Runs ``n_init`` fits and returns the one of lowest inertia,
    centroids in the input's space, on the device the fit computed on; labels stay with the rows
    (on the host for streamed data; this rank's shard's labels for a distributed fit). Fitting is
    not differentiable: ``x``, ``sample_weight`` and ``init`` may require grad (features straight
    out of a model), and nothing the fit returns does. A fit on
    the kernels of at most 2^22 rows keeps its engines (buffers, CUDA graphs) while ``x`` lives,
    unchanged, so that the next fit of ``x`` skips their set-up (:func:`torchkm.empty_cache`
    frees them; ``TORCHKM_REUSE_ENGINES=0`` turns this off).

    Example:
        >>> import torch, torchkm
        >>> x = torch.randn(1000, 16)
        >>> result = torchkm.fit(x, 10, random_state=0)
        >>> result.centroids.shape, result.labels.shape
        (torch.Size([10, 16]), torch.Size([1000]))
    """
    n_clusters, n_init, max_iter, tol = check_params(n_clusters, init, n_init, max_iter, tol, metric)
    check_precision(precision)
    check_algorithm(algorithm)
    if max_points_per_centroid is not None:
        max_points_per_centroid = check_positive_int(max_points_per_centroid, "max_points_per_centroid")
    if chunk_rows is not None:
        chunk_rows = check_positive_int(chunk_rows, "chunk_rows")
    if algorithm in ("pruned", "triangle") and deterministic:
        raise ValueError(f"algorithm={algorithm!r} sums clusters with atomics; deterministic=True needs algorithm='lloyd'")
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    comm = Comm(resolve_group(distributed))
    normalize = metric == "cosine"
    with comm.agree():
        # Host data that may be streamed is not copied (a memory map stays a memory map) nor read
        # whole here; its values are checked on the way through.
        x = as_data_tensor(x, "x", check_finite=False, copy_readonly=False)
        target = x.device if device is None else check_device(device)
        stream_to = target if _streams(x, target, streaming) else None
        if stream_to is None:
            x = x.to(target)
        n, d = x.shape
        dtype = compute_dtype(x.dtype)
        weights = check_sample_weight(sample_weight, x, dtype)
        weights = None if weights is None else weights.to(target)
        # Unweighted rows in GPU memory of one process: their mean and variance come from one
        # reduction per chunk and one host sync, which also finds non-finite rows (see below).
        # Elsewhere every rank checks its rows here, before any collective.
        moments = stream_to is None and weights is None and not comm.active and x.device.type == "cuda"
        if stream_to is None and not moments:
            ensure_finite(x, "x")
        if normalize:
            check_nonzero_rows(x)
    n_total = n if not comm.active else int(comm.sum_(torch.tensor([n], dtype=torch.float64, device=target))[0])
    check_n_clusters(n_clusters, n_total)
    # Centering keeps ||x||^2 - 2 x.c + ||c||^2 accurate for data far from the origin.
    # Streamed rows are read once for both the mean and the variance that scales tol.
    # 16-bit rows' offset is rounded to a grid set by the variance (``coarse_offset``), which their
    # mean's pass then also finds.
    half = x.dtype in (torch.float16, torch.bfloat16)
    if moments:
        mean, variance = _moments(_as_view(x, dtype, None, normalize, precision, None, None))
        offset = None if normalize else mean
    else:
        offset, variance = (None, None) if normalize else _data_mean(
            _as_view(x, dtype, None, False, precision, stream_to, chunk_rows), weights, comm,
            with_variance=stream_to is not None or half)
    if offset is not None:
        offset = coarse_offset(offset, variance, x.dtype)
    data = _as_view(x, dtype, offset, normalize, precision, stream_to, chunk_rows)

    given = None
    if not isinstance(init, str) and not callable(init):
        given = _to_data_space(check_centroids(init, n_clusters, d, "init"), data)
        if n_init != 1:
            warnings.warn(
                f"explicit initial centroids were given, so n_init={n_init} runs would all be identical; running once",
                RuntimeWarning,
                stacklevel=3,
            )
            n_init = 1

    generator = make_generator(random_state, comm)
    train, train_weights = data, weights
    if max_points_per_centroid is not None and n_total > max_points_per_centroid * n_clusters:
        train, train_weights = _subsample(data, weights, max_points_per_centroid * n_clusters, n_total, generator, comm)
        n_train = int(comm.sum_(torch.tensor([train.n_samples], dtype=torch.float64, device=target))[0])
        logger.info("max_points_per_centroid=%d: Lloyd iterations on a uniform sample of %d of %d rows; "
                    "labels and inertia are of all rows", max_points_per_centroid, n_train, n_total)
    if variance is None or train is not data:
        variance = _feature_variance_mean(train, train_weights, comm)
    tol_abs = tol * variance
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_init * max_iter, desc="k-means", unit="it", leave=False, disable=comm.rank != 0)
    best: KMeansResult | None = None
    try:
        for run in range(n_init):
            t0 = time.perf_counter()
            c0 = _initial_centroids(init, train, n_clusters, generator, train_weights, given, comm, n_total)
            t_init = time.perf_counter() - t0

            def on_iteration(stats: IterationStats, run: int = run) -> None:
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(run=run + 1, inertia=f"{stats.inertia:.6g}", changed=stats.labels_changed, refresh=False)
                if verbose and comm.rank == 0:
                    logger.info(
                        "run %d iter %d: inertia %.6g, shift %.3g, %d labels changed, %d empty, %.3fs",
                        run + 1, stats.iteration, stats.inertia, stats.center_shift,
                        stats.labels_changed, stats.empty_clusters, stats.seconds,
                    )

            out = lloyd(
                train, c0, sample_weight=train_weights, max_iter=max_iter, tol=tol_abs,
                deterministic=deterministic, algorithm=algorithm, on_iteration=on_iteration, comm=comm,
            )
            if bar is not None:
                bar.update(max_iter - out.n_iter)
            if verbose and comm.rank == 0:
                how = "converged" if out.converged else "stopped at max_iter"
                logger.info(
                    "run %d: %s after %d iterations, inertia %.6g (init %.3fs)", run + 1, how, out.n_iter, out.inertia, t_init
                )
            if best is None or out.inertia < best.inertia:
                best = out
    finally:
        if bar is not None:
            bar.close()
    assert best is not None
    # Identical on every rank already (the same all-reduced sums); the broadcast makes it a guarantee.
    comm.broadcast_(best.centroids)
    if train is not data:
        best.labels, sq = _ops.assign(data, best.centroids)
        best.inertia = float(comm.sum_(weighted_sum(_metric_distance(sq, normalize), weights).double().reshape(1))[0])
    if not data.in_memory:
        best.labels = best.labels.cpu()

    if offset is not None:
        best.centroids = best.centroids + offset
    present = torch.zeros(n_clusters, dtype=torch.float64, device=target)
    present[best.labels.to(target)] = 1.0
    n_distinct = int((comm.sum_(present) > 0).sum())
    if n_distinct < n_clusters:
        # A run that converged relocated every cluster its passes emptied, so the final labels leave
        # one empty where rows coincide; one stopped by max_iter may end on a pass that emptied one.
        why = (f"x probably has fewer than {n_clusters} distinct points (duplicate centroids are returned)"
               if best.converged else
               f"the best run stopped at max_iter={max_iter} after a pass that left clusters empty, before they "
               f"were refilled (or x has fewer than {n_clusters} distinct points); raise max_iter")
        warnings.warn(
            f"only {n_distinct} distinct clusters were found for n_clusters={n_clusters}: {why}",
            ConvergenceWarning,
            stacklevel=3,
        )
    return best
