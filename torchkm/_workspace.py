"""What a small fit on the kernels sets up, kept for the next fit of the same rows.

Before its first iteration, a fit on the kernels allocates its engines' buffers and captures
their CUDA graphs while the GPU waits: at 245,760 x 32, k = 1,024 (H200, 2026-11-29), about
1.2 ms for the dense engine and 1.5 ms for the capture, of a 9-11 ms fit. A later fit of the same
tensor, unchanged, with the same problem (``n_init > 1``, a sweep over seeds, a benchmark's
repeats) takes that workspace back: its engines restart from the new centroids and replay the
graphs they captured.

A workspace holds the fit's label buffer (int32, one per row) and the engines that can restart
(``restart``). At most ``KEPT`` are kept, for fits of at most ``MAX_ROWS`` rows (where set-up is a
noticeable part of a fit), each only while its rows' tensor lives: it is dropped with it. A
tensor changed in place (its version counter moved), other sample weights or another
``TORCHKM_*`` environment (the kernels read their switches when an engine is built) make another
key. ``TORCHKM_REUSE_ENGINES=0`` turns reuse off.
"""

from __future__ import annotations

import collections
import os
import weakref
from typing import Any

import torch

from . import _ops
from ._reference import DataView

__all__ = ["KEPT", "MAX_ROWS", "Workspace", "clear", "give_back", "take"]

# Beyond a few million rows a fit's GPU time dwarfs its set-up, and its buffers are large.
MAX_ROWS = 1 << 22
KEPT = 2


class Workspace:
    """A fit's label buffer and restartable engines (``engines``, by the caller's keys)."""

    def __init__(self, key: tuple | None, data: DataView, sample_weight: torch.Tensor | None):
        self.key = key
        self.labels = torch.empty(data.n_samples, dtype=torch.int32, device=data.device)
        self.engines: dict[Any, Any] = {}
        self._x = weakref.ref(data.x, _forget(key)) if key is not None else None
        self._weight = None if sample_weight is None else weakref.ref(sample_weight)

    def serves(self, data: DataView, sample_weight: torch.Tensor | None) -> bool:
        """Whether this workspace was made for these very tensors (not others at their addresses)."""
        weight = None if self._weight is None else self._weight()
        return self._x is not None and self._x() is data.x and weight is sample_weight


_kept: collections.OrderedDict[tuple, Workspace] = collections.OrderedDict()


def _forget(key: tuple):
    def callback(_ref: weakref.ref) -> None:
        _kept.pop(key, None)

    return callback


def _enabled() -> bool:
    return os.environ.get("TORCHKM_REUSE_ENGINES", "1") != "0"


def _key(data: DataView, k: int, sample_weight: torch.Tensor | None, tol: float, graphs: bool) -> tuple | None:
    x = data.x
    if not _enabled() or data.n_samples > MAX_ROWS or not data.in_memory:
        return None
    weight = None if sample_weight is None else (id(sample_weight), sample_weight.data_ptr(), sample_weight._version)
    return (id(x), x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device, x._version, data.dtype,
            data.precision, data.normalize, data.offset is None, data.row_scale is None, weight, k, float(tol), graphs,
            _ops.settings())


def take(data: DataView, k: int, sample_weight: torch.Tensor | None, tol: float, graphs: bool) -> Workspace:
    """The kept workspace of a fit of these rows and this problem, taken out of the cache (so no
    other fit uses it meanwhile), or a new one."""
    key = _key(data, k, sample_weight, tol, graphs)
    kept = _kept.pop(key, None) if key is not None else None
    if kept is not None and kept.serves(data, sample_weight):
        for engine in kept.engines.values():
            engine.x = data.x
        return kept
    return Workspace(key, data, sample_weight)


def give_back(workspace: Workspace) -> None:
    """Keep ``workspace`` for the next fit of its rows (the least recently used beyond ``KEPT`` go)."""
    if workspace.key is None or workspace._x is None or workspace._x() is None or not _enabled():
        return
    # A kept engine must not keep the rows alive (the workspace goes with them): its ``x`` is
    # given back by ``take``. Its graph still holds their address, and replays only after ``take``.
    for engine in workspace.engines.values():
        engine.x = None
    _kept[workspace.key] = workspace
    _kept.move_to_end(workspace.key)
    while len(_kept) > KEPT:
        _kept.popitem(last=False)


def clear() -> None:
    """Drop every kept workspace (their buffers and CUDA graphs are freed with them)."""
    _kept.clear()
