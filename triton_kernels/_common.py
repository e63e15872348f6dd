"""Pieces shared by the kernels: reading transformed rows, and adding rows into per-cluster sums."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

# How a pass adds its rows into the per-cluster sums: not at all; a one-hot product per tile of rows
# and one atomic per (cluster, feature) per tile; one atomic per (row, feature); or the one-hot
# product carried across all the tiles a (persistent) program walks, with its atomics issued once,
# when the program ends (``carries``); or, for rows whose label changed only, moving the row from its
# previous cluster's float64 sums to its new one's (``move_rows``: sums kept across passes).
UPDATE_NONE, UPDATE_ONEHOT, UPDATE_ATOMIC, UPDATE_CARRY, UPDATE_DELTA = 0, 1, 2, 3, 4

# Triton after 3.6 (3.9, CI's, on 2026-12-06) fails to lay out a masked atomic whose address
# broadcasts a row vector over the columns of a mask in an MMA layout ("PassManager::run failed" in
# TritonGPURemoveLayoutConversions, for sm_90); the address built from the mask's own tensor
# (``tl.where(mask, rows[:, None], 0)``) compiles there. On Triton 3.6 (the device image's) the
# broadcast form is the faster one in ``assign._candidate_kernel``, the one user of this switch:
# H100, 2026-12-07, the kernel at 1M x 128 x 4,096 over-split fp32 rows 51-52 / 102 us against
# 58-59 / 115 with the mask's address (from random rows / after two iterations), 2,882-2,889
# against 3,051-3,065 at 1M x 768 x 8,192, 7 against 8-9 at 245,760 x 32 x 1,024 bf16; so 3.6
# keeps it (``scripts/compile_sm90.py`` compiles both). (``centroids._neighbours_kernel`` takes the
# mask's address on every version: faster there.) ``TORCHKM_ATOMIC_ADDRESS=mask`` / ``broadcast``:
# either form on any version (experiments; read at import).
ATOMIC_ADDRESS_FROM_MASK = tl.constexpr(
    {"mask": True, "broadcast": False}.get(os.environ.get("TORCHKM_ATOMIC_ADDRESS", ""),
                                          tuple(int(p) for p in triton.__version__.split(".")[:2]) > (3, 6)))


def launcher(kernel):
    """``kernel`` wrapped by ``torch.library.wrap_triton``, so that kernels launched inside a
    ``torch.library.triton_op`` are traced by ``torch.compile``; a plain launch under the interpreter.

    Outside a ``triton_op``, the wrapper dispatches each launch through a higher-order op (about
    0.5 ms of host time per launch on torch 2.11) unless the caller disabled that for code nothing
    traces (``torch._library.triton.set_wrap_triton_enabled(False)``, as the fit loop does).
    """
    wrap = getattr(torch.library, "wrap_triton", None)
    if wrap is None or os.environ.get("TRITON_INTERPRET") == "1":
        return kernel
    return wrap(kernel)


# Devices (by index) on which this process has captured its warm-up graph (``warm_graphs``).
_graphs_warm: set[int] = set()


def warm_graphs(device: torch.device) -> None:
    """Capture and drop a graph of one small kernel (a 1-element add), once per process and device.

    A process's first capture of a pass pays a one-time cost: H200, a dense pass at 3.9M x 32,
    k = 1024 took the host 3.9-6.4 ms to capture in a fresh process, 1.3-1.7 ms after a 1-element
    add had been captured (or another fit had run) in it (2026-11-29). ``ReplayedPass`` calls this
    before it times anything: ``auto`` estimates its trial from an engine's measured capture
    (``ReplayedPass.setup_host_seconds``), and a kept engine holds that one sample, so the one-time
    cost had kept later fits of the same rows dense (293 ms against 112). Where capturing fails,
    nothing is warmed (the passes then run eagerly, see ``ReplayedPass``)."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index in _graphs_warm:
        return
    _graphs_warm.add(index)
    value = torch.zeros(1, device=device)
    try:
        capture(lambda: value.add_(1.0), device)
    except RuntimeError as err:
        logging.getLogger("torchkm").debug("warm-up graph capture failed (%s)", err)


