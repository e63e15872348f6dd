"""Centroid initialisation: greedy k-means++ (scikit-learn's variant) and uniform random rows.

Random numbers come from a CPU ``torch.Generator`` and only their few results travel to the data's
device, so a seed picks the same candidate rows on every device (up to floating-point ties).
"""

from __future__ import annotations

import math

import torch

from . import _ops
from ._reference import DataView

__all__ = ["kmeans_plusplus", "random_rows"]


def _draw(cumulative: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Indices drawn with probability proportional to the increments of ``cumulative``."""
    u = torch.rand(size, generator=generator, dtype=torch.float64).to(cumulative.device)
    return torch.searchsorted(cumulative, u * cumulative[-1]).clamp_max_(cumulative.numel() - 1)


def random_rows(
    data: DataView,
    n_clusters: int,
    generator: torch.Generator,
    sample_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """``n_clusters`` distinct rows drawn without replacement (with probability ∝ weight if given)."""
    n = data.n_samples
    if sample_weight is None:
        index = torch.randperm(n, generator=generator)[:n_clusters]
    else:
        # Efraimidis–Spirakis: the k largest log(u)/w are a weighted sample without replacement.
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        keys = torch.log(u) / sample_weight.detach().to("cpu", torch.float64)
        index = torch.topk(keys, n_clusters).indices
    return data.take(index)


def kmeans_plusplus(
    data: DataView,
    n_clusters: int,
    generator: torch.Generator,
    sample_weight: torch.Tensor | None = None,
    n_local_trials: int | None = None,
) -> torch.Tensor:
    """Greedy k-means++ (Arthur & Vassilvitskii 2007, greedy variant as in scikit-learn).

    Each new centroid is the best of ``n_local_trials`` candidates (default ``2 + log(k)``) sampled
    with probability proportional to weight × squared distance to the nearest chosen centroid; the
    best candidate is the one that lowers the total weighted potential the most.
    """
    n, device = data.n_samples, data.device
    if n_local_trials is None:
        n_local_trials = 2 + int(math.log(n_clusters))
    w = None if sample_weight is None else sample_weight.to(data.dtype)
    centroids = torch.empty(n_clusters, data.n_features, dtype=data.dtype, device=device)

    # Inverse-CDF draws throughout, so that integer weights act exactly like repeated rows.
    first_weights = torch.ones(n, dtype=torch.float64, device=device) if w is None else w.to(torch.float64)
    first = _draw(torch.cumsum(first_weights, dim=0), 1, generator)
    centroids[0] = data.take(first)[0]
    closest_sq = _ops.sq_distances_to(data, centroids[:1]).squeeze(1)

    for c in range(1, n_clusters):
        weighted = closest_sq if w is None else closest_sq * w
        # float64 cumulative sums, as scikit-learn's stable_cumsum: float32 loses small tails at large n.
        candidates = _draw(torch.cumsum(weighted.to(torch.float64), dim=0), n_local_trials, generator)
        cand_rows = data.take(candidates)
        cand_sq = _ops.sq_distances_to(data, cand_rows)  # (n, trials), chunked inside
        torch.minimum(cand_sq, closest_sq.unsqueeze(1), out=cand_sq)
        pots = cand_sq.sum(0) if w is None else w @ cand_sq
        best = int(torch.argmin(pots))
        closest_sq = cand_sq[:, best].contiguous()
        centroids[c] = cand_rows[best]
    return centroids
