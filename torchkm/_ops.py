"""The one bridge between the public API and the compute engines.

Every distance pass and every centroid update of torchkm goes through the functions here. Today
they run the pure-torch engine of ``_reference`` on every device; the Triton kernels of
``torchkm._kernels`` plug in here (registered as ``torch.library`` ops), so that nothing above this
module changes when they do.
"""

from __future__ import annotations

import torch

from . import _reference
from ._reference import DataView

__all__ = ["assign", "sq_distances_to", "update"]


def assign(data: DataView, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels (int64) and squared distances to the nearest centroid, in the data's transformed space."""
    return _reference.assign(data, centroids)


def update(
    data: DataView, labels: torch.Tensor, n_clusters: int, sample_weight: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cluster weighted sums and weights (see ``_reference.update``)."""
    return _reference.update(data, labels, n_clusters, sample_weight)


def sq_distances_to(data: DataView, points: torch.Tensor) -> torch.Tensor:
    """The full (n, m) matrix of squared distances to ``points``; callers keep m small or want it whole."""
    points = points.to(data.dtype)
    points_sq = torch.einsum("ij,ij->i", points, points)
    out = torch.empty(data.n_samples, points.shape[0], dtype=data.dtype, device=data.device)
    for start, stop, rows in data.chunks(points.shape[0]):
        out[start:stop] = _reference.pairwise_sq_distances(rows, points, points_sq)
    return out
