"""Online centroid statistics, shared by ``KMeans.partial_fit`` and ``torchkm.nn.VectorQuantizer``.

Both keep, per cluster, a running weight ``cluster_size`` (k,) and a running sum of the rows
assigned to it ``embed_sum`` (k, d), both float32, and derive the centroids from them:

- ``decay=None``: cumulative sums, so every centroid is the mean of all rows ever assigned to it.
  That is scikit-learn's ``MiniBatchKMeans.partial_fit`` update (a per-cluster learning rate of
  batch weight over total weight).
- ``0 < decay < 1``: exponential moving averages (VQ-VAE's codebook update, van den Oord et al.
  2017, appendix), with Laplace smoothing of the sizes so that rarely used codes never divide by 0.

Everything here is in-place tensor arithmetic without host synchronisation, so it runs inside
``torch.compile`` graphs and CUDA graphs. On the kernels, the layer's EMA step does the same in two
launches (``torchkm._kernels.online.ema_update``, through ``_ops.assign_and_ema_update``); this
module stays the CPU, ``torch.compile`` and ``torch.distributed`` path, and the kernel's tests hold
the two together.
"""

from __future__ import annotations

import torch

__all__ = ["accumulate", "centroids_from_stats", "replace_dead"]


@torch.no_grad()
def accumulate(
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor | None,
    counts: torch.Tensor,
    sums: torch.Tensor | None,
    decay: float | None,
    apply: torch.Tensor | None = None,
) -> None:
    """Fold one batch's per-cluster ``counts`` and ``sums`` into the running statistics, in place.
    ``apply`` (0-d bool, on the device): fold them only where true, with no host sync."""
    if apply is not None:
        # Where not applied, the batch's statistics are replaced by what leaves the running ones
        # exactly as they are: nothing to add, or the running value itself to move towards.
        counts = torch.where(apply, counts.to(cluster_size.dtype), 0.0 if decay is None else cluster_size)
        if embed_sum is not None and sums is not None:
            sums = torch.where(apply, sums.to(embed_sum.dtype), 0.0 if decay is None else embed_sum)
    if decay is None:
        cluster_size.add_(counts.to(cluster_size.dtype))
        if embed_sum is not None and sums is not None:
            embed_sum.add_(sums.to(embed_sum.dtype))
    else:
        cluster_size.lerp_(counts.to(cluster_size.dtype), 1.0 - decay)
        if embed_sum is not None and sums is not None:
            embed_sum.lerp_(sums.to(embed_sum.dtype), 1.0 - decay)


@torch.no_grad()
def centroids_from_stats(
    embed_sum: torch.Tensor,
    cluster_size: torch.Tensor,
    previous: torch.Tensor,
    *,
    normalize: bool,
    smoothing: float | None = None,
) -> torch.Tensor:
    """Centroids ``embed_sum / cluster_size``.

    Without ``smoothing``, clusters that never received weight keep their ``previous`` row (never
    NaN). With ``smoothing=eps``, the sizes are Laplace-smoothed first,
    ``(size + eps) / (total + k eps) * total``, as in the EMA codebooks of VQ-VAE. ``normalize``
    L2-normalises the result (spherical k-means, cosine codebooks); a vanishing sum keeps the
    previous direction.
    """
    if smoothing is not None:
        total = cluster_size.sum()
        sizes = (cluster_size + smoothing) / (total + cluster_size.numel() * smoothing) * total
        filled = sizes > 0
    else:
        sizes = cluster_size
        filled = cluster_size > 0
    means = embed_sum / torch.where(filled, sizes, torch.ones_like(sizes)).unsqueeze(1)
    new = torch.where(filled.unsqueeze(1), means, previous.to(means.dtype))
    if normalize:
        norms = torch.linalg.vector_norm(new, dim=1, keepdim=True)
        new = torch.where(norms > 1e-12, new / norms.clamp_min(1e-30), previous.to(new.dtype))
    return new


@torch.no_grad()
def replace_dead(
    dead: torch.Tensor,
    candidates: torch.Tensor,
    centroids: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor | None,
    reset_size: float,
) -> None:
    """Move the clusters flagged in ``dead`` (k,) onto the rows of ``candidates`` (k, d), in place,
    restarting their statistics at weight ``reset_size``."""
    rows = dead.unsqueeze(1)
    candidates = candidates.to(centroids.dtype)
    centroids.copy_(torch.where(rows, candidates, centroids))
    cluster_size.copy_(torch.where(dead, torch.full_like(cluster_size, reset_size), cluster_size))
    if embed_sum is not None:
        embed_sum.copy_(torch.where(rows, candidates.to(embed_sum.dtype) * reset_size, embed_sum))
