"""Functional k-means: ``fit``, ``assign`` and ``update`` on tensors, no module state."""

from __future__ import annotations

from typing import Any

import torch

from . import _ops, _workspace
from ._loop import KMeansResult, fit, new_centroids
from ._ops import query_view
from ._reference import DataView
from ._validation import (
    as_data_tensor,
    check_nonzero_rows,
    check_precision,
    check_same_device,
    check_sample_weight,
    compute_dtype,
    ensure_finite,
    overflow_limit,
)

__all__ = ["KMeansResult", "assign", "empty_cache", "fit", "transform", "update"]


def _checked_query(
    x: Any, centroids: Any, metric: str, check_finite: bool = True
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``x`` and ``centroids`` as tensors, checked; and whether their values are small enough that
    no squared distance can overflow the compute dtype (True when not checked)."""
    if metric not in ("euclidean", "cosine"):
        raise ValueError(f"metric must be 'euclidean' or 'cosine', got {metric!r}")
    c = as_data_tensor(centroids, "centroids", check_finite=False)
    x = as_data_tensor(x, "x", check_finite=False)
    if x.shape[1] != c.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features but the centroids have {c.shape[1]}")
    check_same_device(x, c)
    safe = True
    # Value checks read the data back to the host; inside torch.compile they would break the graph.
    if check_finite and not torch.compiler.is_compiling():
        safe = ensure_finite(c, "centroids", (x, "x"), limit=overflow_limit(compute_dtype(x.dtype, c.dtype), x.shape[1]))
        if metric == "cosine":
            check_nonzero_rows(x)
    return x, c, safe


def _check_overflow(distances: torch.Tensor, x: torch.Tensor, c: torch.Tensor, metric: str) -> None:
    """Raise where values too large for the compute dtype (``_checked_query``) made a distance
    overflow: its labels would be arbitrary. One more read-back, only for such values. (Cosine
    distances stay finite when a norm overflows, the row then taken as zero: the norms are checked.)"""
    dtype = compute_dtype(x.dtype, c.dtype)
    ok = torch.isfinite(distances).all()
    if metric == "cosine":
        for t in (x, c):
            ok = ok & torch.isfinite(torch.linalg.vector_norm(t, dim=1, dtype=dtype)).all()
    if not bool(ok):
        raise ValueError(
            f"the distances of x's rows to the centroids overflow {dtype} (values beyond about "
            f"{overflow_limit(dtype, x.shape[1]):.1e} in x or the centroids): the labels would be arbitrary. Rescale x and the "
            "centroids" + (", or pass them as float64" if dtype != torch.float64 else ""))


def assign(
    x: Any, centroids: Any, *, metric: str = "euclidean", precision: str = "exact", check_finite: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of each row of ``x``.

    On CUDA this is one fused Triton pass (never an n x k matrix); ``torch.compile(fullgraph=True)``
    traces it as the ``torchkm::assign`` op. ``precision="exact"`` (default) gives the labels of an
    fp32 computation (tensor-core pass, then a 3xTF32 re-check of rows whose best two centroids
    are within its rounding bound); ``"fast"`` keeps the tensor-core pass alone (tf32 products for
    float32 input, native products for float16/bfloat16). CPU tensors always compute in fp32/fp64.

    ``check_finite=False`` skips the scan for NaN and Inf in ``x`` and ``centroids`` (and, for
    ``metric="cosine"``, for zero rows), which reads the result back to the host: on a GPU that
    sync stops the host from queueing work ahead of the device, so loops of small queries run
    faster without it. Only for inputs known to be finite: a non-finite row then gets an
    arbitrary label and distance, and no error. The same scan finds values large enough to make
    a distance overflow the compute dtype (about 1e18 and beyond in float32), which raise
    ``ValueError`` instead of returning arbitrary labels.

    On CUDA, ``assign`` keeps its pass (buffers and, from a shape's second call, a CUDA graph of
    the query) for up to four input shapes per thread; :func:`empty_cache` frees them.

    Returns:
        ``(labels, distances)``: int64 labels (ties go to the lowest index) and, per row, the
        squared Euclidean distance (``metric="euclidean"``) or the cosine distance ``1 - cos``
        (``metric="cosine"``) to that centroid, computed directly from the difference, in float32
        (float64 if either input is float64).
    """
    check_precision(precision)
    x, c, safe = _checked_query(x, centroids, metric, check_finite)
    labels, distances = _ops.query_assign(x, c, metric, precision)
    if not safe:
        _check_overflow(distances, x, c, metric)
    return labels, distances


def empty_cache() -> None:
    """Free the GPU memory torchkm keeps between calls.

    :func:`assign` (and the layers and ``predict`` built on it) keeps, for each of its last four
    input shapes per thread, the buffers of its pass and, on CUDA, a CUDA graph of the query with
    copies of its inputs (up to 2^23 elements): repeated calls then skip the set-up. :func:`fit`
    keeps the engines of its last two fits on the kernels of at most 2^22 rows (a label per row,
    the engines' buffers and CUDA graphs), while their rows' tensor lives: a fit of the same tensor
    restarts them. This drops them all, in every thread (a pass another thread is running at that
    moment is kept). The memory goes back to torch's caching allocator; ``torch.cuda.empty_cache()``
    returns it to the device. Fitted models and layers are not affected, and later calls build
    their passes again.
    """
    _ops.empty_cache()
    _workspace.clear()


@_ops.eager_launches
def transform(x: Any, centroids: Any, *, metric: str = "euclidean") -> torch.Tensor:
    """(n_samples, n_clusters) distances of every row to every centroid.

    Euclidean (not squared, as scikit-learn's ``transform``) or cosine distance ``1 - cos``. This
    is the one call that materialises an n x k matrix, because it is the requested output.
    """
    x, c, safe = _checked_query(x, centroids, metric)
    data, view_c = query_view(x, c, metric)
    sq = _ops.sq_distances_to(data, view_c)
    if not safe:
        _check_overflow(sq, x, c, metric)
    return sq * 0.5 if metric == "cosine" else sq.sqrt_()


@_ops.eager_launches
def update(
    x: Any, labels: torch.Tensor, centroids: Any, *, sample_weight: Any = None, metric: str = "euclidean"
) -> torch.Tensor:
    """One centroid update: the (weighted) mean of the rows given each label.

    Clusters that receive no weight keep their row of ``centroids``. For ``metric="cosine"`` the
    means of the normalised rows are normalised again (spherical k-means).
    """
    x, c, _ = _checked_query(x, centroids, metric)
    if not isinstance(labels, torch.Tensor) or labels.dtype not in (torch.int32, torch.int64) or labels.shape != (x.shape[0],):
        raise ValueError(f"labels must be an int32/int64 tensor of shape ({x.shape[0]},)")
    labels = labels.to(device=x.device, dtype=torch.int64)
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= c.shape[0]):
        raise ValueError(f"labels must lie in [0, {c.shape[0] - 1}], got range [{int(labels.min())}, {int(labels.max())}]")
    dtype = compute_dtype(x.dtype, c.dtype)
    data = DataView(x, dtype, None, metric == "cosine")
    w = check_sample_weight(sample_weight, x, dtype)
    sums, counts = _ops.update(data, labels, c.shape[0], w)
    return new_centroids(sums, counts, c.to(dtype), data.normalize)