# Our graphs whose last reference went while the current stream was capturing, kept until a
# stream is not (``_Graph``).
_graphs_to_release: list[torch.cuda.CUDAGraph] = []


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 - (interpreter shutdown, or no CUDA build)
        return False


class _Graph(torch.cuda.CUDAGraph):
    """A CUDA graph that is not destroyed while the current stream is capturing another.

    Our engines hold their graphs in reference cycles, so the garbage collector may free them at
    any allocation, including inside a caller's own capture (``torch.cuda.graph``, torch.compile's
    CUDA graphs) after the rows of an earlier fit were dropped. Destroying a graph there is refused
    and ends that capture with "operation failed due to a previous error during capture" (H200,
    2026-12-04: once in each of three probe processes that timed passes in graphs after dropping rows
    they had fitted). Such a graph is kept alive instead, until the next ``release_graphs`` outside a
    capture (our next ``capture`` calls it). A capture on another thread is not seen."""

    def __del__(self) -> None:
        if _capturing():
            _graphs_to_release.append(self)  # (resurrected: destroyed when the list lets it go)
            return
        base = getattr(super(), "__del__", None)  # (torch 2.13 has one, 2.11 not)
        if base is not None:
            base()


def release_graphs() -> None:
    """Destroy the graphs whose owners went during a capture (``_Graph``), unless one is under way."""
    if _graphs_to_release and not _capturing():
        _graphs_to_release.clear()


def capture(run: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph:
    """``run``'s launches captured as a CUDA graph (nothing runs). Unlike ``torch.cuda.graph``, no
    device synchronisation and no emptying of the allocator's cache first: the cache stays warm for
    the allocations that follow. On an H200 at 245,760 x 32 x 32, a process's first capture of one
    iteration took the host 3.9-4.9 ms through ``torch.cuda.graph`` and 3.3 ms here; later captures
    take 0.6-0.8 ms. The graph is a ``_Graph``: freed during a capture, it waits for the next."""
    release_graphs()
    graph = _Graph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    # No garbage collection while capturing: a collected object holding a CUDA graph (an engine of
    # an earlier fit, whose passes refer back to it) would destroy that graph mid-capture, which CUDA
    # refuses ("operation not permitted when stream is capturing"), leaking it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            graph.capture_begin()
            try:
                run()
            finally:
                graph.capture_end()
    finally:
        if collecting:
            gc.enable()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph


class ReplayedCall:
    """``fn(static)`` captured as a CUDA graph at the first call and replayed at later ones.

    ``static`` holds the graph's own copies of the inputs (by name; None stays None), into which
    every call first copies its inputs. A call returns ``fn``'s outputs, the graph's tensors, which
    the next call overwrites; or None once a capture has failed (then at every call: the caller
    runs eagerly), and, ``aliased``, for inputs at other addresses than the first call's. Shared by
    ``assign``'s kept passes and the VQ layer's replayed training steps, whose keys guarantee the
    same shapes, dtypes and strides at every call.
    """

    def __init__(self, aliased: bool = False) -> None:
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, torch.Tensor | None] = {}
        self.outputs: Any = None
        self.failed = False
        # ``aliased``: the graph reads the first call's inputs where they lie (no copies), and later
        # calls replay it only while their inputs lie at the same addresses (a training loop's
        # activations often do: the allocator hands the freed block back); else they return None.
        # No reference is kept: the memory is read only when a caller's live input occupies it.
        self.aliased = aliased
        self.addresses: dict[str, int] = {}

    def __call__(self, fn: Callable[[dict[str, torch.Tensor | None]], Any], inputs: dict[str, torch.Tensor | None],
                 device: torch.device) -> Any:
        if self.failed:
            return None
        addresses: dict[str, int] = {}
        if self.aliased:
            addresses = {name: t.data_ptr() for name, t in inputs.items() if t is not None}
            if self.graph is not None and addresses != self.addresses:
                return None
            source = inputs
        else:
            if self.graph is None:
                self.static = {name: None if t is None else torch.empty_like(t) for name, t in inputs.items()}
            for name, t in inputs.items():
                if t is not None:
                    self.static[name].copy_(t)  # type: ignore[union-attr]
            source = self.static
        if self.graph is None:
            captured = []
            try:
                self.graph = capture(lambda: captured.append(fn(source)), device)
            except RuntimeError as err:  # capture unsupported here: stay eager
                logging.getLogger("torchkm").debug("CUDA graph capture failed (%s); running eagerly", err)
                self.failed = True
                return None
            self.outputs = captured[0]
            self.addresses = addresses
        self.graph.replay()
        return self.outputs


