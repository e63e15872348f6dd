"""torchkm: k-means clustering for PyTorch.

- :func:`torchkm.fit` / :class:`torchkm.KMeans` (an ``nn.Module``) cluster rows of a tensor;
- :func:`torchkm.assign` labels rows against given centroids;
- :class:`torchkm.nn.VectorQuantizer` / :class:`torchkm.nn.ResidualVQ` quantize inside a training loop;
- :mod:`torchkm.sklearn` wraps the same engine as a scikit-learn estimator;
- ``python -m torchkm`` clusters ``.npy`` / ``.fvecs`` files from the command line.
"""

from . import nn
from ._loop import ConvergenceWarning, IterationStats
from ._version import __version__
from .functional import KMeansResult, assign, empty_cache, fit, transform, update
from .kmeans import KMeans, NotFittedError
from .nn import ResidualVQ, VectorQuantizer

__all__ = [
    "ConvergenceWarning",
    "IterationStats",
    "KMeans",
    "KMeansResult",
    "NotFittedError",
    "ResidualVQ",
    "VectorQuantizer",
    "__version__",
    "assign",
    "empty_cache",
    "fit",
    "nn",
    "transform",
    "update",
]
