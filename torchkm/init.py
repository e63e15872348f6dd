"""Centroid initialisation: greedy k-means++ (scikit-learn's variant), uniform random rows, and
k-means|| (Bahmani et al. 2012) for large data.

Random numbers come from a CPU ``torch.Generator`` and only their few results travel to the data's
device, so a seed picks the same candidate rows on every device (up to floating-point ties). With
a process group (``comm``), every rank holds a shard of the rows and draws from the same generator
state, so that all ranks pick the same rows of the whole data set and end with the same centroids.
"""

from __future__ import annotations

import logging
import math

import torch

from . import _ops
from ._distributed import Comm
from ._reference import DataView

__all__ = ["kmeans_parallel", "kmeans_plusplus", "random_rows", "rank_stream", "sample_shard"]

logger = logging.getLogger("torchkm")
_SINGLE = Comm()
_POOL_LLOYD_ITERATIONS = 30


def rank_stream(generator: torch.Generator, comm: Comm, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator of this rank's own, seeded from the shared ``generator`` (which it advances the
    same way on every rank): for draws over a rank's own rows, different on every rank."""
    stream = torch.Generator(device=device)
    stream.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)) + comm.rank)
    return stream


def sample_shard(n_local: int, size: int, n_total: int, generator: torch.Generator, comm: Comm) -> torch.Tensor:
    """Sorted indices of a uniform sample of this rank's rows, its share (in proportion to its rows)
    of a sample of about ``size`` of all ranks' ``n_total`` rows."""
    local_size = min(n_local, max(1, round(size * n_local / n_total)))
    return torch.randperm(n_local, generator=rank_stream(generator, comm))[:local_size].sort().values