def launch_key(kind: str, k: int, tensors: dict[str, torch.Tensor | None], **flags: object) -> tuple:
    """What decides which compiled kernels a pass launches (``lloyd.ReplayedPass``'s ``warm_key``; with
    more flags, the key of ``assign``'s kept passes): each
    tensor's dtype, shape, strides, 16-byte alignment and device (Triton specialises on sizes and
    strides divisible by 16 and on pointer alignment), which tensors are absent, k, and ``flags``."""

    def of(t: torch.Tensor | None) -> tuple | None:
        return None if t is None else (t.dtype, tuple(t.shape), tuple(t.stride()), t.data_ptr() % 16, str(t.device))

    return kind, k, tuple((name, of(t)) for name, t in sorted(tensors.items())), tuple(sorted(flags.items()))


def unused(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor for one pointer argument that a launch does not use.

    Every such argument gets its own, and no tensor is passed for two arguments of one launch: under
    ``torch.compile``, Inductor functionalises a launch by cloning each argument the kernel may
    write, and two arguments sharing a tensor get two clones, copied back one after the other, so
    the untouched one can undo the kernel's writes (labels, deferred-row lists) before a later
    kernel reads them.
    """
    return torch.empty(1, dtype=dtype, device=device)


def onehot_max_k(d: int) -> int:
    """Largest k for which a tile's rows are pre-reduced through a one-hot product before the atomics.

    For few clusters, per-row atomics would serialise on the same k x d addresses; the one-hot
    product (fp32 FMA, k x BLOCK_N x d per tile) removes that contention and stays cheap while k is
    small.
    """
    return 64


def onehot_width(k: int) -> int:
    return max(16, triton.next_power_of_2(k))


def carries(k: int, d: int) -> bool:
    """Whether a pass keeps its one-hot partial sums in registers across its tiles (``UPDATE_CARRY``).

    Added tile by tile, a tile of 128 rows issues k x d atomics (1,024 at k = d = 32) on the same
    few addresses; carried, a (persistent) program adds its ``(k x d)`` partial once, at its end.
    On an H200 the settle pass of 3.9M x 32, k = 32 went from 1.19 to 0.60 ms and a dense Lloyd
    iteration there from 3.08 to 2.20 ms (``scripts/diag_prune.py``). The one-hot product itself
    remains the larger cost of the sums (``scripts/diag_update.py``; see ``onehot_sums``). The partial lives
    in registers beside a whole row tile, so only for rows of at most 64 features.
    """
    return k <= onehot_max_k(d) and triton.next_power_of_2(d) <= 64


def carry_width(d: int) -> int:
    """Feature width (padded) of a carried partial sum."""
    return max(16, triton.next_power_of_2(d))


def persistent_grid(n_tiles: int, programs: int) -> int:
    """Programs for walking ``n_tiles`` tiles with at most ``programs`` programs, each walking the
    same number of tiles (to within one): ``t = pid, pid + grid, ...``."""
    if n_tiles <= 0:
        return 0
    return triton.cdiv(n_tiles, triton.cdiv(n_tiles, programs))


@triton.jit
def transform_rows(x, row_mask, shift, scale, HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    """A loaded (rows x dims) tile of the raw rows as the caller sees them, ``(x - offset) * scale``,
    in fp32: ``x`` loaded with 0 past the mask, ``shift`` the offset's dims (0 past them).

    Padding (masked rows or features) is exactly 0.

    Kernels load rows themselves (``tl.load`` in the kernel, or in the helper that stores) and pass
    only loaded values to helpers such as this one: torch.compile decides which arguments a launch
    writes from the kernel's Triton IR, and counts a helper's pointer arguments as written wherever
    a value the helper returns reaches a store's address (a label in a sums atomic, the slot of a
    deferred row). A helper that loaded the rows made the exact pass "write" ``x``, so Inductor
    cloned the rows before every launch and a compiled VQ layer could not run as a CUDA graph
    (2026-11-22; ``tests/kernels/test_mutations.py`` holds every launch to it). The offsets are
    written out at each load, not computed by a helper: with one, Triton 3.6 failed to compile the
    lazy exact search over row lists ("operand #0 does not dominate this use").
    """
    x = x.to(tl.float32)
    if HAS_OFFSET:
        x = tl.where(row_mask[:, None], x - shift[None, :], 0.0)
    if HAS_SCALE:
        x = x * scale[:, None]
    return x


# Rows whose best direct fp32 distances lie within their rounding (``fp32_tie``) are settled by
# float64 distances, in every kernel that compares direct distances (``TORCHKM_FLOAT64_TIES=0``:
# compiled out, the fp32 comparison alone; experiments). Read once, at import: Triton keys its
# compiled kernels on this global. H100, 2026-12-05, 245,760 x 32, k = 1,024, exact ms an
# iteration, out -> in: fp32 0.210 -> 0.218 and 0.208 -> 0.208 (the fast mode, unchanged, moved
# -2 to +8 % between those processes), bf16 0.229 -> 0.242 and 0.223 -> 0.235.
FLOAT64_TIES = tl.constexpr(os.environ.get("TORCHKM_FLOAT64_TIES", "1") != "0")
# The exact mode's 3xTF32 search of every row (``configs.exact_as_tf32x3``: at most 32 features and
# 128 clusters) settles its near scores by direct distances too (``assign._tile``, X3_TIES) only with
# ``TORCHKM_X3_TIES=1`` (read at import): H100, 2026-12-05, it made those passes 20-75 % slower
# (245,760 x 32, k = 32: exact fp32 0.050 -> 0.069 ms, bf16 0.049 -> 0.078; k = 128 0.075 -> 0.111,
# 0.071 -> 0.127), as the rows' norms and the tile-wide test add about 350 instructions and 4-11
# barriers to each tile. Without it that route takes the lowest 3xTF32 score.
NEAR_SCORE_TIES = tl.constexpr(os.environ.get("TORCHKM_X3_TIES", "0") == "1")
# ``fp32_tie``'s window from each kernel's chunked sums (default) or, with
# ``TORCHKM_TIE_WINDOW=any``, from d roundings per distance, the bound of a sum in any order (wider:
# at 768 features, 8,192 N(0, 1) centroids it flagged 0.95 % of N(0, 1) rows against 0.06 %,
# benchmarks/results/2026-12-07_cpu_s32_tie_window_count.txt, and a tile holding one such row runs
# the float64 sweep over all its features). Read once, at import.
TIE_WINDOW_ANY_ORDER = tl.constexpr(os.environ.get("TORCHKM_TIE_WINDOW", "chunks") == "any")
# Features per chunk of that float64 sweep (its tiles of this width stay in registers beside the
# epilogue's: sm_90 compiles at 4 and 8 used as many registers).
TIE_D = tl.constexpr(8)
# Features per step when a tile's few tied rows are settled one at a time instead (``assign._tile``):
# each step loads one row's chunk and both centroids' across the whole program, a few values a
# thread, so at 768 features a row takes 2 dependent steps where the tile-wide sweep took 96.
TIE_ROW_D = tl.constexpr(512)


@triton.jit
def fp32_tie(dist_a, dist_b, d, CHUNK: tl.constexpr):
    """Whether two direct fp32 squared distances of d-feature rows are too close for fp32 to order.

    The kernels sum a distance in chunks of ``CHUNK`` features: a reduction within each chunk (a
    tree of at most ``CHUNK - 1`` additions, in whatever order the launch's layout takes), the chunk
    sums added in turn. So each term passes through at most ``min(d, CHUNK + ceil(d / CHUNK))``
    roundings of the sum, besides one each for its difference and square: a distance of
    non-negative terms is within about that many units of its last place (plus two) of the exact
    distance of the fp32 values, and only a gap beyond twice that, with room to spare, orders the
    exact distances. (``TORCHKM_TIE_WINDOW=any``: d roundings, the bound of a sum in any order, as
    before 2026-12-07; experiments.) The order of the fp32 sums themselves depends on the kernel's
    layout (its tile shape and warps), so two kernels may part on such a pair; its float64
    distances (``sq_dist64_part``) settle it the same way in every kernel."""
    if TIE_WINDOW_ANY_ORDER:
        depth = d
    else:
        depth = tl.minimum(d, CHUNK + (d + CHUNK - 1) // CHUNK)
    return tl.abs(dist_a - dist_b) <= (2 * depth + 32) * 5.9604645e-08 * tl.maximum(dist_a, dist_b) + 1.0e-30


@triton.jit
def sq_dist64_part(xr, c):
    """One chunk's float64 squared distance of loaded fp32 rows ``xr`` (as ``transform_rows`` gives
    them) to loaded fp32 centroid rows ``c``. Differences and squares of fp32 values are exact in
    float64 (unless their exponents lie far apart), and so is the sum while its terms span few binary
    orders; beyond that it rounds at 2^-53, far inside fp32's ties."""
    diff = xr.to(tl.float64) - c.to(tl.float64)
    return tl.sum(diff * diff, axis=1)


