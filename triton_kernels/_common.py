"""Pieces shared by the kernels: reading transformed rows, and adding rows into per-cluster sums."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

UPDATE_NONE, UPDATE_ONEHOT, UPDATE_ATOMIC = 0, 1, 2


def launcher(kernel):
    """``kernel`` wrapped by ``torch.library.wrap_triton``, so that kernels launched inside a
    ``torch.library.triton_op`` are traced by ``torch.compile``; a plain launch under the interpreter.

    Outside a ``triton_op``, the wrapper dispatches each launch through a higher-order op (about
    0.5 ms of host time per launch on torch 2.11) unless the caller disabled that for code nothing
    traces (``torch._library.triton.set_wrap_triton_enabled(False)``, as the fit loop does).
    """
    wrap = getattr(torch.library, "wrap_triton", None)
    if wrap is None or os.environ.get("TRITON_INTERPRET") == "1":
        return kernel
    return wrap(kernel)


def unused(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor for one pointer argument that a launch does not use.

    Every such argument gets its own, and no tensor is passed for two arguments of one launch: under
    ``torch.compile``, Inductor functionalises a launch by cloning each argument the kernel may
    write, and two arguments sharing a tensor get two clones, copied back one after the other, so
    the untouched one can undo the kernel's writes (labels, deferred-row lists) before a later
    kernel reads them.
    """
    return torch.empty(1, dtype=dtype, device=device)


def onehot_max_k(d: int) -> int:
    """Largest k for which a tile's rows are pre-reduced through a one-hot product before the atomics.

    For few clusters, per-row atomics would serialise on the same k x d addresses; the one-hot
    product (fp32 FMA, k x BLOCK_N x d per tile) removes that contention and stays cheap while k is
    small.
    """
    return 64


def onehot_width(k: int) -> int:
    return max(16, triton.next_power_of_2(k))


@triton.jit
def load_rows(x_ptr, rows, row_mask, dims, dim_mask, stride_xn, stride_xd, offset_ptr, scale,
              HAS_OFFSET: tl.constexpr, HAS_SCALE: tl.constexpr):
    """A (rows x dims) tile of the rows as the caller sees them, ``(x - offset) * scale``, in fp32.

    Padding (masked rows or features) is exactly 0.
    """
    mask = row_mask[:, None] & dim_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
    if HAS_OFFSET:
        x = tl.where(mask, x - tl.load(offset_ptr + dims, mask=dim_mask, other=0.0)[None, :], 0.0)
    if HAS_SCALE:
        x = x * scale[:, None]
    return x


@triton.jit
def accumulate_rows(sums_ptr, counts_ptr, labels, w, live, xr, dims, dim_mask, add_counts, k, d,
                    KP: tl.constexpr, MODE: tl.constexpr):
    """``sums[labels] += w * xr`` over one feature chunk (and ``counts[labels] += w`` when ``add_counts``).

    ``labels`` int64 (BLOCK_N,), ``w`` float32 with 0 where the row must not count, ``live`` the rows
    that count. MODE 1 pre-reduces the tile through a one-hot (KP x BLOCK_N) product, one atomic per
    (cluster, feature) per tile; MODE 2 issues one atomic per (row, feature).
    """
    if MODE == 1:
        k_rows = tl.arange(0, KP)
        onehot = (labels[:, None] == k_rows[None, :]).to(tl.float32) * w[:, None]
        part = tl.dot(tl.trans(onehot), xr, input_precision="ieee")
        tl.atomic_add(sums_ptr + k_rows[:, None] * d + dims[None, :], part, mask=(k_rows < k)[:, None] & dim_mask[None, :], sem="relaxed")
        if add_counts:
            tl.atomic_add(counts_ptr + k_rows, tl.sum(onehot, axis=0), mask=k_rows < k, sem="relaxed")
    else:
        tl.atomic_add(sums_ptr + labels[:, None] * d + dims[None, :], xr * w[:, None], mask=live[:, None] & dim_mask[None, :], sem="relaxed")
        if add_counts:
            tl.atomic_add(counts_ptr + labels, w, mask=live, sem="relaxed")
