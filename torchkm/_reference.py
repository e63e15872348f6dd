"""Pure-torch assignment and centroid update: the CPU engine and the oracle for every kernel.

Everything here works chunk by chunk over the rows of ``x`` so that no n x k distance matrix is
ever held whole, and so that half-precision input, mean-centering and row normalisation happen on
one chunk at a time instead of on a full copy of the data.

Precision contract: distances are computed in ``compute_dtype`` (float32 for float16/bfloat16/float32
inputs, float64 for float64 inputs) through the expansion ``||x||^2 - 2 x.c + ||c||^2``; ties in the
argmin break to the lowest centroid index, as in numpy, faiss and scikit-learn. On CUDA the matrix
product follows ``torch.backends.cuda.matmul.allow_tf32`` (off by default), so the reference is an
fp32 oracle unless the caller opted into tf32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._validation import iter_row_chunks

__all__ = ["DataView", "assign", "gather_codes", "pairwise_sq_distances", "straight_through_grad", "update",
           "weighted_sum"]

# Temporaries of one chunk (a rows x k distance block) stay near this many elements; on the CPU
# near a quarter of that, so that a chunk's blocks stay in cache instead of being allocated (and
# faulted in) afresh each time. scripts/diag_cpu_engine.py, 2 cores, torch 2.13, 2026-12-05, ms a
# Lloyd iteration, best of three runs (benchmarks/results/2026-12-05_cpu_s19_cpu_engine.txt),
# 2^22 -> 2^20 elements: 100,000 x 32, k = 64 17.3 -> 12.2; 50,000 x 128, k = 256 44.6 -> 34.0;
# 20,000 x 64, k = 1,000 26.2 -> 24.3; 200,000 x 16, k = 16 15.3 -> 9.6. 2^18: 11.6, 32.0, 25.7,
# 9.2 (level; this shared machine's runs vary by up to half).
_ASSIGN_CHUNK_ELEMENTS = 1 << 22
_CPU_CHUNK_ELEMENTS = 1 << 20
# CPU rows of at most this many elements are transformed once per view and kept (``DataView.resident``).
_RESIDENT_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class DataView:
    """How to read the raw rows of ``x``: cast, centre on ``offset``, and optionally L2-normalise.

    The transformation is applied per chunk, so that neither a float32 copy of half-precision data
    nor a centred copy of the data ever exists in full.
    """

    x: torch.Tensor
    dtype: torch.dtype
    offset: torch.Tensor | None = None
    normalize: bool = False
    # How the GPU kernels compute distances ("exact" or "fast"); the pure-torch engine ignores it.
    precision: str = "exact"

    @property
    def n_samples(self) -> int:
        return self.x.shape[0]

    @property
    def n_features(self) -> int:
        return self.x.shape[1]

    @property
    def device(self) -> torch.device:
        return self.x.device

    @functools.cached_property
    def raw_norms(self) -> torch.Tensor:
        """Norms of the raw rows ``||x_i||`` (float32, (n,)), computed once per view."""
        out = torch.empty(self.n_samples, dtype=torch.float32, device=self.device)
        for start, stop in iter_row_chunks(self.n_samples, self.n_features):
            # Cast as the reduction reads (no converted copy of the rows: 16.4 against 43.9 us for
            # 32,768 x 256 bf16 rows, H200), straight into ``out`` where the dtypes agree.
            if self.dtype == torch.float32:
                torch.linalg.vector_norm(self.x[start:stop], dim=1, dtype=torch.float32, out=out[start:stop])
            else:
                out[start:stop] = torch.linalg.vector_norm(self.x[start:stop], dim=1, dtype=self.dtype)
        return out

    @functools.cached_property
    def resident(self) -> torch.Tensor | None:
        """The transformed rows whole, kept for the view's life where they are small and on the CPU
        (at most ``_RESIDENT_ELEMENTS``, 4 MiB of fp32; a chunk's own temporaries are larger), else
        None. A fit reads its rows once per Lloyd iteration and once per k-means++ step: at 1,797 x
        64 (digits) transforming them again each time was a tenth of a fit's time. Read-only."""
        if self.device.type != "cpu" or not self.in_memory or self.n_samples * self.n_features > _RESIDENT_ELEMENTS:
            return None
        return self.transform(self.x)

    @functools.cached_property
    def resident_sq_norms(self) -> torch.Tensor | None:
        """``||row||^2`` of the ``resident`` rows (as ``pairwise_sq_distances`` computes them), else None."""
        rows = self.resident
        return None if rows is None else torch.linalg.vecdot(rows, rows)

    @functools.cached_property
    def row_scale(self) -> torch.Tensor | None:
        """``1 / ||x_i||`` when rows are normalised, else None."""
        return self.raw_norms.reciprocal() if self.normalize else None

    @property
    def in_memory(self) -> bool:
        """Whether the rows sit on the compute device (else they are streamed, see ``_streaming``)."""
        return True

    def pieces(self):
        """``(start, stop, view)`` over the rows in device-resident pieces: here the whole view."""
        yield 0, self.n_samples, self

    def transform(self, raw: torch.Tensor) -> torch.Tensor:
        rows = raw.to(self.dtype)
        if self.offset is not None:
            rows = rows - self.offset
        if self.normalize:
            rows = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True)
        return rows

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """The transformed rows ``start:stop`` (read-only: they may be a view of ``resident``)."""
        resident = self.resident
        return self.transform(self.x[start:stop]) if resident is None else resident[start:stop]

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """Transformed rows at ``index`` (any device; moved to the data's)."""
        resident = self.resident
        if resident is not None:
            return resident.index_select(0, index.to(self.device))
        return self.transform(self.x.index_select(0, index.to(self.device)))

    def chunks(self, width: int, chunk_size: int | None = None):
        """Yield ``(start, stop, rows)`` with ``rows`` already transformed."""
        if chunk_size is None:
            elements = _CPU_CHUNK_ELEMENTS if self.device.type == "cpu" else _ASSIGN_CHUNK_ELEMENTS
            chunk_size = max(1, elements // max(1, width, self.n_features))
        for start, stop in iter_row_chunks(self.n_samples, width, chunk_size):
            yield start, stop, self.rows(start, stop)


def pairwise_sq_distances(rows: torch.Tensor, centroids: torch.Tensor, centroid_sq_norms: torch.Tensor,
                          row_sq_norms: torch.Tensor | None = None) -> torch.Tensor:
    """Squared Euclidean distances of one chunk of rows to all centroids, clamped at 0
    (``row_sq_norms``: the rows' own squared norms, if known)."""
    if row_sq_norms is None:
        row_sq_norms = torch.linalg.vecdot(rows, rows)
    dist = torch.addmm(centroid_sq_norms.unsqueeze(0), rows, centroids.T, alpha=-2.0)
    return dist.add_(row_sq_norms.unsqueeze(1)).clamp_min_(0.0)


def first_copies(centroids: torch.Tensor, sq_norms: torch.Tensor) -> torch.Tensor | None:
    """For each centroid the lowest index of a centroid identical to it, or None where all differ.

    Identical centroids tie for every row, but a GEMM may round their columns differently (blocked
    kernels treat the last columns apart): on the CPU, copies of two of five centroids lost only
    one of their two clusters. Mapping each winner to its first copy keeps ties at the lowest
    index. Identical rows have the same norm bit for bit, so rows of distinct norms need no
    comparison (one sort of k values, the common case). None under ``torch.compile``, during a
    CUDA graph's capture and for fake or meta tensors: the checks read values on the host, which
    a traced or captured graph cannot (copies' ties there are the GEMM's)."""
    from torch._subclasses.fake_tensor import is_fake

    k = centroids.shape[0]
    if (k < 2 or torch.compiler.is_compiling() or centroids.is_meta or is_fake(centroids)
            or (centroids.is_cuda and torch.cuda.is_current_stream_capturing())):
        return None
    ordered = torch.sort(sq_norms).values
    if not bool((ordered[1:] == ordered[:-1]).any()):
        return None
    _, copy_of = torch.unique(centroids, dim=0, return_inverse=True)
    index = torch.arange(k, device=centroids.device)
    first = torch.full((k,), k, dtype=index.dtype, device=centroids.device)
    first = first.scatter_reduce(0, copy_of, index, reduce="amin")[copy_of]
    return None if bool((first == index).all()) else first


def assign(data: DataView, centroids: torch.Tensor, chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of every row.

    Returns ``labels`` (int64, shape (n,)) and ``sq_distances`` (``data.dtype``, shape (n,)): the squared
    Euclidean distance from each transformed row to its centroid, computed as ``||x - c||^2``
    directly. Ties go to the lowest index.
    """
    c = centroids.to(data.dtype)
    c_sq = torch.linalg.vecdot(c, c)
    first = first_copies(c, c_sq)
    labels = torch.empty(data.n_samples, dtype=torch.int64, device=data.device)
    sq_distances = torch.empty(data.n_samples, dtype=data.dtype, device=data.device)
    for start, stop, rows in data.chunks(c.shape[0], chunk_size):
        # argmin of ||c||^2 - 2 x.c: adding ||x||^2 afterwards cannot change the winner.
        scores = torch.addmm(c_sq.unsqueeze(0), rows, c.T, alpha=-2.0)
        # (``min`` gives the first of equal minima, as ``argmin`` does, and is faster on the CPU:
        # this whole assign of 1,797 x 64 rows to 10 centroids took 110 against 133 us, 2 cores,
        # torch 2.13, 2026-12-04.)
        idx = scores.min(dim=1).indices
        if first is not None:
            idx = first[idx]
        labels[start:stop] = idx
        # The expansion loses absolute precision when ||x|| is large; the winner's distance is
        # recomputed directly (O(n d)), so inertia is accurate to fp32 rounding of the difference.
        diff = rows - c.index_select(0, idx)
        sq_distances[start:stop] = torch.linalg.vecdot(diff, diff)
    return labels, sq_distances


def weighted_sum(values: torch.Tensor, sample_weight: torch.Tensor | None) -> torch.Tensor:
    """``sum(w * values)`` as a 0-d tensor (float64 on the CPU, where it is cheap)."""
    values = values.to(torch.float64) if values.device.type == "cpu" else values
    return values.sum() if sample_weight is None else values @ sample_weight.to(values.dtype)


def accumulator_dtype(data: DataView) -> torch.dtype:
    # float64 sums are cheap on a CPU and make the CPU engine a tight oracle; GPUs keep fp32
    # accumulators (consumer parts have slow float64), with data centred so sums stay small.
    return torch.float64 if data.device.type == "cpu" else data.dtype


def update(
    data: DataView,
    labels: torch.Tensor,
    n_clusters: int,
    sample_weight: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cluster weighted sums of the transformed rows and the per-cluster total weight.

    Returns ``sums`` (k, d) and ``counts`` (k,) in the accumulator dtype. Deterministic: CPU
    ``index_add_`` runs serially per output row, and CUDA ``index_put_(accumulate=True)`` sorts.
    """
    acc = accumulator_dtype(data)
    sums = torch.zeros(n_clusters, data.n_features, dtype=acc, device=data.device)
    counts = torch.zeros(n_clusters, dtype=acc, device=data.device)
    on_cpu = data.device.type == "cpu"
    for start, stop, rows in data.chunks(data.n_features, chunk_size):
        rows = rows.to(acc)
        lab = labels[start:stop]
        if sample_weight is None:
            w = torch.ones(stop - start, dtype=acc, device=data.device)
        else:
            w = sample_weight[start:stop].to(acc)
            rows = rows * w.unsqueeze(1)
        if on_cpu:
            sums.index_add_(0, lab, rows)
            counts.index_add_(0, lab, w)
        else:
            sums.index_put_((lab,), rows, accumulate=True)
            counts.index_put_((lab,), w, accumulate=True)
    return sums, counts


def gather_codes(labels: torch.Tensor, codebook: torch.Tensor, dtype: torch.dtype, total: torch.Tensor,
                 inv_numel: float, loss_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A VQ layer's codes and losses (see ``torchkm._ops.gather_codes``) in torch."""
    codes = torch.nn.functional.embedding(labels, codebook)
    return codes.to(dtype), codes, total * inv_numel, total * (loss_weight * inv_numel)


def straight_through_grad(grad_quantized: torch.Tensor, x: torch.Tensor, codes: torch.Tensor,
                          grad_commitment: torch.Tensor | None, grad_loss: torch.Tensor | None,
                          loss_weight: float) -> torch.Tensor:
    """A VQ layer's input gradient (see ``torchkm._ops.straight_through_grad``), in the promoted dtype
    of its inputs (float64 rows stay float64), returned in ``x``'s dtype."""
    if grad_commitment is None and grad_loss is None:
        return grad_quantized.to(x.dtype)
    scale = grad_commitment if grad_commitment is not None else 0.0
    if grad_loss is not None:
        scale = scale + loss_weight * grad_loss
    return torch.addcmul(grad_quantized, torch.sub(x, codes), scale * (2.0 / max(x.numel(), 1))).to(x.dtype)
