"""The collectives a data-parallel fit needs, over ``torch.distributed``, and their single-process no-ops.

Every rank holds a shard of the rows. A fit stays in lockstep because every decision (draws,
stopping, empty-cluster moves) is taken from values that the collectives made identical on all
ranks: sums, counts and statistics are all-reduced, initial rows are gathered, and draws come from
one seed that rank 0 broadcasts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Comm", "resolve_group"]


def resolve_group(distributed: Any) -> Any:
    """``distributed`` as a fit argument: False/None (one process), True (the default group), or a
    ``torch.distributed`` process group. Returns the group, or None for a single-process fit."""
    if distributed is None or distributed is False:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "distributed=True needs an initialised torch.distributed process group: launch with torchrun "
            "and call torch.distributed.init_process_group(...) first"
        )
    return dist.group.WORLD if distributed is True else distributed


class Comm:
    """Collectives over ``group`` (None: one process, every call a no-op or an identity)."""

    def __init__(self, group: Any = None):
        self.group = group
        if group is None:
            self.rank, self.world = 0, 1
        else:
            import torch.distributed as dist

            self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.active = self.world > 1

    def _flag_device(self) -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self.group) == "nccl" \
            else torch.device("cpu")

    @contextlib.contextmanager
    def agree(self) -> Iterator[None]:
        """Checks of this rank's input that all ranks pass together: a rank whose check raises
        re-raises its error, the others raise a RuntimeError, instead of waiting forever in the next
        collective for the rank that left."""
        try:
            yield
        except (ValueError, TypeError, RuntimeError):
            self._any_failed(True)
            raise
        if self._any_failed(False):
            raise RuntimeError("another rank of the process group rejected its input (see that rank's error)")

    def _any_failed(self, failed: bool) -> bool:
        if not self.active:
            return failed
        flag = torch.tensor([float(failed)], device=self._flag_device())
        return bool(self.sum_(flag)[0] > 0)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce ``tensor`` in place (sum) and return it."""
        if self.active:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.group)
        return tensor

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` with rank ``src``'s copy (``src`` is a rank of the group)."""
        if self.active:
            import torch.distributed as dist

            dist.broadcast(tensor, src=dist.get_global_rank(self.group, src), group=self.group)
        return tensor

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Concatenation, in rank order, of every rank's ``rows`` (m_r, ...) (any m_r, 0 included)."""
        if not self.active:
            return rows
        import torch.distributed as dist

        sizes = [int(c) for c in self.gather_same(torch.tensor([rows.shape[0]], dtype=torch.int64, device=rows.device))]
        width = max(sizes)
        if width == 0:
            return rows
        padded = rows.new_zeros((width, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    def gather_same(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenation, in rank order, of every rank's ``tensor`` (the same shape on every rank)."""
        if not self.active:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.world)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts)

    def same_seed(self, seed: int) -> int:
        """Rank 0's ``seed`` on every rank (each rank may have drawn its own)."""
        if not self.active:
            return seed
        import torch.distributed as dist

        box = [seed]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return int(box[0])
