"""Lloyd iterations on the kernels: four launches each, over buffers kept from one iteration to the next.

An iteration is ``prepare_centroids`` (operands of the pass, accumulators cleared), the fused
assignment pass with its sums, the exact mode's re-search, and ``finish_update`` (centroids moved
to the means in place, statistics written). Small problems run blocks of iterations with one host
synchronisation: each iteration of a block checks the previous one's statistics on the device and
does nothing once a stopping rule has fired, so the state the host finds after a block is that of
the iteration that stopped. A block may be launched behind one the host has not read yet
(``run_block(follow=True)``): it starts from the state that one leaves, so it is frozen from its
first pass where that one stopped. With CUDA graphs, one iteration is captured and replayed (``ReplayedPass``).
A data-parallel fit all-reduces the pass's accumulators between the pass and ``finish_update``.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch
import triton

from ._common import capture, launch_key, onehot_max_k, warm_graphs
from .assign import SMALL_D, AssignPass
from .centroids import finish_update
from .configs import dense_moves
from .distances import labelled_sq_distances
from .update import RELOCATE_MAX, float64_sums, relocate_to_farthest

__all__ = ["LloydEngine", "ReplayedEngine", "ReplayedPass", "capture", "device_tol", "launch_key"]

logger = logging.getLogger("torchkm")


def device_tol(tol: float) -> float:
    """``tol`` as the device compares it: blocks freeze when shift <= tol in fp32, and rounding tol
    up there means they freeze whenever the host (in float64) would stop."""
    tol32 = np.float32(tol) if math.isfinite(tol) else np.float32(-1.0)
    return float(np.nextafter(tol32, np.float32(np.inf)) if float(tol32) < tol else tol32)


class ReplayedPass:
    """A pass run many times without a host synchronisation: the first time eagerly (its kernels
    compile), the second captured as a CUDA graph (with ``graphs``) and from then on replayed.
    A pass whose ``warm_key`` (``launch_key``) matches one that already ran eagerly in this process
    has its kernels compiled: it is captured at its first call (a fit after the first of the same
    shape, e.g. ``n_init > 1``, saves one eager pass of host time).

    Capturing a whole block of passes costs the host as much as running it eagerly: about 1 ms per
    iteration at 245,760 x 32, more than a short fit spends on the GPU. One captured pass replayed
    costs the host a few microseconds. Each call says how it ran (``"first"``, ``"eager"``,
    ``"capture"`` or ``"replay"``). With ``timed``, each call after the first is timed: replays on
    the device (CUDA events around the replay, so a capture's replay counts too), eager passes on
    the device where ``device`` is CUDA, on the host elsewhere; ``seconds()`` (after a host sync)
    lists them for the calls since ``begin()``, None for the first call (it compiles).
    """

    _warm_keys: ClassVar[set[tuple]] = set()  # keys of passes that ran eagerly in this process

    def __init__(self, run: Callable[[], None], device: torch.device, graphs: bool, timed: bool = False,
                 warm_key: tuple | None = None):
        self.run, self.device, self.timed, self.warm_key = run, device, timed, warm_key
        self.use_graphs = graphs and device.type == "cuda"
        if self.use_graphs:
            warm_graphs(device)  # so that the host time of this pass's capture is its own
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        self._marks: list = []
        self.host_seconds: list[float] = []  # host time of each call since ``begin``
        # Of that, the time spent issuing the pass's launches (a capture records them, then builds
        # its graph): what an eager pass keeps the host busy for while the device runs it.
        self.launch_seconds: list[float | None] = []
        # Host time of the last eager or capturing calls (not the first, which compiles): what a
        # replay saves, which a kept engine's next run (only replays) can no longer measure; and
        # of their launches alone.
        self.setup_host_seconds: collections.deque[float] = collections.deque(maxlen=16)
        self.setup_launch_seconds: collections.deque[float] = collections.deque(maxlen=16)
        self.kinds: list[str] = []  # how each call since ``begin`` ran
        self._single: str | None = None
        # Timing events, reused block after block (the call at position i of a block records pair
        # i), and the stream they record on, looked up once a block: on an H200 host a pair of
        # ``Event.record()`` calls took 26 us, 19 of them looking up the current stream; timing a
        # block of 8 passes cost about 0.2 ms, 4 % of a 5 ms fit (245,760 x 32, k = 32).
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._stream: torch.cuda.Stream | None = None

    def begin(self, single: str | None = None) -> None:
        """Start a block of calls; ``single``: instead, the engine runs one pass of its own, of that
        kind, outside (untimed)."""
        self._marks, self.host_seconds, self.launch_seconds, self.kinds, self._single = [], [], [], [], single
        self._stream = None

    def since_begin(self) -> tuple:
        """The calls since ``begin``, as ``read`` takes them: kept by an engine that queues a block
        behind this one (``begin`` starts new lists, so these stay as they are)."""
        return self._single, self.kinds, self._marks, self.host_seconds, self.launch_seconds

    def read(self, rows: int, calls: tuple) -> tuple[list[str], list[float | None], list[float | None], list[float | None]]:
        """How each of the first ``rows`` of ``calls`` (``since_begin``) ran, its time (``seconds``),
        its host time and the part of that spent issuing its launches; call after a host sync."""
        single, kinds, marks, host_seconds, launch_seconds = calls
        if single is not None:
            return [single], [None], [None], [None]
        return kinds[:rows], self.seconds(marks)[:rows], list(host_seconds[:rows]), list(launch_seconds[:rows])

    def _timed(self, run: Callable[[], None]):
        if not self.timed:
            run()
            return None
        if self.device.type != "cuda":
            started = time.perf_counter()
            run()
            return time.perf_counter() - started
        if self._stream is None:
            self._stream = torch.cuda.current_stream(self.device)
        position = len(self._marks)
        while len(self._events) <= position:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        events = self._events[position]
        events[0].record(self._stream)
        run()
        events[1].record(self._stream)
        return events

    def __call__(self) -> str:
        started = time.perf_counter()
        mark = None
        launched: float | None = None
        if self.graph is not None:
            mark = self._timed(self.graph.replay)
            how = "replay"
        elif self.use_graphs and (self.calls >= 1 or (self.warm_key is not None and self.warm_key in self._warm_keys)):
            def recorded() -> None:
                nonlocal launched
                begun = time.perf_counter()
                self.run()
                launched = time.perf_counter() - begun

            try:
                graph = capture(recorded, self.device)
            except RuntimeError as err:  # capture unsupported here: stay eager
                logger.debug("CUDA graph capture failed (%s); running passes eagerly", err)
                self.use_graphs = False
                mark = self._timed(self.run)
                how = "eager"
            else:
                self.graph = graph
                mark = self._timed(graph.replay)
                how = "capture"
        elif self.calls == 0:
            self.run()
            how = "first"
            if self.warm_key is not None:
                self._warm_keys.add(self.warm_key)
        else:
            mark = self._timed(self.run)
            how = "eager"
        self.calls += 1
        self.kinds.append(how)
        self._marks.append(mark)
        self.host_seconds.append(time.perf_counter() - started)
        self.launch_seconds.append(None if how == "first" else launched if how == "capture" else self.host_seconds[-1])
        if how in ("eager", "capture"):
            self.setup_host_seconds.append(self.host_seconds[-1])
            launch = self.launch_seconds[-1]
            assert launch is not None  # (a capture records its launches)
            self.setup_launch_seconds.append(launch)
        return how

    @staticmethod
    def seconds(marks: list) -> list[float | None]:
        """The time of each call of ``marks`` (``since_begin``; see the class docstring); call after
        a host sync."""
        return [m if m is None or isinstance(m, float) else m[0].elapsed_time(m[1]) * 1e-3 for m in marks]


class ReplayedEngine:
    """What the engines that run their passes through a ``ReplayedPass`` (``_passes``) share: how
    each pass of the last ``read`` ran (``pass_kinds``), its time on the device and on the host
    (``pass_seconds``, ``pass_host_seconds``, ``pass_launch_seconds``: see ``ReplayedPass``), and
    whether passes are timed."""

    _passes: ReplayedPass
    c: torch.Tensor
    inputs: dict[str, torch.Tensor | None]
    control: torch.Tensor
    stats_prev: torch.Tensor
    log: torch.Tensor
    _go: torch.Tensor
    _go_control: torch.Tensor
    pass_kinds: list[str]
    pass_seconds: list[float | None]
    pass_host_seconds: list[float | None]
    pass_launch_seconds: list[float | None]

    @property
    def timed(self) -> bool:
        """Whether passes are timed; timing costs the host a little per block."""
        return self._passes.timed

    @timed.setter
    def timed(self, value: bool) -> None:
        for run in self._replayed_passes():
            run.timed = value

    def _replayed_passes(self) -> list[ReplayedPass]:
        """Every ``ReplayedPass`` of the engine's blocks (one kind of pass here)."""
        return [self._passes]

    def _init_passes(self, run: Callable[[], None], device: torch.device, graphs: bool, timed: bool, block: int,
                     width: int, warm_key: tuple | None = None, recorded: bool = True) -> None:
        """The block state: ``run`` as a ``ReplayedPass``, a ``log`` of ``block`` records of ``width``
        values, and the statistics a pass of a block checks: the previous pass's (``stats_prev``)
        and ``control`` = [frozen, 1, log row, 0] (see ``prepare_centroids``, ``finish_update``). A
        block starts unfrozen, after a "previous pass" that stops nothing, at log row 0: one copy
        of ``_go`` into ``_block_state``, of which ``control`` and ``stats_prev`` are views.
        ``recorded``: each pass's ``finish_update`` writes its record into ``log`` and
        ``stats_prev`` itself (``record=self.recording``); else (``recording`` None)
        ``_run_passes`` copies the record into ``log`` after each pass, and the pass must copy
        ``stats_prev`` itself."""
        self._passes = ReplayedPass(run, device, graphs, timed, warm_key)
        # Two halves of ``block`` rows: a block's records are read from one while the block queued
        # behind it (``run_block(follow=True)``) writes the other. A block's records are copied to
        # pinned host memory behind it, so that reading them waits for that block alone.
        self.log_rows = block
        self.log = torch.zeros(2 * block, width, dtype=torch.float64, device=device)
        self._host_log = (torch.zeros(2 * block, width, dtype=torch.float64, pin_memory=True)
                          if device.type == "cuda" else None)
        self._log_events = [torch.cuda.Event() for _ in range(2)] if device.type == "cuda" else None
        self._queued: collections.deque = collections.deque()  # (first row, calls, event) of each unread block
        self._half = 0  # the half of ``log`` the next block writes
        self._block_state = torch.zeros(6, dtype=torch.float64, device=device)
        self.control = self._block_state[:2].view(torch.int32)
        self.stats_prev = self._block_state[2:]
        # The block state at the start of a block writing each half: log row 0 or ``block``.
        go = [torch.cat([torch.tensor([0, 1, half * block, 0], dtype=torch.int32).view(torch.float64),
                         torch.tensor([0.0, float("inf"), 1.0, 0.0], dtype=torch.float64)]) for half in (0, 1)]
        self._go = torch.stack(go).to(device)
        self._go_rows = self._go[:, :2].view(torch.int32)[:, 2:3]
        self.recording = (self.log, self.stats_prev) if recorded else None
        self._relocations: dict[int, ReplayedPass] = {}  # (``relocate``) by the moves it makes
        self.pass_kinds, self.pass_seconds, self.pass_host_seconds, self.pass_launch_seconds = [], [], [], []

    def _start_from(self, centroids: torch.Tensor, offset: torch.Tensor | None) -> None:
        """What a restart on the same rows copies in (the engines that can restart, ``restart``):
        ``centroids`` and ``offset``, the new run's mean row, where given (the engine holds its own
        copy); buffers and graphs are kept."""
        self.c.copy_(centroids)
        if offset is not None:
            self.inputs["offset"].copy_(offset)
        self.discard_queued()

    @property
    def setup_host_seconds(self) -> list[float]:
        """Host seconds of the last (up to 16) eager or capturing passes the engine ran (``ReplayedPass``)."""
        return list(self._passes.setup_host_seconds)

    @property
    def setup_launch_seconds(self) -> list[float]:
        """Of ``setup_host_seconds``, the host seconds spent issuing each pass's launches."""
        return list(self._passes.setup_launch_seconds)

    # Whether ``relocate`` serves the engine (its ``x``, ``labels``, ``sums``, ``counts`` in the
    # caller's row order, its centroids moved by ``finish_update``).
    relocates_on_device = False
    _relocation_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    normalize: bool
    x: torch.Tensor
    labels: torch.Tensor
    sums: torch.Tensor
    counts: torch.Tensor
    c_old: torch.Tensor

    def _relocation_outputs(self) -> dict:
        """What else ``finish_update`` writes for this engine when a relocation moves its centroids."""
        return {}

    def _relocation_scores(self) -> torch.Tensor:
        """Each row's squared distance to its centroid of the last pass, by which a relocation ranks
        the rows (float32, (n,)): the engine's ``sq_distances`` where it keeps them."""
        return self.sq_distances

    def _relocate_run(self, max_moves: int) -> None:
        inp = self.inputs
        relocate_to_farthest(self.x, self._relocation_scores(), self.labels, self.sums, self.counts, max_moves,
                             sample_weight=inp["sample_weight"], offset=inp["offset"], row_scale=inp["row_scale"])
        self.c.copy_(self.c_old)
        assert self._relocation_state is not None
        stats, no_inertia, no_changed = self._relocation_state
        stats.zero_()
        finish_update(self.sums.unsqueeze(0), self.counts.unsqueeze(0), self.c, no_inertia, no_changed, stats,
                      normalize=self.normalize, old_centroids=self.c_old, sums=self.sums, counts=self.counts,
                      **self._relocation_outputs())

    def relocate(self, n_empty: int, follow: bool = False) -> torch.Tensor:
        """Empty-cluster relocation after the last pass, by scikit-learn's rule: its ``n_empty``
        empty clusters, in index order, each take one of the rows farthest from their centroids
        (``update.relocate_to_farthest``: farthest first, ties to the lower row), which leave their
        own clusters' sums; then the centroids go to the new means of the last update's start
        ``c_old`` (``finish_update``: the changed clusters' means, the others' the same, as
        ``_loop.new_centroids`` computes them; for the bounds engine, the moves its next settle
        pass lowers the bounds by). Returns the total squared move of the centroids from ``c_old``
        (float64, on the device): no host sync.

        Its launches (the dense engine's rows' distances to their centroids, the two of
        ``relocate_to_farthest``, the centroid update) run as a ``ReplayedPass`` per power of two
        of moves up to ``RELOCATE_MAX`` (a CUDA graph from its second call, or its first where its
        kernels have run in this process). The host's time between the block that found the empty
        cluster and the next one was 0.63-0.74 ms of launches (H100, 2026-12-06, 245,760 x 32,
        k = 1,024: ``torch.topk``, ``nonzero_static``, the moves, the update); a replay takes it
        0.013-0.020 ms, and fits that relocated twice there took 10-13 % less time (H100, same day).

        ``follow``: a block launched next with ``run_block(follow=True)`` continues from the
        relocation, so that it can be launched before the shift is read (``relocation_shift``,
        which waits for the relocation alone): it starts unfrozen, after a "pass" that moved the
        centroids by the relocation's shift with labels changed and no cluster empty, so its first
        pass freezes only where that shift meets tol (or the block's budget is spent)."""
        if self._relocation_state is None:  # [stats], and the pass partials finish_update adds: none
            device = self.c.device
            self._relocation_state = (torch.zeros(4, dtype=torch.float64, device=device),
                                      torch.zeros(1, dtype=torch.float32, device=device),
                                      torch.zeros(1, dtype=torch.int32, device=device))
        if n_empty > RELOCATE_MAX:
            self._relocate_run(n_empty)
        else:
            moves = triton.next_power_of_2(n_empty)
            run = self._relocations.get(moves)
            if run is None:
                key = launch_key("relocate", self.c.shape[0], {"x": self.x, "labels": self.labels, **self.inputs},
                                 engine=self.kernel, moves=moves, normalize=self.normalize)
                run = ReplayedPass(functools.partial(self._relocate_run, moves), self.c.device,
                                   self._passes.use_graphs, warm_key=key)
                self._relocations[moves] = run
            run.begin()
            run()
        shift = self._relocation_state[0][1]
        self._shift_copied = follow and self.c.device.type == "cuda"
        if follow:
            if self.recording is None:
                raise ValueError("only engines whose passes record themselves follow a relocation (one process)")
            self._block_state.copy_(self._go[self._half])
            self.stats_prev[1:2].copy_(shift.view(1))
            if self._shift_copied:
                if self._shift_event is None:
                    self._host_shift = torch.zeros(1, dtype=torch.float64, pin_memory=True)
                    self._shift_event = torch.cuda.Event()
                self._host_shift.copy_(shift.view(1), non_blocking=True)
                self._shift_event.record(torch.cuda.current_stream(self.c.device))
        return shift

    _shift_event: torch.cuda.Event | None = None
    _host_shift: torch.Tensor
    _shift_copied = False  # (the last relocation's shift is copied to the host behind it)

    def relocation_shift(self) -> float:
        """The shift of the last ``relocate``, waiting for the relocation alone (not for a block
        launched behind it with ``follow``)."""
        if self._shift_copied:
            assert self._shift_event is not None
            self._shift_event.synchronize()
            return float(self._host_shift[0])
        assert self._relocation_state is not None
        return float(self._relocation_state[0][1])

    def _read_passes(self, rows: int, calls: tuple) -> None:
        """How each of the first ``rows`` passes of a block ran, and its times, in the order they
        ran (``ReplayedPass.read`` of each kind, over the block's ``calls`` kept by ``_queue``)."""
        order, runs = calls
        if runs[id(self._passes)][0] is not None or all(run is self._passes for run in order[:rows]):
            self.pass_kinds, self.pass_seconds, self.pass_host_seconds, self.pass_launch_seconds = self._passes.read(
                rows, runs[id(self._passes)])
            return
        reads = {id(run): [iter(v) for v in run.read(rows, runs[id(run)])] for run in self._replayed_passes()}
        self.pass_kinds, self.pass_seconds, self.pass_host_seconds, self.pass_launch_seconds = (
            [next(reads[id(run)][i]) for run in order[:rows]] for i in range(4))

    def _next_pass(self) -> ReplayedPass:
        """The kind of pass a block runs next (one kind here)."""
        return self._passes

    def _run_passes(self, passes: int, record: torch.Tensor, follow: bool = False) -> None:
        """``passes`` passes with no host sync, each ``record`` in ``log`` (written by the pass, or
        copied after it), queued for ``read``; the first one sees a control that is not frozen and a
        previous pass that stops nothing, or with ``follow`` the state the last block left (frozen
        if it stopped, its last pass's statistics): see ``run_block``."""
        if passes > self.log_rows:
            raise ValueError(f"a block of {passes} passes: at most {self.log_rows} (the engine's block)")
        half = self._half
        if follow:
            if self.timed:  # (the timing events of a block are reused by the next one)
                raise ValueError("a block queued behind another is not timed: set timed = False")
            if self.recording is None:
                raise ValueError("only passes that record themselves follow a block (one process)")
            self.control[2:3].copy_(self._go_rows[half])
        else:
            self._block_state.copy_(self._go[half])
        for run in self._replayed_passes():
            run.begin()
        self._order: list[ReplayedPass] = []  # the kind of each pass of the block, for ``_read_passes``
        base = half * self.log_rows
        for i in range(passes):
            run = self._next_pass()
            run()
            self._order.append(run)
            if self.recording is None:
                self.log[base + i].copy_(record)
        self._queue(half, passes)

    def _queue(self, half: int, rows: int) -> None:
        """Queue the records of the block just launched (``rows`` from the start of ``half``) for
        ``read``; the next block writes the other half."""
        if len(self._queued) > 1:
            raise RuntimeError("at most two blocks are queued (the log has two halves): read one first")
        base = half * self.log_rows
        event = None
        if self._host_log is not None:
            self._host_log[base:base + rows].copy_(self.log[base:base + rows], non_blocking=True)
            event = self._log_events[half]
            # (On the log's device: the current device may be another.)
            event.record(torch.cuda.current_stream(self.log.device))
        calls = (self._order, {id(run): run.since_begin() for run in self._replayed_passes()})
        self._queued.append((base, calls, event))
        self._half = 1 - half

    def _queue_single(self) -> None:
        """Queue the record of a pass run outside a block, in ``log[0]`` (``iterate``)."""
        if self._queued:
            raise RuntimeError("a pass outside a block runs with no block queued: read or discard them first")
        self._order = [self._passes]
        self._queue(0, 1)

    def _read_log(self, rows: int) -> list[list[float]]:
        """The records of the first ``rows`` passes of the oldest unread block (waiting for that
        block alone), and how its passes ran (``pass_kinds`` ...)."""
        if not self._queued:
            raise RuntimeError("no block to read: run_block or iterate first")
        base, calls, event = self._queued.popleft()
        if event is None:
            values = self.log[base:base + rows].tolist()
        else:
            event.synchronize()
            values = self._host_log[base:base + rows].tolist()
        self._read_passes(rows, calls)
        return values

    def discard_queued(self) -> None:
        """Forget the blocks not read (a block queued behind one that stopped: all its passes were
        frozen); the next block is the first of its own."""
        self._queued.clear()
        self._half = 0


class LloydEngine(ReplayedEngine):
    """The state of a Lloyd run on the kernels.

    ``c`` (k, d) float32 centroids (updated in place), ``c_old`` those before the last update,
    ``labels`` (n,) int32/int64 updated in place, ``sums``/``counts`` of the last pass, and ``log``
    (block, 4) float64: ``[inertia, shift, changed, empty]`` of each iteration since the last
    ``read``. ``block > 1`` makes ``run_block`` run blocks of iterations (module docstring);
    ``timed``: ``pass_seconds`` holds the time of each iteration of the last ``read`` (see
    ``ReplayedPass``), ``pass_kinds`` how each ran.

    ``moves`` (default: where ``configs.dense_moves`` says so and the engine can): the sums are
    kept in float64 across passes and each pass moves only the rows whose label changed (the
    bounds engine's ``AssignPass(moves=True)``), instead of adding every row into fresh fp32 sums.
    Float64 sums of fp32 rows come out the same in any order of the atomics, so fits repeat (with
    fp32 sums, fits of one start at 3.9M x 32, k = 1,024 ended 633-946 labels and up to 13
    iterations apart; H200, 2026-12-05; with moves, none apart: H100, 2026-12-05), and they are the
    bounds engine's sums, so dense and pruned fits take the same steps. Rows on fp32 ties parted
    them (the engines sum direct distances in other orders: at 3.9M x 32, k = 1,024 they ended 65
    rows apart in the same 127 iterations at sigma^2 = 0.0125, and 3,266 rows and 99 against 122
    iterations apart at 0.05, H100); both now settle such rows in float64 (``_common.fp32_tie``),
    and a dense and a pruned fit there ended with identical labels in the same 109 iterations
    (sigma^2 = 0.0125) and 107 iterations (0.05; H100, 2026-12-05). On by default for rows of at
    most 32 features (``configs.dense_moves``: wider rows pay 5-9 % for it). The base they start from: the rows by their labels
    (``update.float64_sums``) when a run starts or restarts; rows labelled -1 (a fit's first pass
    ahead) join their cluster in that pass. Needs one process (each rank would move its own rows in
    sums that every rank holds whole), rows of more than ``SMALL_D`` features (the tensor-core
    pass) and more than ``onehot_max_k`` clusters: fewer are summed by one-hot products (whose
    persistent programs, ``_common.carries``, walk no row list), and there per-row float64 atomics
    would queue on few addresses.
    """

    kernel = "lloyd"
    relocates_on_device = True
    # One more pass (``iterate(has_prev=True)``) labels the rows by the current ``c`` and reads their inertia;
    # the update it then makes is dropped (a fit's final labels: ``torchkm._loop.lloyd``).
    labels_by_one_more_pass = True

    def __init__(
        self, x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor, *, precision: str,
        offset: torch.Tensor | None, row_scale: torch.Tensor | None, raw_norms: torch.Tensor | None,
        sample_weight: torch.Tensor | None, normalize: bool, tol: float, block: int = 1, graphs: bool = False,
        all_reduce: Callable[[torch.Tensor], object] | None = None, timed: bool = False, moves: bool | None = None,
    ):
        k, d = centroids.shape
        device = x.device
        self.x, self.labels, self.block, self.normalize = x, labels, max(1, block), normalize
        # The engine's own copy of the offset, which ``restart`` overwrites.
        self.inputs = {"offset": None if offset is None else offset.clone(), "row_scale": row_scale,
                       "raw_norms": raw_norms, "sample_weight": sample_weight}
        can_move = all_reduce is None and d > SMALL_D and k > onehot_max_k(d)
        if moves is None:
            moves = can_move and dense_moves(d)
        elif moves and not can_move:
            raise ValueError(f"float64 moves need one process, d > {SMALL_D} and more than {onehot_max_k(d)} clusters")
        self.moves = moves
        self._rebase = moves  # the float64 base is taken before the next pass (``_take_base``)
        self.assign_pass = AssignPass(x, k, precision, update=True, scaled=row_scale is not None, fixed_rows=True,
                                      moves=moves)
        self.c = centroids.to(torch.float32).contiguous().clone()
        self.c_old = torch.empty_like(self.c)
        self.sums = torch.empty(k, d, dtype=torch.float32, device=device)
        self.counts = torch.empty(k, dtype=torch.float32, device=device)
        self.stats = torch.zeros(4, dtype=torch.float64, device=device)
        self.tol_device = device_tol(tol)
        self.all_reduce = all_reduce
        self._summed_stats = torch.tensor([0, 2], device=device)  # inertia and changed add up over shards
        # Collectives stay outside graphs: a replay would also replay the all-reduce of a stale buffer.
        # (Data-parallel: the statistics are all-reduced after the update, so they are copied after.)
        self._init_passes(self._block_iteration, device, graphs and all_reduce is None, timed, self.block, 4,
                          launch_key("lloyd", k, {"x": x, "labels": labels, **self.inputs}, precision=precision,
                                     normalize=normalize), recorded=all_reduce is None)

    def restart(self, centroids: torch.Tensor, offset: torch.Tensor | None = None) -> None:
        """Start another run on the same rows from ``centroids`` (``ReplayedEngine._start_from``)."""
        self._start_from(centroids, offset)
        self._rebase = self.moves

    _far_sq: torch.Tensor | None = None

    def relocate(self, n_empty: int, follow: bool = False) -> torch.Tensor:
        if self._far_sq is None:  # (made outside the relocation's capture, which reuses it)
            self._far_sq = torch.empty(self.x.shape[0], dtype=torch.float32, device=self.x.device)
        return super().relocate(n_empty, follow)

    def _relocation_scores(self) -> torch.Tensor:
        # Each row's distance to the centroid the last pass gave it: the pass keeps none of its own.
        inp = self.inputs
        return labelled_sq_distances(self.x, self.c_old, self.labels, offset=inp["offset"], row_scale=inp["row_scale"],
                                     out=self._far_sq)

    def _take_base(self) -> None:
        """With ``moves``, at a run's first pass: the float64 sums and counts the passes move rows
        between, those of the rows by their current labels. A new fit's rows are all labelled -1
        (none counts: its first pass adds every row); a run the hybrid hands back to this engine
        starts from the labels of the other engine's last pass."""
        if not self._rebase:
            return
        p, inp = self.assign_pass, self.inputs
        float64_sums(self.x, self.labels, self.c.shape[0], sample_weight=inp["sample_weight"], offset=inp["offset"],
                     row_scale=inp["row_scale"], out=(p.move_sums[0], p.move_counts[0]))
        self._rebase = False

    def _iteration(self, has_prev: bool, in_block: bool) -> None:
        control = self.control if in_block else None
        p = self.assign_pass
        p(
            self.x, self.c, **self.inputs, prev_labels=self.labels if has_prev or self.moves else None,
            labels=self.labels, zero=(self.stats,), control=control, stats_prev=self.stats_prev if in_block else None,
            iteration=0, tol=self.tol_device, moves=self.moves, clear=not self.moves,
        )
        if self.all_reduce is not None:
            # Every rank has the same replica layout (it depends on k and d only), so summing the
            # raw accumulators gives each rank the sums of all shards, and the same update.
            self.all_reduce(p.acc)
        sums, counts = (p.move_sums, p.move_counts) if self.moves else (p.acc_sums, p.acc_counts)
        finish_update(sums, counts, self.c, p.part_inertia, p.part_changed, self.stats,
                      normalize=self.normalize, old_centroids=self.c_old, sums=self.sums, counts=self.counts,
                      control=control, record=self.recording if in_block else None)
        if self.all_reduce is not None:
            summed = self.stats.index_select(0, self._summed_stats)
            self.all_reduce(summed)
            self.stats.index_copy_(0, self._summed_stats, summed)

    def _block_iteration(self) -> None:
        self._iteration(True, in_block=True)
        if self.recording is None:
            self.stats_prev.copy_(self.stats)

    def iterate(self, has_prev: bool) -> None:
        """One iteration, its statistics the first row of the next ``read``: with ``has_prev`` a
        block of one; without, the first iteration of a run (no previous labels: other kernels)."""
        if has_prev:
            self.run_block(1)
            return
        self._passes.begin(single="initial")
        if self.moves:  # no previous labels: every row joins its cluster
            self.labels.fill_(-1)
            self.assign_pass.move_acc.zero_()
            self._rebase = False
        self._iteration(False, in_block=False)
        self.log[0].copy_(self.stats)
        self._queue_single()

    def run_block(self, iterations: int, follow: bool = False) -> None:
        """Up to ``iterations`` (<= block) iterations after the first, with no host sync: an
        iteration after one that met a stopping rule, or left a cluster empty, does nothing.
        ``follow``: the block continues the one launched before it, read or not (so a block can be
        queued behind one the host has yet to read): frozen from its start where that one stopped."""
        self._take_base()
        self._run_passes(iterations, self.stats, follow)

    def read(self, rows: int) -> list[list[float]]:
        """The statistics of the first ``rows`` iterations of the oldest block (or ``iterate``) not
        yet read (waiting for that block alone)."""
        return self._read_log(rows)