@triton.jit
def nearer64(dist_a, dist_b, label_a, label_b):
    """Whether centroid ``label_b`` wins over ``label_a`` by float64 distances (ties: lower index)."""
    return (dist_b < dist_a) | ((dist_b == dist_a) & (label_b < label_a))


@triton.jit
def carry_rows(acc_sums, acc_counts, labels, w, xr, KP: tl.constexpr):
    """``(acc_sums, acc_counts)`` (KP x DP, KP) plus the rows ``xr`` (BLOCK_N x DP) of weight ``w``
    (0 for rows that must not count) by cluster ``labels``: a one-hot product (``onehot_sums``)."""
    onehot = (labels[:, None] == tl.arange(0, KP)[None, :]).to(tl.float32)
    acc_sums = onehot_sums(onehot, xr * w[:, None], acc_sums)
    return acc_sums, acc_counts + tl.sum(onehot * w[:, None], axis=0)


# The one-hot product of the sums: three bf16 products on the tensor cores (default), or fp32 FMAs
# (``TORCHKM_ONEHOT_SUMS=ieee``, experiments). Read when the kernels are first compiled.
ONEHOT_BF16X3 = tl.constexpr(os.environ.get("TORCHKM_ONEHOT_SUMS", "bf16x3") != "ieee")
# Triton's interpreter multiplies bf16 operands wrongly: it holds them as uint16 and multiplies the
# bit patterns (triton-lang/triton#11584, "not supported yet"; 3.9: a product with the identity came
# out 1e9 off). So there the bf16 parts are multiplied as fp32 values (exactly the same products).
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _dot_bf16(a, b, acc):
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def onehot_sums(onehot, rows, acc):
    """``acc + onehot^T @ rows`` (``onehot`` BLOCK_N x KP of 0 / 1, ``rows`` BLOCK_N x DP, fp32).

    The rows are split into three bf16 parts, ``hi + mid + lo``, each the rounding of what the parts
    before it left: together they hold a row to within 2^-27 of its value (below fp32's own
    rounding, 2^-24), the 0 / 1 weights are exact in bf16 and the tensor cores add the products in
    fp32. The tile's partial is summed from its smallest part up, then added to ``acc`` once. The
    fp32 FMA product (``TORCHKM_ONEHOT_SUMS=ieee``) is the sums' larger cost where few clusters
    pre-reduce a tile: H200, fused pass at 3.9M rows of 32 features, k = 32, fp32, search alone 0.31
    (fast) / 0.55 ms (exact), with the FMA sums 0.85 / 0.96 ms, with these 0.69 / 0.89; 3.9M x 17,
    k = 7: 1.11 / 1.32 -> 0.86 / 0.97; 1M x 64, k = 64: 0.56 / 0.85 -> 0.49 / 0.77
    (``scripts/diag_update.py``, 2026-11-27; fused sums within 4.5-7.1e-7 of float64 ones, relative
    to the largest, as with the FMAs). (Triton's own 3xTF32 product, which splits both operands,
    had measured slower than the FMAs there: 2.4 against 1.9 ms, an older kernel.)
    """
    if ONEHOT_BF16X3:
        weights = tl.trans(onehot).to(tl.bfloat16)
        hi = rows.to(tl.bfloat16)
        rest = rows - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
        part = _dot_bf16(weights, lo, tl.zeros(acc.shape, tl.float32))
        part = _dot_bf16(weights, mid, part)
        part = _dot_bf16(weights, hi, part)
        return acc + part
    return tl.dot(tl.trans(onehot), rows, acc, input_precision="ieee")