def _draw(cumulative: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Indices drawn with probability proportional to the increments of ``cumulative``."""
    u = torch.rand(size, generator=generator, dtype=torch.float64).to(cumulative.device)
    return torch.searchsorted(cumulative, u * cumulative[-1]).clamp_max_(cumulative.numel() - 1)


def _draw_rows(data: DataView, cumulative: torch.Tensor, size: int, generator: torch.Generator, comm: Comm) -> torch.Tensor:
    """``size`` transformed rows of the whole (sharded) data set, drawn with probability proportional
    to the increments of this rank's ``cumulative``; the same rows on every rank."""
    if not comm.active:
        return data.take(_draw(cumulative, size, generator))
    totals = comm.gather_same(cumulative[-1:].to(torch.float64)).cpu()
    u = torch.rand(size, generator=generator, dtype=torch.float64) * totals.sum()
    ends = torch.cumsum(totals, 0)
    owner = torch.searchsorted(ends, u, right=True).clamp_max_(comm.world - 1)
    rows = torch.zeros(size, data.n_features, dtype=data.dtype, device=data.device)
    mine = (owner == comm.rank).nonzero().flatten()
    if mine.numel():
        local_u = (u[mine] - (ends[comm.rank] - totals[comm.rank])).to(cumulative.device)
        index = torch.searchsorted(cumulative, local_u).clamp_max_(cumulative.numel() - 1)
        rows[mine.to(data.device)] = data.take(index)
    return comm.sum_(rows)


def random_rows(
    data: DataView,
    n_clusters: int,
    generator: torch.Generator,
    sample_weight: torch.Tensor | None = None,
    comm: Comm = _SINGLE,
) -> torch.Tensor:
    """``n_clusters`` distinct rows drawn without replacement (with probability ∝ weight if given)."""
    n = data.n_samples
    if comm.active:
        return _random_rows_sharded(data, n_clusters, generator, sample_weight, comm)
    if sample_weight is None:
        index = torch.randperm(n, generator=generator)[:n_clusters]
    else:
        # Efraimidis–Spirakis: the k largest log(u)/w are a weighted sample without replacement.
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        keys = torch.log(u) / sample_weight.detach().to("cpu", torch.float64)
        index = torch.topk(keys, n_clusters).indices
    return data.take(index)


def _random_rows_sharded(
    data: DataView, n_clusters: int, generator: torch.Generator, sample_weight: torch.Tensor | None, comm: Comm
) -> torch.Tensor:
    # Efraimidis–Spirakis keys (uniform rows: weight 1) from a stream of this rank's own; the k largest
    # keys of all ranks are a sample of the whole data set without replacement.
    u = torch.rand(data.n_samples, generator=rank_stream(generator, comm), dtype=torch.float64)
    keys = torch.log(u)
    if sample_weight is not None:
        keys = keys / sample_weight.detach().to("cpu", torch.float64)
    top = torch.topk(keys, min(n_clusters, data.n_samples))
    all_keys = comm.gather_rows(top.values.to(data.device))
    all_rows = comm.gather_rows(data.take(top.indices))
    return all_rows[torch.topk(all_keys, n_clusters).indices]


def kmeans_plusplus(
    data: DataView,
    n_clusters: int,
    generator: torch.Generator,
    sample_weight: torch.Tensor | None = None,
    n_local_trials: int | None = None,
    comm: Comm = _SINGLE,
) -> torch.Tensor:
    """Greedy k-means++ (Arthur & Vassilvitskii 2007, greedy variant as in scikit-learn).

    Each new centroid is the best of ``n_local_trials`` candidates (default ``2 + log(k)``) sampled
    with probability proportional to weight × squared distance to the nearest chosen centroid; the
    best candidate is the one that lowers the total weighted potential the most.

    On the kernels (CUDA, one process) the steps run on the device (``torchkm._kernels.seeding``):
    no host synchronisation per centroid, CUDA graphs of several steps, and only the rows that a
    trial could come nearer to are read (the triangle inequality settles the others, exactly). The
    uniforms and so the rows drawn are this loop's (up to floating-point ties). On an H200, 32,768 x
    256 with k = 8192 took 0.33 s and 1M x 768 bf16 with k = 8192 6.7 s, against 2.3 s and 39 s for
    this loop (``scripts/diag_init.py``, BENCHMARKS.md 2026-11-23).
    """
    n, device = data.n_samples, data.device
    if n_local_trials is None:
        n_local_trials = 2 + int(math.log(n_clusters))
    w = None if sample_weight is None else sample_weight.to(data.dtype)
    # Inverse-CDF draws throughout, so that integer weights act exactly like repeated rows.
    first_weights = torch.ones(n, dtype=torch.float64, device=device) if w is None else w.to(torch.float64)
    if _ops.uses_kernels(data) and data.in_memory and not comm.active:
        # The steps on the device, no host sync per centroid. The uniforms are those the loop below
        # draws, step by step, from the same generator (one call for all: the same numbers).
        first = _draw(torch.cumsum(first_weights, dim=0), 1, generator)
        uniforms = torch.cat([torch.zeros(1, n_local_trials, dtype=torch.float64),
                              torch.rand(n_clusters - 1, n_local_trials, generator=generator, dtype=torch.float64)])
        return data.take(_ops.kmeans_plusplus_rows(data, n_clusters, first, uniforms, w))
    centroids = torch.empty(n_clusters, data.n_features, dtype=data.dtype, device=device)
    centroids[0] = _draw_rows(data, torch.cumsum(first_weights, dim=0), 1, generator, comm)[0]
    closest_sq = _ops.sq_distances_to(data, centroids[:1]).squeeze(1)

    for c in range(1, n_clusters):
        weighted = closest_sq if w is None else closest_sq * w
        # float64 cumulative sums, as scikit-learn's stable_cumsum: float32 loses small tails at large n.
        cand_rows = _draw_rows(data, torch.cumsum(weighted.to(torch.float64), dim=0), n_local_trials, generator, comm)
        cand_sq = _ops.sq_distances_to(data, cand_rows)  # (n, trials), chunked inside
        torch.minimum(cand_sq, closest_sq.unsqueeze(1), out=cand_sq)
        pots = comm.sum_(cand_sq.sum(0) if w is None else w @ cand_sq)
        best = int(torch.argmin(pots))
        closest_sq = cand_sq[:, best].contiguous()
        centroids[c] = cand_rows[best]
    return centroids


def kmeans_parallel(
    data: DataView,
    n_clusters: int,
    generator: torch.Generator,
    sample_weight: torch.Tensor | None = None,
    comm: Comm = _SINGLE,
    rounds: int = 5,
    oversampling: float = 2.0,
) -> torch.Tensor:
    """k-means|| (Bahmani, Moseley, Vattani, Kumar, Vassilvitskii, VLDB 2012).

    One row is drawn as for k-means++. Each of ``rounds`` rounds then keeps every row independently
    with probability ``min(1, l * w * D^2 / phi)`` (``l = oversampling * n_clusters``, ``D^2`` the
    squared distance to the nearest candidate so far, ``phi`` the total weighted ``D^2``), which adds
    about ``l`` candidates per round with one pass over the data. Each candidate is weighted by the
    rows nearest to it; greedy k-means++ and then up to 30 Lloyd iterations on the weighted
    candidates give the ``n_clusters`` centroids (random rows fill in should the rounds find fewer
    candidates than that). Every pass over the data is a fused assignment against the new
    candidates, so the cost is ``rounds + 1`` passes instead of k-means++'s ``n_clusters``.
    """
    device = data.device
    w = None if sample_weight is None else sample_weight.to(data.dtype)
    ones = torch.ones(data.n_samples, dtype=torch.float64, device=device) if w is None else w.to(torch.float64)
    candidates = [_draw_rows(data, torch.cumsum(ones, 0), 1, generator, comm)]
    closest_sq = _ops.assign(data, candidates[0])[1].to(torch.float64)
    # Each row's nearest candidate so far (index into the pool): the candidates' weights then need
    # no pass of their own against the whole pool, which would cost ~2 * rounds Lloyd iterations.
    closest = torch.zeros(data.n_samples, dtype=torch.int64, device=device)
    pool_size = 1
    # Per-row coins from a device generator seeded from the fit's stream (and the rank): cheap for
    # 10^8 rows, reproducible for a seed on a given device.
    coins = rank_stream(generator, comm, device)
    per_round = oversampling * n_clusters  # the paper's l: expected candidates per round
    for _ in range(rounds):
        weighted = closest_sq if w is None else closest_sq * w
        phi = float(comm.sum_(weighted.sum().reshape(1))[0])
        if phi <= 0:
            break  # every row sits on a candidate
        keep = torch.rand(data.n_samples, generator=coins, device=device, dtype=torch.float64) < weighted * (per_round / phi)
        new = comm.gather_rows(data.take(keep.nonzero().flatten()))
        if new.shape[0] == 0:
            continue
        candidates.append(new)
        labels, sq = _ops.assign(data, new)
        nearer = sq.to(torch.float64) < closest_sq  # ties stay with the earlier candidate
        closest_sq = torch.where(nearer, sq.to(torch.float64), closest_sq)
        closest = torch.where(nearer, labels + pool_size, closest)
        pool_size += new.shape[0]
    pool = torch.cat(candidates)
    if pool.shape[0] < n_clusters:
        logger.info("k-means||: %d candidates for %d clusters; adding random rows", pool.shape[0], n_clusters)
        pool = torch.cat([pool, random_rows(data, n_clusters - pool.shape[0], generator, sample_weight, comm)])
        closest = _ops.assign(data, pool)[0]  # the added rows take their share of the weight
    pool_weight = torch.zeros(pool.shape[0], dtype=torch.float64, device=device)
    pool_weight.index_add_(0, closest, ones)
    comm.sum_(pool_weight)
    logger.debug("k-means||: %d weighted candidates for %d clusters", pool.shape[0], n_clusters)
    # Candidates are rows of the transformed space already: no offset, no further normalisation.
    pool_view = DataView(pool, data.dtype)
    pool_weight = pool_weight.to(data.dtype)
    centroids = kmeans_plusplus(pool_view, n_clusters, generator, pool_weight)
    # Then Lloyd on the weighted candidates (the paper's reclustering step, as Spark's k-means|| does).
    for _ in range(_POOL_LLOYD_ITERATIONS):
        labels = _ops.assign(pool_view, centroids)[0]
        sums, counts = _ops.update(pool_view, labels, n_clusters, pool_weight)
        means = sums.to(data.dtype) / counts.to(data.dtype).clamp_min(1e-30).unsqueeze(1)
        moved = torch.where((counts > 0).unsqueeze(1), means, centroids)
        if data.normalize:
            moved = moved / torch.linalg.vector_norm(moved, dim=1, keepdim=True).clamp_min(1e-30)
        if torch.equal(moved, centroids):
            break
        centroids = moved
    return centroids
