"""Lloyd iterations on the kernels: four launches each, over buffers kept from one iteration to the next.

An iteration is ``prepare_centroids`` (operands of the pass, accumulators cleared), the fused
assignment pass with its sums, the exact mode's re-search, and ``finish_update`` (centroids moved
to the means in place, statistics written). Small problems replay blocks of iterations as one CUDA
graph: each iteration after the first of a block checks the previous one's statistics on the
device and freezes the rest of the block once a stopping rule fires, so the host reads a whole
block with one synchronisation and the state it finds is that of the iteration that stopped.
A data-parallel fit all-reduces the pass's accumulators between the pass and ``finish_update``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np
import torch

from .assign import AssignPass
from .centroids import finish_update

__all__ = ["LloydEngine", "device_tol"]

logger = logging.getLogger("torchkm")


def device_tol(tol: float) -> float:
    """``tol`` as the device compares it: blocks freeze when shift <= tol in fp32, and rounding tol
    up there means they freeze whenever the host (in float64) would stop."""
    tol32 = np.float32(tol) if math.isfinite(tol) else np.float32(-1.0)
    return float(np.nextafter(tol32, np.float32(np.inf)) if float(tol32) < tol else tol32)


class LloydEngine:
    """The state of a Lloyd run on the kernels.

    ``c`` (k, d) float32 centroids (updated in place), ``c_old`` those before the last update,
    ``labels`` (n,) int32/int64 updated in place, ``sums``/``counts`` of the last pass, and
    ``stats`` (block, 4) float64: ``[inertia, shift, changed, empty]`` of each iteration of the last
    block. ``block > 1`` makes ``run_block`` replay blocks of iterations (see the module docstring).
    """

    def __init__(
        self, x: torch.Tensor, centroids: torch.Tensor, labels: torch.Tensor, *, precision: str,
        offset: torch.Tensor | None, row_scale: torch.Tensor | None, raw_norms: torch.Tensor | None,
        sample_weight: torch.Tensor | None, normalize: bool, tol: float, block: int = 1, graphs: bool = False,
        all_reduce: Callable[[torch.Tensor], object] | None = None,
    ):
        k, d = centroids.shape
        device = x.device
        self.x, self.labels, self.block, self.normalize = x, labels, block, normalize
        self.inputs = dict(offset=offset, row_scale=row_scale, raw_norms=raw_norms, sample_weight=sample_weight)
        self.assign_pass = AssignPass(x, k, precision, update=True)
        self.c = centroids.to(torch.float32).contiguous().clone()
        self.c_old = torch.empty_like(self.c)
        self.sums = torch.empty(k, d, dtype=torch.float32, device=device)
        self.counts = torch.empty(k, dtype=torch.float32, device=device)
        self.stats = torch.zeros(block, 4, dtype=torch.float64, device=device)
        # control = [frozen, iterations allowed]; row r of the table starts a block of r iterations.
        self.control = torch.zeros(2, dtype=torch.int32, device=device)
        self._control_rows = torch.tensor([[0, r] for r in range(block + 1)], dtype=torch.int32, device=device)
        self.tol_device = device_tol(tol)
        self._use_graphs = graphs and x.device.type == "cuda" and all_reduce is None  # elsewhere blocks run eagerly
        self.all_reduce = all_reduce
        self._summed_stats = torch.tensor([0, 2], device=device)  # inertia and changed add up over shards
        self._graph: torch.cuda.CUDAGraph | None = None

    def iterate(self, has_prev: bool, slot: int = 0, in_block: bool = False) -> None:
        """One iteration, its statistics into ``stats[slot]``; ``in_block``: under the block's control."""
        self.assign_pass(
            self.x, self.c, **self.inputs, prev_labels=self.labels if has_prev else None, labels=self.labels,
            zero=(self.stats[slot],), control=self.control if in_block else None,
            stats_prev=self.stats[slot - 1] if in_block and slot > 0 else None, iteration=slot, tol=self.tol_device,
        )
        p = self.assign_pass
        if self.all_reduce is not None:
            # Every rank has the same replica layout (it depends on k and d only), so summing the
            # raw accumulators gives each rank the sums of all shards, and the same update.
            self.all_reduce(p.acc)
        finish_update(p.acc_sums, p.acc_counts, self.c, p.part_inertia, p.part_changed, self.stats[slot],
                      normalize=self.normalize, old_centroids=self.c_old, sums=self.sums, counts=self.counts,
                      control=self.control if in_block else None)
        if self.all_reduce is not None:
            summed = self.stats[slot].index_select(0, self._summed_stats)
            self.all_reduce(summed)
            self.stats[slot].index_copy_(0, self._summed_stats, summed)

    def _block(self) -> None:
        for slot in range(self.block):
            self.iterate(True, slot, in_block=True)

    def run_block(self, iterations: int) -> None:
        """Up to ``iterations`` (<= block) iterations after the first. With ``graphs``, the first block
        runs eagerly on a side stream (compiling the kernels), is then captured, and later blocks
        replay the graph; if capture fails, blocks stay eager."""
        self.control.copy_(self._control_rows[iterations])
        if self._graph is not None:
            self._graph.replay()
            return
        if not self._use_graphs:
            self._block()
            return
        device = self.x.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.device(device), torch.cuda.stream(side):
            self._block()
        torch.cuda.current_stream(device).wait_stream(side)
        self._use_graphs = False  # unless the capture below succeeds
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(device), torch.cuda.graph(graph):
                self._block()
        except RuntimeError as err:
            logger.debug("CUDA graph capture failed (%s); iterating without it", err)
            return
        self._graph = graph

    def read(self, rows: int) -> list[list[float]]:
        """The statistics of the first ``rows`` iterations of the last block (one host sync)."""
        return self.stats[:rows].tolist()