@triton.jit
def flush_carry(sums_ptr, counts_ptr, acc_sums, acc_counts, k, d, KP: tl.constexpr, DP: tl.constexpr):
    """Add a program's carried partial sums into the accumulators (one atomic per cluster and feature)."""
    k_rows = tl.arange(0, KP)
    dims = tl.arange(0, DP)
    tl.atomic_add(sums_ptr + k_rows[:, None] * d + dims[None, :], acc_sums,
                  mask=(k_rows < k)[:, None] & (dims < d)[None, :], sem="relaxed")
    tl.atomic_add(counts_ptr + k_rows, acc_counts, mask=k_rows < k, sem="relaxed")


@triton.jit
def move_rows(sums_ptr, counts_ptr, labels, prev, w, moved, xr, dims, dim_mask, add_counts, d):
    """Rows ``moved`` leave cluster ``prev`` for cluster ``labels``: float64 ``sums`` and ``counts``
    that persist across passes (``UPDATE_DELTA``), one feature chunk at a time.

    float64, so that the sums kept this way over a whole fit stay as accurate as sums taken afresh
    in float32 every pass (each move rounds once, at 2^-53). A row's value is the fp32 ``xr * w``,
    as ``update.float64_sums`` takes it, so that a base from there and the moves cancel exactly.
    A row with no previous cluster (``prev`` < 0: a dense fit's first pass) only joins its own.
    """
    v = (xr * w[:, None]).to(tl.float64)
    mask = moved[:, None] & dim_mask[None, :]
    had = moved & (prev >= 0)
    tl.atomic_add(sums_ptr + labels[:, None] * d + dims[None, :], v, mask=mask, sem="relaxed")
    tl.atomic_add(sums_ptr + prev[:, None] * d + dims[None, :], -v, mask=had[:, None] & dim_mask[None, :],
                  sem="relaxed")
    if add_counts:
        w64 = w.to(tl.float64)
        tl.atomic_add(counts_ptr + labels, w64, mask=moved, sem="relaxed")
        tl.atomic_add(counts_ptr + prev, -w64, mask=had, sem="relaxed")


