"""``torchkm.KMeans``: k-means as a ``torch.nn.Module`` whose centroids are a buffer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import _loop, _online, _ops
from . import functional as F
from ._loop import InitLike, IterationStats, SeedLike, check_algorithm, check_params
from ._reference import DataView
from ._streaming import StreamedView, default_chunk_rows
from ._validation import (
    as_data_tensor,
    check_nonzero_rows,
    check_precision,
    check_sample_weight,
    compute_dtype,
)

__all__ = ["KMeans", "NotFittedError"]


class NotFittedError(AttributeError, ValueError):
    """A fitted attribute or a prediction was asked of a KMeans that has not been fitted."""


_FITTED_PROPERTIES = frozenset({"cluster_centers_", "inertia_", "n_iter_", "n_features_in_", "n_steps_"})


class KMeans(nn.Module):
    """k-means clustering (Lloyd's algorithm) with scikit-learn's parameters and attributes.

    Args:
        n_clusters: number of clusters k (>= 1, <= n_samples).
        init: ``"auto"`` (default): ``"k-means||"`` for at least 256 clusters over at least
            2^25 row elements (n_samples x n_features) and 32 rows per cluster, held in memory,
            ``"k-means++"`` otherwise (on a 1M x 128 float32 tensor with k = 4096 on an H200,
            its fit took 0.22-0.24 s instead of k-means++'s 1.15-1.16 s, inertia within 1.1 %).
            ``"k-means++"``: greedy k-means++, scikit-learn's default; ``"random"``: k distinct
            rows; ``"k-means||"`` (Bahmani et al.: 5 rounds that each sample about 2k rows in one
            pass, then k-means++ on those candidates weighted by their nearest rows; for large n,
            where k-means++'s one pass per centroid is slow); a (n_clusters, n_features) tensor or
            array of initial centroids, or a callable ``init(x, n_clusters, seed) -> centroids``.
        n_init: number of runs from different initialisations; the one of lowest inertia is kept.
            ``"auto"``: scikit-learn's rule, 10 runs for ``init="random"`` or a callable, else 1.
        max_iter: maximum Lloyd iterations per run.
        tol: convergence threshold on the total squared centroid shift, relative to the mean
            per-feature variance of the data (scikit-learn's convention). A run also stops when
            no label changes.
        metric: ``"euclidean"`` (squared Euclidean k-means) or ``"cosine"`` (spherical k-means:
            rows and centroids are L2-normalised; distances are ``1 - cos``).
        random_state: int seed, ``torch.Generator``, numpy ``RandomState`` or ``Generator`` (each
            advanced by one draw per fit), or None to draw from torch's global RNG
            (so ``torch.manual_seed`` makes fits reproducible). Same seed, same device, same
            result.
        precision: how CUDA kernels compute distances. ``"exact"`` (default): the labels of an fp32
            computation, up to ties within fp32 rounding (a tensor-core pass, then a 3xTF32 re-check
            of the rows whose best two centroids are within its rounding bound; best two whose
            direct fp32 distances tie within rounding are settled in float64; rows of at most 32
            features over at most 128 clusters are scored in 3xTF32 throughout, whose near scores
            are settled that way only with ``TORCHKM_X3_TIES=1``). ``"fast"``: the
            tensor-core pass alone (tf32 products for float32 input, whose labels may differ from
            fp32 where two centroids are within ~1% of ||x|| max||c||; native products for
            float16/bfloat16 input). CPU tensors always compute in fp32 (fp64 for fp64 input).
        deterministic: on CUDA, sum the clusters with the sorted, segmented kernel so that reruns
            are bit-identical (slower for small k); the default (None) follows
            ``torch.are_deterministic_algorithms_enabled()``, else one fused pass with atomics
            whose last bits vary between runs (but over rows of 9-32 features and more than 64
            clusters, where dense Lloyd keeps float64 sums that repeat: to the bit on an H100 at
            3.9M x 32, k = 1,024). CPU runs are always deterministic.
        algorithm: ``"auto"`` (default): the measured hybrid. It starts as ``"lloyd"``, and on
            problems large enough for the choice to matter it tries ``"pruned"`` once the fit has
            spent 20 times what the trial costs (where dense passes outlast their host work, as
            soon as the passes the fit is projected to still run cost twice the trial, at d <= 3
            the box engine's set-up included, at d > 8 from the 8th iteration), keeping it while
            its passes measure faster than dense ones on this device (a dense pass counts as
            device-bound where it outlasts its launches; short fits stay dense, e.g. 8 ms ones at
            245,760 x 32, k = 1,024, where ``"pruned"`` is 1.2-1.4x faster: README).
            ``"lloyd"``: every iteration assigns every row
            with the fused dense pass. ``"pruned"``: rows keep a lower bound on their distance to the other centroids
            (from the exact pass's second-best candidate, lowered by how far centroids move); a row
            whose own centroid stays nearer than that bound is settled with one distance, and only
            the others go through the tensor-core search, so converged rows cost one read. Labels
            equal the dense exact pass's (the search always runs in the exact mode), and so do the
            iteration counts, up to fp32 ties. ``"triangle"``: seed 000's per-row triangle-
            inequality scan with workload-sorted rows (slower than the tensor cores on current GPUs;
            kept for study). For rows of at most 3 features, ``"pruned"`` instead sorts a float32
            copy of the rows once along a space-filling curve and searches each tile of 128 sorted
            rows over the few centroids that can be nearest to any point of the tile's bounding box
            (same labels as the dense pass; a tile whose one candidate all its rows already hold
            is not read again). Pruning needs the CUDA kernels; ``"auto"`` tries it for d > 8 and
            d <= 3. Elsewhere (and for ``"pruned"`` with 4 to 8 features, where the tiles' boxes
            exclude few centroids) the dense loop runs, and ``history_`` says which pass ran.
        max_points_per_centroid: faiss's sub-sampling: with more than ``max_points_per_centroid *
            n_clusters`` rows, the Lloyd iterations run on a uniform sample of that many rows (faiss
            uses 256), and the final labels and inertia are computed over all rows. Off by default
            (None); when it applies, the ``torchkm`` logger says so at INFO level.
        device: where to compute (default: ``x``'s device). Host rows (a CPU tensor, a numpy array,
            a memory-mapped ``.npy``) with ``device="cuda"`` are copied to the GPU once, or streamed;
            :meth:`predict` and :meth:`score` label host rows there too, and return to the host.
        streaming: host rows are streamed to ``device`` in chunks every pass, the copy of one chunk
            overlapping the kernels of the previous one (pin the tensor with ``x.pin_memory()`` for
            full speed; other rows go through pinned staging buffers). None (default): stream only
            when the rows do not fit in 70% of the GPU's free memory; True: always; False: never.
            Streamed fits give the in-memory fit's result up to fp32 summation order. Their labels
            stay on the host; k-means++ then runs on a uniform sample of the rows held on the GPU
            (logged; ``init="k-means||"`` uses all rows).
        chunk_rows: rows per streamed chunk (default: 256 MiB of rows).
        distributed: data-parallel fit over ``torch.distributed`` (launch with ``torchrun``; NCCL for
            GPUs, gloo for CPUs): True for the default process group, or a process group. Each rank
            passes its own shard of the rows; per-cluster sums and statistics are all-reduced every
            iteration, initialisation draws from the whole data set, and every rank ends with the
            same centroids, inertia and iteration count. ``labels_`` are the rank's own rows'.
        verbose: log per-iteration statistics through the ``torchkm`` logger at INFO level.
        progress: show a tqdm progress bar over iterations.

    Fitted attributes (scikit-learn names): ``cluster_centers_`` (the ``centroids`` buffer),
    ``labels_``, ``inertia_``, ``n_iter_``, ``n_features_in_``, ``history_`` (one
    :class:`IterationStats` per iteration of the kept run) and ``converged_``.

    :meth:`partial_fit` runs online (mini-batch) k-means instead, one batch per call, with
    scikit-learn's ``MiniBatchKMeans.partial_fit`` update; it also sets ``n_steps_``.

    The centroids are a registered buffer, so ``state_dict()`` / ``load_state_dict()`` (also into a
    fresh, unfitted module), ``.to(device)`` and ``.half()`` behave as for any module. ``labels_``
    describes the training data and is not part of the state dict. Fitting computes on the
    input's device and leaves the centroids there, in float32 (float64 for float64 input).

    Example:
        >>> import torch, torchkm
        >>> km = torchkm.KMeans(8, random_state=0).fit(torch.randn(500, 4))
        >>> km.predict(torch.randn(3, 4)).shape
        torch.Size([3])
    """

    centroids: torch.Tensor

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: InitLike = "auto",
        n_init: int | str = 1,
        max_iter: int = 300,
        tol: float = 1e-4,
        metric: str = "euclidean",
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
    ) -> None:
        super().__init__()
        self.n_clusters, self.n_init, self.max_iter, self.tol = check_params(n_clusters, init, n_init, max_iter, tol, metric)
        self.init = init
        self.metric = metric
        self.precision = check_precision(precision)
        self.deterministic = deterministic
        self.algorithm = check_algorithm(algorithm)
        self.max_points_per_centroid = max_points_per_centroid
        self.device = device
        self.streaming = streaming
        self.chunk_rows = chunk_rows
        self.distributed = distributed
        self.random_state = random_state
        self.verbose = verbose
        self.progress = progress
        self.register_buffer("centroids", torch.empty(0, 0))
        self.labels_: torch.Tensor | None = None
        self._inertia: float | None = None
        self._n_iter: int | None = None
        self.history_: list[IterationStats] = []
        self.converged_: bool | None = None
        # Online k-means: total weight assigned to each cluster so far (partial_fit's learning rates).
        self._cluster_weight: torch.Tensor | None = None
        self._n_steps = 0

    # -- fitted state ---------------------------------------------------------------------------

    @property
    def is_fitted(self) -> bool:
        return self.centroids.numel() > 0

    def _require_fitted(self, what: str) -> None:
        if not self.is_fitted:
            raise NotFittedError(f"this KMeans is not fitted yet; call .fit(x) before {what}")

    def __getattr__(self, name: str) -> Any:
        # A property that raises AttributeError falls through to nn.Module.__getattr__, whose
        # message would hide ours; hasattr(km, "cluster_centers_") stays False before fit.
        if name in _FITTED_PROPERTIES:
            raise NotFittedError(f"this KMeans is not fitted yet; call .fit(x) before reading {name}")
        return super().__getattr__(name)

    @property
    def cluster_centers_(self) -> torch.Tensor:
        self._require_fitted("reading cluster_centers_")
        return self.centroids

    @property
    def inertia_(self) -> float:
        self._require_fitted("reading inertia_")
        assert self._inertia is not None
        return self._inertia

    @property
    def n_iter_(self) -> int:
        self._require_fitted("reading n_iter_")
        assert self._n_iter is not None
        return self._n_iter

    @property
    def n_steps_(self) -> int:
        """Number of :meth:`partial_fit` batches processed."""
        self._require_fitted("reading n_steps_")
        return self._n_steps

    @property
    def n_features_in_(self) -> int:
        self._require_fitted("reading n_features_in_")
        return self.centroids.shape[1]

    # -- training -------------------------------------------------------------------------------

    def fit(self, x: Any, sample_weight: Any = None) -> KMeans:
        """Fit the centroids to the rows of ``x`` (tensor on any device, or numpy array); returns self."""
        out = _loop.fit(
            x, self.n_clusters, init=self.init, n_init=self.n_init, max_iter=self.max_iter, tol=self.tol,
            metric=self.metric, sample_weight=sample_weight, random_state=self.random_state,
            precision=self.precision, deterministic=self.deterministic, algorithm=self.algorithm,
            max_points_per_centroid=self.max_points_per_centroid, device=self.device, streaming=self.streaming,
            chunk_rows=self.chunk_rows, distributed=self.distributed, verbose=self.verbose, progress=self.progress,
        )
        self.centroids = out.centroids
        self.labels_ = out.labels
        self._inertia = out.inertia
        self._n_iter = out.n_iter
        self.history_ = out.history
        self.converged_ = out.converged
        self._cluster_weight = None
        self._n_steps = 0
        return self

    @torch.no_grad()
    @_ops.eager_launches
    def partial_fit(self, x: Any, sample_weight: Any = None) -> KMeans:
        """Update the centroids with one mini-batch ``x`` (online k-means); returns self.

        scikit-learn's ``MiniBatchKMeans.partial_fit`` semantics: the first call on an unfitted
        model initialises the centroids from that batch with ``init`` (no Lloyd iterations; the batch
        needs at least ``n_clusters`` rows). Every call then assigns the batch to the nearest
        centroids and moves each centroid to the weighted mean of all rows ever assigned to it (a
        per-cluster learning rate of batch weight over total weight); clusters that received no
        weight yet keep their position. After :meth:`fit`, the fitted clusters' sizes seed those
        totals, so later batches refine the fit instead of replacing it. Unlike scikit-learn, small
        clusters are not randomly reassigned. For ``metric="cosine"`` the sums are of unit rows and
        the centroids are renormalised (online spherical k-means). This is the update of
        :class:`torchkm.nn.VectorQuantizer` without a decay.

        Sets ``labels_`` and ``inertia_`` for this batch, and counts ``n_steps_``.
        """
        x = as_data_tensor(x, "x")
        if self.is_fitted and x.shape[1] != self.centroids.shape[1]:
            raise ValueError(f"x has {x.shape[1]} features, but this KMeans was fitted on {self.centroids.shape[1]}")
        dtype = compute_dtype(x.dtype)
        w = check_sample_weight(sample_weight, x, dtype)
        normalize = self.metric == "cosine"
        if normalize:
            check_nonzero_rows(x)
        if not self.is_fitted:
            generator = self.random_state
            self.centroids = _loop.initial_centroids(x, self.n_clusters, init=self.init, metric=self.metric,
                                                     sample_weight=w, random_state=generator).to(dtype)
            self._cluster_weight = torch.zeros(self.n_clusters, dtype=dtype, device=x.device)
        elif self._cluster_weight is None:
            self._cluster_weight = self._fitted_cluster_weight()
        centroids = self.centroids.to(device=x.device, dtype=dtype)
        weight = self._cluster_weight.to(device=x.device, dtype=dtype, copy=True)  # may be shared with a state dict
        labels, _ = F.assign(x, centroids, metric=self.metric, precision=self.precision)
        sums, counts = _ops.update(DataView(x, dtype, None, normalize), labels, self.n_clusters, w,
                                   deterministic=bool(self.deterministic))
        embed_sum = centroids * weight.unsqueeze(1)
        _online.accumulate(weight, embed_sum, counts, sums, decay=None)
        self.centroids = _online.centroids_from_stats(embed_sum, weight, centroids, normalize=normalize)
        self._cluster_weight = weight
        # As scikit-learn: labels and inertia of the batch against the updated centroids.
        self.labels_, dist = F.assign(x, self.centroids, metric=self.metric, precision=self.precision)
        self._inertia = float(dist.sum() if w is None else dist @ w)
        self._n_steps += 1
        if not self.history_:  # built by partial_fit alone: its iterations are its steps
            self._n_iter = self._n_steps
        return self

    def _fitted_cluster_weight(self) -> torch.Tensor:
        """Cluster sizes of the last ``fit`` (its labels), or zeros for centroids loaded from a state dict."""
        weight = torch.zeros(self.n_clusters, dtype=self.centroids.dtype, device=self.centroids.device)
        if self.labels_ is not None and self.labels_.numel():
            labels = self.labels_.to(weight.device)
            weight.scatter_add_(0, labels, torch.ones_like(labels, dtype=weight.dtype))
        return weight

    def fit_predict(self, x: Any, sample_weight: Any = None) -> torch.Tensor:
        """Fit, then return the training labels (they match the fitted centroids)."""
        labels = self.fit(x, sample_weight).labels_
        assert labels is not None
        return labels

    # -- inference ------------------------------------------------------------------------------

    def _checked(self, x: Any) -> torch.Tensor:
        # Full validation happens in functional; this only gives the module's own messages first.
        # Read-only arrays (memory maps) are not copied: they are only read.
        self._require_fitted("predicting")
        x = as_data_tensor(x, "x", check_finite=False, copy_readonly=False)
        if x.shape[1] != self.centroids.shape[1]:
            raise ValueError(
                f"x has {x.shape[1]} features, but this KMeans was fitted on {self.centroids.shape[1]}"
            )
        return x

    def _assign(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels and distances of ``x``. With ``device`` set, host rows against centroids on a GPU
        are streamed there in chunks (the copy of one overlapping the search of the previous) and
        their results come back to the host; otherwise ``x`` must be on the centroids' device, as
        for any module."""
        if self.device is None or x.device.type != "cpu" or self.centroids.device.type == "cpu":
            return F.assign(x, self.centroids, metric=self.metric, precision=self.precision)
        view = StreamedView(x, compute_dtype(x.dtype), compute_device=self.centroids.device,
                            chunk_rows=default_chunk_rows(x))
        labels = torch.empty(x.shape[0], dtype=torch.int64)
        dist = torch.empty(x.shape[0], dtype=compute_dtype(x.dtype, self.centroids.dtype))
        for start, stop, piece in view.pieces():
            piece_labels, piece_dist = F.assign(piece.x, self.centroids, metric=self.metric, precision=self.precision)
            labels[start:stop] = piece_labels.cpu()
            dist[start:stop] = piece_dist.cpu()
        return labels, dist

    def predict(self, x: Any) -> torch.Tensor:
        """Index (int64) of the nearest centroid for each row of ``x``, on ``x``'s device. With
        ``device="cuda"``, host rows (numpy arrays and memory maps too) are labelled on the GPU."""
        return self._assign(self._checked(x))[0]

    def forward(self, x: Any) -> torch.Tensor:
        """Same as :meth:`predict`."""
        return self.predict(x)

    def transform(self, x: Any) -> torch.Tensor:
        """(n_samples, n_clusters) distances to every centroid: Euclidean (not squared), or ``1 - cos``."""
        return F.transform(self._checked(x), self.centroids, metric=self.metric)

    @torch.no_grad()
    def score(self, x: Any, sample_weight: Any = None) -> float:
        """Opposite of the (weighted) inertia of ``x`` against the fitted centroids: higher is better."""
        x = self._checked(x)
        _, dist = self._assign(x)
        w = check_sample_weight(sample_weight, x, dist.dtype)
        return -float(dist.sum() if w is None else dist @ w)

    # -- state dict -----------------------------------------------------------------------------

    def get_extra_state(self) -> dict[str, Any]:
        return {"n_clusters": self.n_clusters, "metric": self.metric, "inertia_": self._inertia,
                "n_iter_": self._n_iter, "converged_": self.converged_,
                "cluster_weight": self._cluster_weight, "n_steps_": self._n_steps}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("metric", self.metric) != self.metric:
            raise ValueError(f"state was saved with metric={state['metric']!r}, this KMeans has metric={self.metric!r}")
        self._inertia = state.get("inertia_")
        self._n_iter = state.get("n_iter_")
        self.converged_ = state.get("converged_")
        weight = state.get("cluster_weight")
        self._cluster_weight = None if weight is None else weight.to(self.centroids.device, copy=True)
        self._n_steps = state.get("n_steps_", 0)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):  # type: ignore[override]
        key = prefix + "centroids"
        incoming = state_dict.get(key)
        if isinstance(incoming, torch.Tensor) and incoming.shape != self.centroids.shape:
            if incoming.dim() != 2 or (incoming.numel() and incoming.shape[0] != self.n_clusters):
                error_msgs.append(
                    f"{key}: saved centroids have shape {tuple(incoming.shape)}, but this KMeans has n_clusters={self.n_clusters}"
                )
                return
            # An unfitted module takes the saved shape, like a lazy module materialising.
            self.centroids = torch.empty(incoming.shape, dtype=incoming.dtype, device=self.centroids.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        fitted = f", n_features={self.centroids.shape[1]}" if self.is_fitted else ", unfitted"
        return f"n_clusters={self.n_clusters}, metric={self.metric!r}{fitted}"
