"""Rows kept in host memory and streamed to the GPU chunk by chunk, each pass over the data.

``StreamedView`` is a ``DataView`` whose rows live on the host (a pinned or pageable CPU tensor, or
a numpy array / memory-mapped ``.npy`` viewed as one) while everything computed from them lives on
``compute_device``. ``pieces()`` hands out one device chunk at a time: two device buffers alternate,
the copy of the next chunk runs on a side stream while the kernels work on the current one, and
pageable rows pass through two pinned staging buffers that the host fills in the meantime. A pass
over a streamed view is therefore bounded by the slower of the host-to-device copy and the compute.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ._reference import DataView
from ._validation import iter_row_chunks

__all__ = ["StreamedView", "default_chunk_rows", "fits_on_device"]

logger = logging.getLogger("torchkm")

# A chunk of this many bytes takes ~5 ms to copy over PCIe 5: long enough to hide the launches of
# its pass, short enough that two buffers of it are small next to any GPU's memory.
_CHUNK_BYTES = 1 << 28


def default_chunk_rows(x: torch.Tensor) -> int:
    return max(1, _CHUNK_BYTES // max(1, x.shape[1] * x.element_size()))


def fits_on_device(x: torch.Tensor, device: torch.device, fraction: float = 0.7) -> bool:
    """Whether ``x`` and its per-row buffers (labels, distances, norms) fit in ``fraction`` of the
    device's free memory."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return x.numel() * x.element_size() + 24 * x.shape[0] <= fraction * free


@dataclass(frozen=True)
class StreamedView(DataView):
    """A ``DataView`` over host rows ``x`` whose computations run on ``compute_device``."""

    compute_device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    chunk_rows: int = 1 << 20

    @property
    def device(self) -> torch.device:
        return self.compute_device

    @property
    def in_memory(self) -> bool:
        return False

    def take(self, index: torch.Tensor) -> torch.Tensor:
        # Gathering from the host in sorted order reads a memory map front to back.
        index = index.to("cpu")
        order = torch.argsort(index)
        rows = torch.empty(index.numel(), self.n_features, dtype=self.x.dtype)
        rows[order] = self.x.index_select(0, index[order])
        return self.transform(rows.to(self.compute_device))

    def chunks(self, width: int, chunk_size: int | None = None):
        for start, _, piece in self.pieces():
            for sub_start, sub_stop, rows in piece.chunks(width, chunk_size):
                yield start + sub_start, start + sub_stop, rows

    def pieces(self) -> Iterator[tuple[int, int, DataView]]:
        """``(start, stop, view)`` for each chunk of rows, ``view`` an in-memory ``DataView`` on the
        compute device valid until the next chunk is asked for (its buffer is then refilled)."""
        device = self.compute_device
        ranges = list(iter_row_chunks(self.n_samples, 1, self.chunk_rows))
        if device.type != "cuda":
            for start, stop in ranges:
                yield start, stop, self._piece(self.x[start:stop].to(device))
            return
        rows = min(self.chunk_rows, self.n_samples)
        buffers = [torch.empty(rows, self.n_features, dtype=self.x.dtype, device=device) for _ in range(2)]
        pinned_source = self.x.is_pinned()
        staging = [] if pinned_source else [torch.empty(rows, self.n_features, dtype=self.x.dtype, pin_memory=True)
                                            for _ in range(2)]
        compute = torch.cuda.current_stream(device)
        copy = torch.cuda.Stream(device)
        copied = [torch.cuda.Event() for _ in range(2)]
        consumed = [torch.cuda.Event() for _ in range(2)]
        used = [False, False]

        def start_copy(i: int) -> None:
            start, stop = ranges[i]
            slot = i % 2
            source = self.x[start:stop]
            if not pinned_source:
                if used[slot]:
                    copied[slot].synchronize()  # the staging buffer's last copy has left
                staging[slot][: stop - start].copy_(source)
                source = staging[slot][: stop - start]
            with torch.cuda.stream(copy):
                if used[slot]:
                    copy.wait_event(consumed[slot])  # the kernels are done with this buffer
                buffers[slot][: stop - start].copy_(source, non_blocking=True)
                copied[slot].record(copy)
            used[slot] = True

        start_copy(0)
        for i, (start, stop) in enumerate(ranges):
            slot = i % 2
            compute.wait_event(copied[slot])
            yield start, stop, self._piece(buffers[slot][: stop - start])
            consumed[slot].record(compute)
            # Issued once the caller has queued its kernels on this chunk, so that the host's
            # staging copy and the transfer of the next chunk overlap them.
            if i + 1 < len(ranges):
                start_copy(i + 1)
        # The buffers go back to the allocator on the compute stream, after every kernel above.
        compute.wait_stream(copy)

    def _piece(self, rows: torch.Tensor) -> DataView:
        return DataView(rows, self.dtype, self.offset, self.normalize, self.precision)