@triton.jit
def accumulate_rows(sums_ptr, counts_ptr, labels, w, live, xr, dims, dim_mask, add_counts, k, d,
                    KP: tl.constexpr, MODE: tl.constexpr):
    """``sums[labels] += w * xr`` over one feature chunk (and ``counts[labels] += w`` when ``add_counts``).

    ``labels`` int64 (BLOCK_N,), ``w`` float32 with 0 where the row must not count, ``live`` the rows
    that count. MODE 1 pre-reduces the tile through a one-hot (KP x BLOCK_N) product, one atomic per
    (cluster, feature) per tile; MODE 2 issues one atomic per (row, feature).
    """
    if MODE == 1:
        k_rows = tl.arange(0, KP)
        part, part_counts = carry_rows(tl.zeros((KP, xr.shape[1]), tl.float32), tl.zeros((KP,), tl.float32),
                                       labels, w, xr, KP)
        tl.atomic_add(sums_ptr + k_rows[:, None] * d + dims[None, :], part, mask=(k_rows < k)[:, None] & dim_mask[None, :], sem="relaxed")
        if add_counts:
            tl.atomic_add(counts_ptr + k_rows, part_counts, mask=k_rows < k, sem="relaxed")
    else:
        tl.atomic_add(sums_ptr + labels[:, None] * d + dims[None, :], xr * w[:, None], mask=live[:, None] & dim_mask[None, :], sem="relaxed")
        if add_counts:
            tl.atomic_add(counts_ptr + labels, w, mask=live, sem="relaxed")
