"""The one bridge between the public API and the compute engines.

Every distance pass and every centroid update of torchkm goes through the functions here. CUDA
tensors of float32/float16/bfloat16 run the Triton kernels of ``torchkm._kernels`` (fused
assignment, update, exact re-check); CPU tensors and float64 run the pure-torch engine of
``_reference``. ``TORCHKM_ENGINE=torch`` forces the pure-torch engine everywhere, and
``TORCHKM_ENGINE=triton`` forces the kernels on CPU tensors too (under ``TRITON_INTERPRET=1``:
how CI tests the kernel path end to end without a GPU).

``torchkm::assign`` is registered with ``torch.library`` so that ``torch.compile(fullgraph=True)``
traces ``torchkm.assign`` without graph breaks (through the kernels on CUDA).
"""

from __future__ import annotations

import functools
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from . import _reference
from ._reference import DataView
from ._validation import PRECISIONS, compute_dtype

__all__ = [
    "PRECISIONS",
    "StepResult",
    "assign",
    "assign_and_ema_update",
    "assign_and_sum",
    "bounds_supported",
    "pruned_supported",
    "cuda_graphs_enabled",
    "eager_launches",
    "ema_step_fuses",
    "empty_cache",
    "gather_codes",
    "kmeans_plusplus_rows",
    "labelled_sq_distances",
    "lloyd_engine",
    "lloyd_step",
    "pruned_engine",
    "query_assign",
    "query_assign_and_sum",
    "query_view",
    "replayed_call",
    "replays_enabled",
    "settings",
    "sq_distances_to",
    "straight_through_grad",
    "update",
    "uses_kernels",
]

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_F = TypeVar("_F", bound=Callable)
try:
    from torch._library.triton import (
        set_wrap_triton_enabled as _set_wrap_triton_enabled,
    )
except ImportError:  # a torch without the switch (the launches then keep the wrapper's dispatch)
    _set_wrap_triton_enabled = None


def eager_launches(fn: _F) -> _F:
    """Run ``fn`` with the kernels launched directly, not through ``wrap_triton``'s higher-order op.

    The kernels are wrapped so that ``torch.compile`` can trace them inside the ``triton_op``s; in
    code that nothing traces, that dispatch costs about 0.5 ms of host time per launch (torch 2.11),
    more than a small Lloyd iteration's GPU time. For the fit loop and its helpers only, which run
    on real tensors with host syncs and are never traced.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _set_wrap_triton_enabled is None or torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        with _set_wrap_triton_enabled(False):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _engine_serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``TORCHKM_ENGINE`` and the device give tensors of ``dtype`` to the kernels."""
    engine = os.environ.get("TORCHKM_ENGINE", "auto")
    return engine != "torch" and dtype in _KERNEL_DTYPES and (device.type == "cuda" or engine == "triton")


def uses_kernels(data: DataView) -> bool:
    """Whether the Triton kernels serve this data (else the pure-torch engine)."""
    return data.dtype == torch.float32 and _engine_serves(data.device, data.x.dtype)


def _kernel_inputs(data: DataView) -> dict:
    needs_norms = data.precision == "exact" or data.normalize
    return dict(
        precision=data.precision,
        offset=data.offset,
        row_scale=data.row_scale,
        raw_norms=data.raw_norms if needs_norms else None,
    )


def _piecewise(data: DataView, one_piece):
    """``one_piece(start, stop, piece)`` over the device-resident pieces of a streamed view, results
    in rank order; None for an in-memory view (the caller computes on it directly)."""
    if data.in_memory:
        return None
    return [one_piece(start, stop, piece) for start, stop, piece in data.pieces()]


