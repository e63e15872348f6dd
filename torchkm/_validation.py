"""Input checks shared by every public entry point, and their error messages.

Every message names the offending value, so that a user reading a traceback knows what to fix
without opening the source.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "as_data_tensor",
    "check_centroids",
    "check_n_clusters",
    "check_nonzero_rows",
    "check_same_device",
    "check_sample_weight",
    "compute_dtype",
    "ensure_finite",
    "iter_row_chunks",
    "overflow_limit",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Rows per chunk are chosen so that one chunk's temporaries stay near this many elements.
_CHUNK_ELEMENTS = 1 << 24


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"torch.Tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device})"
    if isinstance(x, np.ndarray):
        return f"numpy.ndarray(shape={x.shape}, dtype={x.dtype})"
    return type(x).__name__


def as_data_tensor(x: Any, name: str = "x", *, check_finite: bool = True, copy_readonly: bool = True) -> torch.Tensor:
    """Return ``x`` as a 2-D floating tensor (no copy when it already is one), or raise.

    Accepts torch tensors on any device and numpy arrays (viewed as CPU tensors). Non-contiguous
    views are accepted; the engine reads them chunk by chunk. Read-only arrays (a memory-mapped
    ``.npy``) are copied unless ``copy_readonly=False``, for callers that only ever read them.
    """
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "c":
            raise TypeError(f"{name} is complex ({x.dtype}); k-means needs real floating-point data")
        if x.dtype.kind not in "f":
            raise TypeError(
                f"{name} has dtype {x.dtype}; pass floating-point data "
                f"(e.g. {name}.astype(numpy.float32))"
            )
        if not x.dtype.isnative:
            # Big-endian files (e.g. a .npy written on another machine): torch takes native order only.
            x = x.astype(x.dtype.newbyteorder("="))
        if not x.flags.writeable and copy_readonly:
            # torch.from_numpy warns on read-only arrays; a copy is the honest way to share them.
            x = x.copy()
        with warnings.catch_warnings():
            # Only read-only arrays the caller promised never to write reach here unwritable.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            x = torch.from_numpy(x)
    elif not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor or a numpy.ndarray, got {_describe(x)}; "
            f"wrap lists with torch.tensor(..., dtype=torch.float32)"
        )
    if x.is_complex():
        raise TypeError(f"{name} is complex ({x.dtype}); k-means needs real floating-point data")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {x.dtype}; pass float16, bfloat16, float32 or float64 data "
            f"(e.g. {name}.float())"
        )
    if x.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D with shape (n_samples, n_features), got {x.dim()}-D shape "
            f"{tuple(x.shape)}" + ("; use x.reshape(-1, 1) for a single feature" if x.dim() == 1 else "")
        )
    n, d = x.shape
    if n == 0 or d == 0:
        raise ValueError(f"{name} is empty: shape {tuple(x.shape)} (need n_samples >= 1 and n_features >= 1)")
    if check_finite:
        ensure_finite(x, name)
    return x


def ensure_finite(x: torch.Tensor, name: str, *more: tuple[torch.Tensor, str], limit: float | None = None) -> bool:
    """Raise ``ValueError`` naming the first non-finite row of ``x`` (or of the ``(tensor, name)``
    pairs in ``more``). One host synchronisation for all of them: on a GPU a sync waits for all
    queued work, so each costs a fraction of a millisecond in a loop.

    ``limit``: also whether every value of them all lies within ``[-limit, limit]`` (the return
    value; True without a limit), from the same read-back: one min/max pass per chunk."""
    named = ((x, name), *more)
    chunks = [t[start:stop] for t, _ in named for start, stop in iter_row_chunks(t.shape[0], t.shape[1])]
    if not chunks:
        return True
    if limit is not None:
        # The largest magnitude: NaN propagates through min, max and abs, and an Inf is one of
        # them, so a finite peak means finite values.
        peak = float(torch.stack([torch.stack(torch.aminmax(chunk)).abs().max().double() for chunk in chunks]).max())
        if math.isfinite(peak):
            return peak <= limit
    # Chunked so that a huge input never needs an n x d boolean temporary; the flags stay on the device.
    elif bool(torch.stack([torch.isfinite(chunk).all() for chunk in chunks]).all()):
        return True
    for t, label in named:  # the error path: find and describe the first bad row
        for start, stop in iter_row_chunks(t.shape[0], t.shape[1]):
            chunk = t[start:stop]
            finite = torch.isfinite(chunk)
            if bool(finite.all()):
                continue
            bad_rows = (~finite).any(dim=1).nonzero().flatten()
            first = int(bad_rows[0]) + start
            n_nan = int(torch.isnan(chunk).sum())
            n_inf = int(torch.isinf(chunk).sum())
            raise ValueError(
                f"{label} contains non-finite values (in rows {start}..{stop - 1}: {n_nan} NaN, "
                f"{n_inf} Inf; first bad row {first}: {t[first, : min(8, t.shape[1])].tolist()})"
            )
    return False  # (not reached: non-finite extremes come from a non-finite value)


def overflow_limit(dtype: torch.dtype, n_features: int) -> float:
    """Values (centred, for a fit) of at most this size give squared distances and norms that
    ``dtype`` holds: (2 limit)^2 d is its largest finite value."""
    return math.sqrt(torch.finfo(dtype).max / max(1, n_features)) / 2


def iter_row_chunks(n: int, width: int, chunk_size: int | None = None):
    """Yield ``(start, stop)`` row ranges whose ``rows * width`` stays near a fixed budget."""
    if chunk_size is None:
        chunk_size = max(1, _CHUNK_ELEMENTS // max(1, width))
    for start in range(0, n, chunk_size):
        yield start, min(n, start + chunk_size)


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in float32; float64 stays float64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def check_n_clusters(n_clusters: Any, n_samples: int | None = None) -> int:
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, numbers.Integral):
        raise TypeError(f"n_clusters must be an int, got {n_clusters!r} ({type(n_clusters).__name__})")
    n_clusters = int(n_clusters)
    if n_clusters <= 0:
        raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
    if n_samples is not None and n_clusters > n_samples:
        raise ValueError(f"n_clusters={n_clusters} is larger than n_samples={n_samples}; need n_clusters <= n_samples")
    return n_clusters


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_nonnegative_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def check_sample_weight(sample_weight: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """Return weights as a 1-D tensor of ``dtype`` on ``x``'s device, or None for unit weights."""
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Real) and not isinstance(sample_weight, bool):
        w = torch.full((x.shape[0],), float(sample_weight), dtype=dtype, device=x.device)
    else:
        if isinstance(sample_weight, np.ndarray):
            if sample_weight.dtype.kind not in "fiu":
                raise TypeError(f"sample_weight has dtype {sample_weight.dtype}; pass real numbers")
            sample_weight = torch.from_numpy(np.array(sample_weight, dtype=np.float64))
        elif not isinstance(sample_weight, torch.Tensor):
            try:
                sample_weight = torch.as_tensor(np.asarray(sample_weight, dtype=np.float64))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"sample_weight must be array-like of real numbers, got {_describe(sample_weight)}") from exc
        if sample_weight.is_complex() or sample_weight.dtype == torch.bool:
            raise TypeError(f"sample_weight has dtype {sample_weight.dtype}; pass real numbers")
        if sample_weight.dim() != 1 or sample_weight.shape[0] != x.shape[0]:
            raise ValueError(
                f"sample_weight must have shape ({x.shape[0]},) to match x's {x.shape[0]} rows, "
                f"got shape {tuple(sample_weight.shape)}"
            )
        w = sample_weight.to(device=x.device, dtype=dtype)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("sample_weight contains NaN or Inf")
    if bool((w < 0).any()):
        negative = (w < 0).nonzero().flatten()
        raise ValueError(
            f"sample_weight must be >= 0; {negative.numel()} negative values, first at index "
            f"{int(negative[0])}: {float(w[negative[0]])}"
        )
    if float(w.sum()) <= 0:
        raise ValueError("sample_weight sums to 0; at least one sample needs a positive weight")
    return w


