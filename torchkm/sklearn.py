"""``torchkm.sklearn.KMeans``: a scikit-learn estimator over torchkm's engine.

A drop-in for ``sklearn.cluster.KMeans`` in pipelines, grid searches and ``clone``: numpy in,
numpy out, parameters stored untouched by ``__init__``, fitted attributes ending in ``_``.
Requires scikit-learn >= 1.6 (``pip install torchkm-triton[test]`` brings it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
)
from sklearn.utils import check_random_state
from sklearn.utils.validation import (
    _check_sample_weight,
    check_is_fitted,
    validate_data,
)

from ._loop import fit as _fit
from ._validation import check_device
from .functional import assign as _assign
from .functional import transform as _transform

__all__ = ["KMeans"]


def _sklearn_callable(init: Any) -> Any:
    """A callable ``init`` with scikit-learn's signature, ``init(X, n_clusters, random_state)`` (numpy
    rows, a ``RandomState``), as torchkm calls one: ``init(x, n_clusters, seed)`` (a tensor, an int)."""

    def call(x: torch.Tensor, n_clusters: int, seed: int) -> np.ndarray:
        return np.asarray(init(x.cpu().numpy(), n_clusters, random_state=check_random_state(seed % 2**32)))

    return call


class KMeans(ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin, BaseEstimator):
    """k-means with scikit-learn's interface, computed by torchkm.

    Args:
        n_clusters, init, n_init, max_iter, tol, random_state: as in ``sklearn.cluster.KMeans``
            (``random_state`` also takes a ``numpy.random.RandomState``; a callable ``init`` is called as
            scikit-learn calls it, ``init(X, n_clusters, random_state=RandomState)``). ``n_init="auto"`` (the
            default, as scikit-learn's) runs once, or 10 times for ``init="random"`` or a callable.
        metric: ``"euclidean"`` or ``"cosine"`` (spherical k-means), see :class:`torchkm.KMeans`.
        algorithm: ``"auto"`` (default), ``"lloyd"``, ``"pruned"`` or ``"triangle"``, see
            :class:`torchkm.KMeans`; scikit-learn's ``"elkan"`` (bounds from the triangle
            inequality) means ``"pruned"``.
        verbose: log per-iteration statistics through the ``torchkm`` logger.
        copy_x: accepted for scikit-learn's signature; torchkm never writes to ``X`` (it centres
            copies of chunks, or on the device), so ``False`` changes nothing.
        device: where to compute: ``"cpu"``, ``"cuda"``, ``"cuda:1"``..., or None for CUDA when
            available and CPU otherwise. Results are numpy arrays either way.

    Attributes:
        cluster_centers_, labels_, inertia_, n_iter_, n_features_in_, feature_names_in_: as in
            scikit-learn; ``history_`` lists per-iteration :class:`torchkm.IterationStats`.
    """

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        init: Any = "k-means++",
        n_init: int | str = "auto",
        max_iter: int = 300,
        tol: float = 1e-4,
        metric: str = "euclidean",
        algorithm: str = "auto",
        verbose: int = 0,
        random_state: Any = None,
        copy_x: bool = True,
        device: str | None = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.metric = metric
        self.algorithm = algorithm
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.device = device

    def _device(self) -> torch.device:
        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return check_device(self.device)

    def _tensor(self, X: np.ndarray) -> torch.Tensor:
        X = np.ascontiguousarray(X)
        if not X.flags.writeable:  # torch.from_numpy warns on read-only arrays (memmaps, views)
            X = X.copy()
        return torch.from_numpy(X).to(self._device())

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> KMeans:
        """Compute k-means clustering of ``X`` (array-like of shape (n_samples, n_features))."""
        X = validate_data(self, X, dtype=[np.float64, np.float32], copy=False)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X, dtype=X.dtype)
        init = self.init
        if hasattr(init, "__array__") and not isinstance(init, torch.Tensor):
            init = np.asarray(init, dtype=X.dtype)
        if isinstance(init, np.ndarray):
            init = self._tensor(init)
        elif callable(init):
            init = _sklearn_callable(init)
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        out = _fit(
            self._tensor(X), self.n_clusters, init=init, n_init=self.n_init, max_iter=self.max_iter,
            tol=self.tol, metric=self.metric,
            sample_weight=None if sample_weight is None else torch.from_numpy(sample_weight),
            random_state=seed, algorithm="pruned" if self.algorithm == "elkan" else self.algorithm,
            verbose=bool(self.verbose),
        )
        self.cluster_centers_ = out.centroids.cpu().numpy().astype(X.dtype, copy=False)
        self.labels_ = out.labels.cpu().numpy()
        self.inertia_ = float(out.inertia)
        self.n_iter_ = int(out.n_iter)
        self.history_ = out.history
        self._n_features_out = self.cluster_centers_.shape[0]
        return self

    def _validated(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return validate_data(self, X, dtype=[np.float64, np.float32], reset=False)

    def predict(self, X: Any) -> np.ndarray:
        """Index of the closest cluster centre for each sample."""
        X = self._validated(X)
        return _assign(self._tensor(X), self._tensor(self.cluster_centers_), metric=self.metric)[0].cpu().numpy()

    def transform(self, X: Any) -> np.ndarray:
        """Distances to each cluster centre, shape (n_samples, n_clusters)."""
        X = self._validated(X)
        d = _transform(self._tensor(X), self._tensor(self.cluster_centers_), metric=self.metric)
        return d.cpu().numpy().astype(X.dtype, copy=False)

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Opposite of the (weighted) inertia of ``X`` against the fitted centres."""
        X = self._validated(X)
        _, dist = _assign(self._tensor(X), self._tensor(self.cluster_centers_), metric=self.metric)
        dist = dist.cpu().numpy().astype(np.float64)
        if sample_weight is not None:
            dist = dist * _check_sample_weight(sample_weight, X, dtype=np.float64)
        return -float(dist.sum())

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