def _concat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def assign(data: DataView, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels (int64) and squared distances to the nearest centroid, in the data's transformed space."""
    parts = _piecewise(data, lambda start, stop, piece: assign(piece, centroids))
    if parts is not None:
        return _concat_rows([p[0] for p in parts]), _concat_rows([p[1] for p in parts])
    if not uses_kernels(data):
        return _reference.assign(data, centroids)
    from ._kernels.assign import assign as kernel_assign

    out = kernel_assign(data.x, centroids, **_kernel_inputs(data))
    return out.labels, out.sq_dist


def assign_and_sum(data: DataView, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Labels, squared distances, and per-cluster sums (k, d) and counts (k,) of the transformed
    rows, float32, in one pass over the data on the kernels."""
    k = centroids.shape[0]
    if not uses_kernels(data):
        labels, sq = _reference.assign(data, centroids)
        sums, counts = _reference.update(data, labels, k, None)
        return labels, sq, sums.to(torch.float32), counts.to(torch.float32)
    from ._kernels.assign import assign as kernel_assign

    sums = torch.zeros(k, data.n_features, dtype=torch.float32, device=data.device)
    counts = torch.zeros(k, dtype=torch.float32, device=data.device)
    out = kernel_assign(data.x, centroids, sums=sums, counts=counts, **_kernel_inputs(data))
    return out.labels, out.sq_dist, sums, counts


@dataclass
class StepResult:
    """One assignment + accumulation pass of Lloyd's algorithm; scalars stay on the device."""

    labels: torch.Tensor
    sq_distances: torch.Tensor | None  # None when the fused pass did not store them
    sums: torch.Tensor
    counts: torch.Tensor
    inertia: torch.Tensor  # sum of weight * squared distance (0-d)
    changed: torch.Tensor  # rows whose label differs from prev_labels, all rows without it (0-d)


def lloyd_step(
    data: DataView,
    centroids: torch.Tensor,
    prev_labels: torch.Tensor | None,
    sample_weight: torch.Tensor | None,
    deterministic: bool = True,
) -> StepResult:
    """Assign every row and accumulate per-cluster sums and weights, with no host synchronisation,
    for the runs that do not use ``lloyd_engine``: the pure-torch engine; on the kernels the
    deterministic mode (assign, then the sorted, segmented sums: bit-identical reruns), and streamed
    data, whose chunks each run the fused pass (``deterministic=False``) and add up their sums."""
    k = centroids.shape[0]
    if not data.in_memory:
        steps = []
        for start, stop, piece in data.pieces():
            prev = None if prev_labels is None else prev_labels[start:stop]
            w = None if sample_weight is None else sample_weight[start:stop]
            step = lloyd_step(piece, centroids, prev, w, deterministic)
            # Only the small per-cluster results outlive the chunk's buffer.
            steps.append(step)
        first = steps[0]
        sums, counts = first.sums, first.counts
        inertia, changed = first.inertia, first.changed
        for step in steps[1:]:
            sums = sums + step.sums
            counts = counts + step.counts
            inertia = inertia + step.inertia
            changed = changed + step.changed
        sq = None if any(s.sq_distances is None for s in steps) else _concat_rows([s.sq_distances for s in steps])
        return StepResult(_concat_rows([s.labels for s in steps]), sq, sums, counts, inertia, changed)
    if not uses_kernels(data):
        labels, sq = _reference.assign(data, centroids)
        sums, counts = _reference.update(data, labels, k, sample_weight)
        inertia = _reference.weighted_sum(sq, sample_weight)
        changed = torch.tensor(data.n_samples, device=data.device) if prev_labels is None else (labels != prev_labels).sum()
        return StepResult(labels, sq, sums, counts, inertia, changed)
    from ._kernels.assign import assign as kernel_assign

    if not deterministic:
        sums = torch.zeros(k, data.n_features, dtype=torch.float32, device=data.device)
        counts = torch.zeros(k, dtype=torch.float32, device=data.device)
        out = kernel_assign(data.x, centroids, sample_weight=sample_weight, prev_labels=prev_labels, sums=sums,
                            counts=counts, **_kernel_inputs(data))
        return StepResult(out.labels, out.sq_dist, sums, counts, out.inertia, out.changed)
    out = kernel_assign(data.x, centroids, sample_weight=sample_weight, prev_labels=prev_labels, **_kernel_inputs(data))
    sums, counts = update(data, out.labels, k, sample_weight, deterministic=True)
    inertia = _reference.weighted_sum(out.sq_dist, sample_weight)
    return StepResult(out.labels, out.sq_dist, sums, counts, inertia, out.changed)


def lloyd_engine(
    data: DataView,
    centroids: torch.Tensor,
    labels: torch.Tensor,
    sample_weight: torch.Tensor | None,
    tol: float,
    block: int,
    graphs: bool,
    all_reduce=None,
    timed: bool = False,
):
    """The kernels' Lloyd state (``torchkm._kernels.lloyd.LloydEngine``): four launches per iteration,
    blocks of ``block`` iterations with one host sync, each iteration a CUDA graph replay when
    ``graphs``; ``all_reduce`` (in-place sum over the ranks of a data-parallel fit) joins the
    shards' sums before each update; ``timed``: each iteration's time in ``pass_seconds``."""
    from ._kernels.lloyd import LloydEngine

    return LloydEngine(data.x, centroids, labels, sample_weight=sample_weight, normalize=data.normalize, tol=tol,
                       block=block, graphs=graphs, all_reduce=all_reduce, timed=timed, **_kernel_inputs(data))


def pruned_engine(
    data: DataView, centroids: torch.Tensor, labels: torch.Tensor, sample_weight: torch.Tensor | None, tol: float,
    kind: str, graphs: bool, block: int = 1, timed: bool = False,
):
    """A pruned Lloyd engine of ``torchkm._kernels.prune``: ``kind="pruned"`` the bounds engine
    (compacted exact tensor-core search; ``graphs``: replay its settle passes as a CUDA graph, in
    blocks of ``block`` passes; ``timed``: each pass's time in ``pass_seconds``), ``"triangle"``
    seed 000's scan with workload reordering. For d <= ``BOX_MAX_D``, ``"pruned"`` is the box engine of
    ``torchkm._kernels.boxes`` (rows sorted along a curve, each tile searched over its candidates)."""
    from ._kernels.prune import BoundsEngine, TriangleEngine

    inputs = _kernel_inputs(data)
    common = {"offset": inputs["offset"], "row_scale": inputs["row_scale"], "sample_weight": sample_weight,
              "normalize": data.normalize, "tol": tol}
    if kind == "triangle":
        return TriangleEngine(data.x, centroids, labels, **common)
    if data.n_features <= BOX_MAX_D:
        from ._kernels.boxes import BoxEngine

        return BoxEngine(data.x, centroids, labels, graphs=graphs, block=block, timed=timed, **common)
    if group_bounds(data, centroids.shape[0]):
        from ._kernels import groups

        return groups.GroupBoundsEngine(data.x, centroids, labels, raw_norms=data.raw_norms, graphs=graphs,
                                        block=block, timed=timed, group_size=groups.GROUP_SIZE, **common)
    return BoundsEngine(data.x, centroids, labels, raw_norms=data.raw_norms, graphs=graphs, block=block, timed=timed,
                        **common)


def group_bounds(data: DataView, k: int) -> bool:
    """Whether ``"pruned"`` at d > 8 runs the engine with a bound per group of centroids
    (``torchkm._kernels.groups``) rather than per row: only with ``TORCHKM_BOUNDS=groups`` (an
    experiment: it skips more distances but has measured slower, BENCHMARKS.md 2026-12-01), for
    d <= 64 and at most 64 groups."""
    from ._kernels import groups

    choice = os.environ.get("TORCHKM_BOUNDS", "rows")
    if choice != "groups":
        return False
    return data.n_features <= groups.MAX_D and math.ceil(k / groups.GROUP_SIZE) <= groups.MAX_GROUPS


# The box engine serves up to 8 features, but its tiles' lists stay short only for few: on N(0, 1)
# rows (scripts/diag_box_lists.py, tiles of 128 rows, CPU) the mean list is 1.03-1.05 of 32
# centroids at 100M x 2, 2.3-3.0 of 100 at 10M x 3, 3.8-4.5 of 32 at 10M x 4 (6-10 % of tiles past
# the 8 slots), 9-12 of 32 at 10M x 5 (43-63 % past them) and all 32 at 1M x 8.
BOX_MAX_D = 3


def pruned_supported(data: DataView) -> bool:
    """Whether ``algorithm="pruned"`` has an engine for this data: the kernels, and d > 8 (the bounds
    engine) or d <= ``BOX_MAX_D`` (the box engine)."""
    return bounds_supported(data) or (uses_kernels(data) and data.n_features <= BOX_MAX_D)


def box_setup_seconds(data: DataView) -> float:
    """Estimated seconds of the box engine's once-per-fit set-up for ``data`` (measured on its
    device the first time it is asked, see ``torchkm._kernels.boxes.setup_seconds``)."""
    from ._kernels.boxes import setup_seconds

    return setup_seconds(data.n_samples, data.n_features, data.device)


def bounds_supported(data: DataView) -> bool:
    """Whether the bounds engine serves this data: the kernels, and d above the small-d kernel's range
    (it needs the tensor-core pass's best two candidates)."""
    from ._kernels.assign import SMALL_D

    return uses_kernels(data) and data.n_features > SMALL_D


def update(
    data: DataView,
    labels: torch.Tensor,
    n_clusters: int,
    sample_weight: torch.Tensor | None,
    deterministic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cluster weighted sums and weights (see ``_reference.update``)."""
    parts = _piecewise(data, lambda start, stop, piece: update(
        piece, labels[start:stop], n_clusters, None if sample_weight is None else sample_weight[start:stop],
        deterministic))
    if parts is not None:
        return sum(p[0] for p in parts[1:]) + parts[0][0], sum(p[1] for p in parts[1:]) + parts[0][1]
    if not uses_kernels(data):
        return _reference.update(data, labels, n_clusters, sample_weight)
    from ._kernels.update import update as kernel_update

    return kernel_update(
        data.x, labels, n_clusters, sample_weight=sample_weight, offset=data.offset, row_scale=data.row_scale,
        deterministic=deterministic,
    )


def cuda_graphs_enabled(device: torch.device) -> bool:
    """Whether work on ``device`` may replay captured CUDA graphs (``TORCHKM_CUDA_GRAPHS=0``: never)."""
    return (device.type == "cuda" and os.environ.get("TORCHKM_CUDA_GRAPHS", "1") != "0"
            and not torch.compiler.is_compiling())


@eager_launches
def kmeans_plusplus_rows(
    data: DataView, n_clusters: int, first_row: torch.Tensor, uniforms: torch.Tensor,
    sample_weight: torch.Tensor | None,
) -> torch.Tensor:
    """Indices of the rows greedy k-means++ picks, with its steps on the kernels and the device
    (``torchkm._kernels.seeding``): ``first_row`` the first, ``uniforms[s]`` step s's draws. For
    data the kernels serve, in memory."""
    from ._kernels.seeding import kmeans_plusplus

    return kmeans_plusplus(data.x, n_clusters, first_row, uniforms, offset=data.offset, row_scale=data.row_scale,
                           sample_weight=sample_weight, graphs=cuda_graphs_enabled(data.device))


def labelled_sq_distances(data: DataView, centroids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's squared distance to its own centroid, ``||row - centroids[labels[i]]||^2`` in the
    data's transformed space, computed directly as ``assign`` computes its winners': one read of
    the rows. A fit relocating empty clusters needs only these (the rows farthest from their
    centroids), and took a whole assignment pass for them before: H200, 2026-12-04
    (scripts/diag_empty_clusters.py), 0.44 ms a relocation at 32,768 x 256 x 8192 and 3.7 (fast) to
    6.9 ms (exact) at 1M x 128 x 4096, where a replayed Lloyd iteration took 2.3 and 3.4."""
    c = centroids.to(data.dtype)
    parts = _piecewise(data, lambda start, stop, piece: labelled_sq_distances(piece, c, labels[start:stop]))
    if parts is not None:
        return _concat_rows(parts)
    labels = labels.to(data.device)
    if uses_kernels(data):
        # One launch: the chunked torch ops below took 2.3 ms at 1M x 128 (31 chunks, five
        # launches and three n x d temporaries each; H200, 2026-12-04), as much as a whole pass.
        from ._kernels.distances import labelled_sq_distances as kernel_labelled_sq_distances

        return kernel_labelled_sq_distances(data.x, c, labels, offset=data.offset, row_scale=data.row_scale)
    out = torch.empty(data.n_samples, dtype=data.dtype, device=data.device)
    for start, stop, rows in data.chunks(1):
        diff = rows - c.index_select(0, labels[start:stop])
        out[start:stop] = torch.linalg.vecdot(diff, diff)
    return out


def farthest_rows(sq_distances: torch.Tensor, sample_weight: torch.Tensor | None,
                  count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, rows)``: the ``count`` rows farthest from their centroids by ``sq_distances``,
    farthest first and ties to the lower row (the kernels' order: ``update.farthest_keys_reference``),
    which scikit-learn's rule moves into empty clusters. Rows of zero weight could not fill a
    cluster: they score -1, below any other."""
    far_scores = sq_distances if sample_weight is None else torch.where(sample_weight > 0, sq_distances, -1.0)
    count = min(count, far_scores.numel())
    if count == 0:
        return far_scores[:0], torch.zeros(0, dtype=torch.int64, device=far_scores.device)
    # torch.topk orders equal scores its own way (per device): every row tied with the last one
    # kept is taken, and a stable sort of those puts ties in row order.
    last = torch.topk(far_scores, count).values[-1]
    tied = (far_scores >= last).nonzero().flatten()
    rows = tied[torch.sort(far_scores[tied], descending=True, stable=True).indices[:count]]
    return far_scores[rows], rows


def sq_distances_to(data: DataView, points: torch.Tensor) -> torch.Tensor:
    """The full (n, m) matrix of squared distances to ``points``; callers keep m small or want it whole."""
    points = points.to(data.dtype)
    parts = _piecewise(data, lambda start, stop, piece: sq_distances_to(piece, points))
    if parts is not None:
        return _concat_rows(parts)
    if uses_kernels(data) and points.shape[0] <= 64:
        from ._kernels.distances import sq_distances

        return sq_distances(data.x, points, offset=data.offset, row_scale=data.row_scale)
    points_sq = torch.linalg.vecdot(points, points)
    out = torch.empty(data.n_samples, points.shape[0], dtype=data.dtype, device=data.device)
    row_sq = data.resident_sq_norms
    for start, stop, rows in data.chunks(points.shape[0]):
        out[start:stop] = _reference.pairwise_sq_distances(rows, points, points_sq,
                                                           None if row_sq is None else row_sq[start:stop])
    return out


def query_view(x: torch.Tensor, centroids: torch.Tensor, metric: str, precision: str = "exact") -> tuple[DataView, torch.Tensor]:
    """A data view and centroids in one shared space for queries against fitted centroids.

    Euclidean queries are centred on the centroids' mean, which keeps the distance expansion exact
    enough for data far from the origin; cosine queries are row-normalised (the caller checks
    that no row is zero).
    """
    dtype = compute_dtype(x.dtype, centroids.dtype)
    c = centroids.to(dtype)
    if metric == "cosine":
        return DataView(x, dtype, None, True, precision), c / torch.linalg.vector_norm(c, dim=1, keepdim=True)
    offset = c.mean(0)
    return DataView(x, dtype, offset, False, precision), c - offset


# Distances are never computed under autocast: the pure-torch engine's matrix products would
# otherwise run in bf16/fp16 inside a user's autocast region (the kernels choose their own precision).
def _autocast_off(x: torch.Tensor) -> torch.autocast:
    return torch.autocast(x.device.type, enabled=False)


def _assign_impl(x: torch.Tensor, centroids: torch.Tensor, metric: str, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    with _autocast_off(x):
        data, c = query_view(x, centroids, metric, precision)
        labels, sq = assign(data, c)
    return labels, (sq * 0.5 if metric == "cosine" else sq)


def _assign_and_sum_impl(
    x: torch.Tensor, centroids: torch.Tensor, precision: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    with _autocast_off(x):
        data, c = query_view(x, centroids, "euclidean", precision)
        labels, sq, sums, counts = assign_and_sum(data, c)
        # Sums come back in the centred space of the pass; the caller wants raw rows.
        sums = torch.addr(sums, counts, data.offset.to(torch.float32))
    return labels, sq, sums, counts


_assign_op = torch.library.triton_op("torchkm::assign", _assign_impl, mutates_args=())
_assign_and_sum_op = torch.library.triton_op("torchkm::assign_and_sum", _assign_and_sum_impl, mutates_args=())


def _through_op(*tensors: torch.Tensor) -> bool:
    """Whether a query goes through its registered op: while torch.compile traces, or for tensor
    subclasses (a tracer's fake or functional tensors). Otherwise the implementation runs directly,
    with direct launches, saving the op's dispatch and ``wrap_triton``'s host time: ``assign_and_sum``
    at 32,768 x 256 x 8192 took the host 0.647 ms per call through the op and 0.607 ms directly
    (torch 2.11, H200, ``scripts/diag_host.py``), in a layer step that is bound by host time."""
    return torch.compiler.is_compiling() or any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors)


def query_assign(x: torch.Tensor, centroids: torch.Tensor, metric: str, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.torchkm.assign``: labels and metric distances of validated queries."""
    if _through_op(x, centroids):
        return torch.ops.torchkm.assign(x, centroids, metric, precision)
    with torch.no_grad():  # as the op: outputs without autograd history
        return eager_launches(_assign_impl)(x, centroids, metric, precision)


def query_assign_and_sum(
    x: torch.Tensor, centroids: torch.Tensor, precision: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.ops.torchkm.assign_and_sum``: Euclidean labels (int64) and squared distances of the
    rows of ``x``, with the float32 per-cluster sums (k, d) and counts (k,) of those rows, from one
    pass over ``x`` on CUDA."""
    if _through_op(x, centroids):
        return torch.ops.torchkm.assign_and_sum(x, centroids, precision)
    with torch.no_grad():
        return eager_launches(_assign_and_sum_impl)(x, centroids, precision)


def gather_codes(labels: torch.Tensor, codebook: torch.Tensor, dtype: torch.dtype, total: torch.Tensor,
                 inv_numel: float, loss_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A VQ layer's forward outputs from its labels: ``(codes, codes32, commitment, loss)``, the
    codes ``codebook[labels]`` in ``dtype`` and in ``codebook``'s dtype (the same tensor where they
    agree), ``total * inv_numel`` and ``total * (loss_weight * inv_numel)``. One kernel on CUDA
    (outside torch.compile, which fuses the torch expression itself), the torch expression
    elsewhere."""
    if (_engine_serves(codebook.device, dtype) and codebook.dtype == torch.float32 and labels.numel()
            and not torch.compiler.is_compiling() and all(type(t) is torch.Tensor for t in (labels, codebook, total))):
        from ._kernels import quantize

        return eager_launches(quantize.gather_codes)(labels, codebook, dtype, total, inv_numel, loss_weight)
    return _reference.gather_codes(labels, codebook, dtype, total, inv_numel, loss_weight)


def straight_through_grad(grad_quantized: torch.Tensor, x: torch.Tensor, codes: torch.Tensor,
                          grad_commitment: torch.Tensor | None, grad_loss: torch.Tensor | None,
                          loss_weight: float) -> torch.Tensor:
    """A VQ layer's input gradient, ``grad_quantized + (grad_commitment + loss_weight * grad_loss)
    * 2 / x.numel() * (x - codes)`` in ``x``'s dtype (an absent scalar gradient counting 0): one
    kernel on CUDA (outside torch.compile, which fuses the torch expression itself), the torch
    expression elsewhere."""
    if (_engine_serves(x.device, x.dtype) and not torch.compiler.is_compiling()
            and all(t is None or type(t) is torch.Tensor
                    for t in (grad_quantized, x, codes, grad_commitment, grad_loss))):
        from ._kernels import quantize

        return eager_launches(quantize.straight_through_grad)(grad_quantized, x, codes, grad_commitment, grad_loss,
                                                              loss_weight)
    return _reference.straight_through_grad(grad_quantized, x, codes, grad_commitment, grad_loss, loss_weight)


def ema_step_fuses(x: torch.Tensor) -> bool:
    """Whether :func:`assign_and_ema_update` serves rows ``x``: the kernels' engine on a plain
    tensor (CUDA, or any device with ``TORCHKM_ENGINE=triton``), outside torch.compile, which
    traces ``assign_and_sum`` and fuses the update's torch expression itself."""
    return (_engine_serves(x.device, x.dtype) and not torch.compiler.is_compiling()
            and type(x) in (torch.Tensor, torch.nn.Parameter))


@eager_launches
def assign_and_ema_update(
    x: torch.Tensor, codebook: torch.Tensor, cluster_size: torch.Tensor, embed_sum: torch.Tensor, *,
    precision: str, decay: float, eps: float, normalize: bool, dead_threshold: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An EMA codebook's training step on the kernels (where :func:`ema_step_fuses`): the rows'
    labels against ``codebook`` (k, d), then the EMA update of ``cluster_size``, ``embed_sum`` and
    ``codebook`` (all float32, in place; ``normalize``: unit codes) with the codes whose size falls
    below ``dead_threshold`` (if > 0) moved onto rows drawn uniformly from ``x`` (torch's
    generator of ``x``'s device). Returns ``(labels, codebook as it was, sum of squared
    distances)``: the assignment pass, one draw, and two launches for the update."""
    from ._kernels import online
    from ._kernels.assign import assign_keeping_sums
    from ._kernels.centroids import centre_rows

    with torch.no_grad(), _autocast_off(x):
        # Centred as ``query_view`` centres queries, in two launches instead of torch's two slower ones.
        c, offset = centre_rows(codebook)
        # (The exact pass takes the rows' norms itself, in the launch that reads them anyway.)
        out = assign_keeping_sums(x, c, precision=precision, offset=offset)
        revive = dead_threshold > 0 and x.shape[0] > 0
        rows = torch.randint(0, x.shape[0], (codebook.shape[0],), device=x.device) if revive else None
        used = torch.empty_like(codebook)
        sq_total = torch.empty((), dtype=torch.float32, device=x.device)
        online.ema_update(
            out.acc_sums, out.acc_counts, cluster_size, embed_sum, codebook, decay=decay, eps=eps,
            offset=offset, normalize=normalize, used=used, part_inertia=out.part_inertia,
            sq_total=sq_total, revive_threshold=dead_threshold if revive else 0.0, revive_from=x, revive_rows=rows)
    return out.labels, used, sq_total


# Holders of captured work above the kernels (the layers' replayed training steps): each has a
# ``clear()`` that ``empty_cache`` calls.
_replay_holders: weakref.WeakSet = weakref.WeakSet()


def replays_enabled(x: torch.Tensor) -> bool:
    """Whether eager work on ``x`` may be captured and replayed as a CUDA graph now: a plain CUDA
    tensor, nothing tracing or capturing, and ``TORCHKM_REPLAY_QUERIES`` not ``0``."""
    return (not torch.compiler.is_compiling() and x.device.type == "cuda"
            and type(x) in (torch.Tensor, torch.nn.Parameter) and not torch.cuda.is_current_stream_capturing()
            and os.environ.get("TORCHKM_REPLAY_QUERIES", "1") != "0")


def settings() -> tuple:
    """The ``TORCHKM_*`` environment, as a key (cheaply: see the kernels' ``_settings``)."""
    from ._kernels.assign import _settings

    return _settings()


def replayed_call(holder: object, aliased: bool = False) -> Any:
    """A new ``ReplayedCall`` of the kernels (``fn(static)`` captured as a CUDA graph at its first
    call, replayed after copying the inputs in; ``aliased``: reading them in place, for inputs at
    the first call's addresses only), for ``holder``, whose ``clear()`` ``empty_cache`` will call
    to free it."""
    from ._kernels._common import ReplayedCall

    _replay_holders.add(holder)
    return ReplayedCall(aliased)


def empty_cache() -> None:
    """Free what torchkm keeps between calls: ``assign``'s passes per input shape (buffers, a
    replayed query's copies of its inputs and its CUDA graph), in every thread, and the layers'
    replayed training steps."""
    from ._kernels.assign import clear_reused_passes

    clear_reused_passes(all_threads=True)
    for holder in list(_replay_holders):
        holder.clear()