def check_centroids(centroids: Any, n_clusters: int | None, n_features: int, name: str = "init") -> torch.Tensor:
    """Validate user-given centroids of shape (n_clusters, n_features)."""
    c = as_data_tensor(centroids, name)
    if n_clusters is not None and c.shape[0] != n_clusters:
        raise ValueError(
            f"{name} has {c.shape[0]} rows but n_clusters={n_clusters}; expected shape ({n_clusters}, {n_features}), "
            f"got {tuple(c.shape)}"
        )
    if c.shape[1] != n_features:
        raise ValueError(
            f"{name} has {c.shape[1]} features but x has {n_features}; expected shape "
            f"({c.shape[0]}, {n_features}), got {tuple(c.shape)}"
        )
    return c


def check_nonzero_rows(x: torch.Tensor) -> None:
    """Cosine k-means needs a direction for every row; checked chunk by chunk."""
    for start, stop in iter_row_chunks(x.shape[0], x.shape[1]):
        zero = torch.linalg.vector_norm(x[start:stop].to(compute_dtype(x.dtype)), dim=1) == 0
        if bool(zero.any()):
            first = int(zero.nonzero()[0]) + start
            raise ValueError(
                f'metric="cosine" needs non-zero rows; x has {int(zero.sum())} all-zero rows in '
                f"{start}..{stop - 1}, the first at index {first}"
            )


def check_same_device(x: torch.Tensor, other: torch.Tensor, what: str = "the centroids") -> None:
    if x.device != other.device:
        raise ValueError(
            f"x is on {x.device} but {what} are on {other.device}; move one of them with .to(device)"
        )


def check_device(device: Any, advice: str = "Pass device='cpu', or leave device=None to compute where the data "
                 "lies") -> torch.device:
    """``device`` as a ``torch.device``; a CUDA device where torch has none gets an error that says so
    (torch's own is an ``AssertionError`` from deep inside the first copy), ending in ``advice``."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got {device!r}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU is visible"
            raise RuntimeError(f"device={str(device)!r} needs a CUDA GPU; this torch {torch.__version__} is {build}. "
                               + advice)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"device={str(device)!r}, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


PRECISIONS = ("exact", "fast")


def check_precision(precision: Any) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision
