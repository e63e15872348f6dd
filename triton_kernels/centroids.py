"""Per-iteration work on the centroids, one launch each side of the assignment pass.

``prepare_centroids`` turns the fp32 centroids into the operands of the assignment pass (the
tensor-core copy scaled by -2, its low part for split bf16, the per-centroid score bias with the
centring folded in, the fp32 copy of the exact re-search and the centroid norms of the rounding
bound) and clears the pass's accumulators. ``finish_update`` reduces the accumulator replicas into
per-cluster sums and weights, moves the centroids to the means in place (clusters with no weight
keep theirs; cosine centroids are renormalised), and writes the iteration's statistics. A Lloyd
iteration is then these two launches around the pass, instead of some forty small torch
operations, which is what bounded small problems.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import launcher, unused

__all__ = ["Prepared", "amax_parts", "centre_rows", "centroid_parts", "centre_rows_reference", "centroid_neighbours",
           "centroid_neighbours_reference", "finish_update", "finish_update_reference",
           "half_row_floor", "half_scale_reference",
           "prepare_centroids", "prepare_centroids_reference",
           "moves_reference", "round_to_tf32", "row_norms", "row_norms_reference", "shift_top_reference",
           "unpack_shift_top"]


@triton.jit
def _round_tf32(v):
    """fp32 values rounded to tf32 (10 mantissa bits, ties away from zero), still fp32."""
    return ((v.to(tl.int32, bitcast=True) + 0x1000) & -0x2000).to(tl.float32, bitcast=True)


@triton.jit
def block_frozen(control_ptr, stats_prev_ptr, iteration, tol, CHECK_STOP: tl.constexpr):
    """Whether this iteration of a replayed block is frozen (see ``prepare_centroids``)."""
    frozen = tl.load(control_ptr) != 0
    if CHECK_STOP:
        # Later iterations of a replayed block freeze once the previous one met a stopping rule
        # (the host then stops there, or relocates empty clusters), or past the block's budget.
        changed = tl.load(stats_prev_ptr + 2)
        shift = tl.load(stats_prev_ptr + 1)
        empty = tl.load(stats_prev_ptr + 3)
        stop = ((changed == 0) & (empty == 0)) | (shift <= tol) | (empty > 0)
        frozen = frozen | stop | (iteration >= tl.load(control_ptr + 1))
    return frozen


# fp16 operands for fp32 rows: the scaled rows and centroids stay below 2^9, and the scale within
# [2^-60, 2^60] so that s^2 and s^-2 are normal fp32 numbers. (So values up to about 2^68 fit; fp32
# squared distances overflow from 2^64 anyway.) Not nearer fp16's largest finite value (65504): the
# packed Hopper search adds each centroid's bias and each row's squared norm, in the products' s^2
# units, as fp16 parts times powers of two no larger than 2^15 (``hopper_search``), so those terms
# must stay below 2^31; with rows of up to 256 features they stay below 2^29. The price is the
# subnormal range: elements below 2^-22 M (was 2^-28 M) lose bits, which ``half_row_floor`` covers.
HALF_TOP_EXPONENT = 8
# The exact mode's floor on a row's norm with fp16 operands, in units of sqrt(d) / s
# (``half_row_floor``; ``assign._HALF_ROW_ERROR`` is derived from it).
HALF_ROW_FLOOR = 2.0**-10
_HALF_ROW_FLOOR = tl.constexpr(HALF_ROW_FLOOR)
HALF_SCALE_LIMIT = 60
_HALF_TOP_EXPONENT = tl.constexpr(HALF_TOP_EXPONENT)
_HALF_SCALE_LIMIT = tl.constexpr(HALF_SCALE_LIMIT)


def _row_block_d(d: int) -> int:
    """Feature chunk of the row reads of ``_amax_parts_kernel`` (H200, 32,768 x 256 fp32, maxima
    with norms: 7.5 us at 128, 7.8 at 64, 9.1 at 256; maxima alone and torch's norms 10.7 + 11.4)."""
    return min(128, max(16, triton.next_power_of_2(d)))



@triton.jit
def _half_scale(parts_ptr, n_parts, d):
    """(s, row floor) from the partial maxima: s the power of two with s M in [2^8, 2^9) for M the
    largest |x| and 2 |c| (1 for M = 0), clamped to [2^-60, 2^60]; the floor 2^-10 sqrt(d) / s (see
    ``half_row_floor``)."""
    offs = tl.arange(0, 1024)
    top = tl.zeros((1024,), tl.float32)
    for i in range(0, n_parts, 1024):
        top = tl.maximum(top, tl.load(parts_ptr + i + offs, mask=i + offs < n_parts, other=0.0))
    m = tl.max(top, axis=0)
    exponent = ((m.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.where(m > 0, exponent, 0)
    power = tl.minimum(tl.maximum(_HALF_TOP_EXPONENT - exponent, -_HALF_SCALE_LIMIT), _HALF_SCALE_LIMIT)
    scale = ((power + 127) << 23).to(tl.float32, bitcast=True)
    return scale, tl.sqrt(d * 1.0) * _HALF_ROW_FLOOR / scale


@triton.jit
def _amax_parts_kernel(x_ptr, n, d, stride_xn, stride_xd, c_ptr, kd, out_ptr, norm_ptr, x_programs, first_program,
                       AMAX: tl.constexpr, NORMS: tl.constexpr, KEEP_KNOWN: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    # Programs [0, x_programs): the largest |x| over strided row blocks (AMAX), and the rows' norms
    # (NORMS: each row block covers its rows whole); the others: the largest 2 |c| over the flat
    # centroids. One float each, reduced by ``_half_scale``. A launch may start at
    # ``first_program`` (x_programs: the centroids' only). KEEP_KNOWN: a row program whose slot
    # already holds a maximum (>= 0; -1 is "unknown") leaves it.
    pid = tl.program_id(0) + first_program
    if KEEP_KNOWN:
        todo = pid < x_programs
        if todo:
            todo = tl.load(out_ptr + pid) < 0.0
    else:
        todo = pid < x_programs
    if todo:
        top = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
        rows0 = tl.arange(0, BLOCK_R)
        dims0 = tl.arange(0, BLOCK_D)
        for r0 in range(pid * BLOCK_R, n, x_programs * BLOCK_R):
            rows = (r0 + rows0).to(tl.int64)
            sq = tl.zeros((BLOCK_R,), tl.float32)
            for d0 in range(0, d, BLOCK_D):
                dims = d0 + dims0
                v = tl.load(x_ptr + rows[:, None] * stride_xn + dims[None, :] * stride_xd,
                            mask=(rows < n)[:, None] & (dims < d)[None, :], other=0.0).to(tl.float32)
                if AMAX:
                    top = tl.maximum(top, tl.abs(v))
                if NORMS:
                    sq += tl.sum(v * v, axis=1)
            if NORMS:
                tl.store(norm_ptr + rows, tl.sqrt(sq), mask=rows < n)
        if AMAX:
            tl.store(out_ptr + pid, tl.max(tl.max(top, axis=1), axis=0))
    elif pid >= x_programs:
        top_c = tl.zeros((BLOCK_C,), tl.float32)
        offs = tl.arange(0, BLOCK_C)
        n_c = tl.num_programs(0) + first_program - x_programs
        for i in range((pid - x_programs) * BLOCK_C, kd, n_c * BLOCK_C):
            v = tl.load(c_ptr + i + offs, mask=i + offs < kd, other=0.0)
            top_c = tl.maximum(top_c, 2.0 * tl.abs(v))
        tl.store(out_ptr + pid, tl.max(top_c, axis=0))


# Flat centroid elements a centroid program of ``_amax_parts_kernel`` reads per step.
AMAX_C_BLOCK = 2048


def centroid_parts(kd: int, sms: int) -> int:
    """Programs (and slots of ``amax_parts``' output) for the maxima of ``kd`` centroid elements: about
    two steps of ``AMAX_C_BLOCK`` each, up to four per SM. Each program's steps are dependent loads,
    so few programs make a long chain: one per SM with 1,024-element steps took 15 us per fp32
    iteration at 8,192 x 256 centroids (H200, 2026-11-29, 16 steps a program)."""
    return max(1, min(4 * sms, triton.cdiv(kd, 2 * AMAX_C_BLOCK)))


def amax_parts(x: torch.Tensor, c32: torch.Tensor, out: torch.Tensor, x_programs: int, *, rows: bool = True,
               norms: torch.Tensor | None = None, keep_known: bool = False) -> None:
    """Partial maxima for fp16 operands into ``out`` (float32): the first ``x_programs`` of |x|
    (any strides), the rest of 2 |c| for the contiguous fp32 centroids ``c32``;
    ``prepare_centroids(half_parts=out)`` reduces them. ``rows=False``: the centroids' only, ``out``
    keeping the maxima of x from an earlier call (rows that did not change). ``keep_known``: the
    rows' slots that hold -1 are computed, the others kept, as the launch runs (not as it is
    issued): a launch captured in a CUDA graph before the rows' maxima were ever computed reads
    the rows at its first replay only. ``norms``: a float32 (n,) tensor that also receives the
    rows' norms ``||x_i||`` (fp32 sums of squares) as the launch reads them (one read of x
    instead of two; needs ``rows`` and not ``keep_known``)."""
    if x_programs < 1 or out.numel() <= x_programs:
        raise ValueError("amax_parts: out needs a slot for every program, x and centroids")
    if norms is not None and (not rows or keep_known):
        raise ValueError("amax_parts: norms come from reading the rows (rows=True, keep_known=False)")
    if keep_known and not rows:
        raise ValueError("amax_parts: keep_known decides which rows' slots to compute (rows=True)")
    n, d = x.shape
    first = 0 if rows else x_programs
    launcher(_amax_parts_kernel)[(out.numel() - first,)](
        x, n, d, x.stride(0), x.stride(1), c32, c32.numel(), out, unused(x.device) if norms is None else norms,
        x_programs, first, AMAX=True, NORMS=norms is not None, KEEP_KNOWN=keep_known, BLOCK_R=32,
        BLOCK_D=_row_block_d(d), BLOCK_C=AMAX_C_BLOCK, num_warps=4)


def row_norms(x: torch.Tensor, out: torch.Tensor) -> None:
    """The norms ``||x_i||`` of the rows of ``x`` (n, d), any float dtype and strides, into the
    float32 (n,) ``out``: sums of squares in fp32, one read of the rows."""
    n, d = x.shape
    if n == 0:
        return
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.device.type == "cuda" else 2
    programs = max(1, min(4 * sms, triton.cdiv(n, 32)))
    launcher(_amax_parts_kernel)[(programs,)](
        x, n, d, x.stride(0), x.stride(1), unused(x.device), 0, unused(x.device), out, programs, 0,
        AMAX=False, NORMS=True, KEEP_KNOWN=False, BLOCK_R=32, BLOCK_D=_row_block_d(d), BLOCK_C=AMAX_C_BLOCK,
        num_warps=4)


def row_norms_reference(x: torch.Tensor) -> torch.Tensor:
    """The same in torch: float32 ``||x_i||``."""
    return torch.linalg.vector_norm(x, dim=1, dtype=torch.float32)


def half_row_floor(d: int, scale: float) -> float:
    """The exact mode's floor on a row's norm with fp16 operands scaled by ``scale``: an element
    below fp16's normal range (2^-14 / s) is rounded by up to 2^-25 / s, so a row by at most
    2^-11 ||x|| + 2^-25 sqrt(d) / s; with the row norm floored at 2^-10 sqrt(d) / s, the
    operand term of the bound (``assign.score_bound_coefficients(half=True)``: (17/16) 2^-11 of
    that norm) covers it. (2^-13 until 2026-12-04, when the bound allowed tf32's 2^-10.)"""
    return HALF_ROW_FLOOR * d**0.5 / scale


# Centroids per program of ``prepare_centroids``' launch, which ends ``Prepared.c_norm`` with each
# program's maxima.
PREPARE_ROWS = 16
_PREPARE_ROWS_TL = tl.constexpr(PREPARE_ROWS)


@triton.jit
def _prepare_kernel(
    c_ptr, offset_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, bias_centred_ptr, c_exact_ptr, bias_exact_ptr, c_norm_ptr,
    zero_f32_ptr, n_zero_f32, zero_i32_ptr, n_zero_i32, zero_f64_ptr, n_zero_f64,
    control_ptr, stats_prev_ptr, iteration, tol, half_parts_ptr, n_half_parts, half_ptr,
    k, d,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, FAST: tl.constexpr,
    TF32: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr, HAS_CONTROL: tl.constexpr,
    CHECK_STOP: tl.constexpr, HALF: tl.constexpr,
):
    pid = tl.program_id(0)
    if HAS_CONTROL:
        frozen = block_frozen(control_ptr, stats_prev_ptr, iteration, tol, CHECK_STOP)
        if CHECK_STOP and pid == 0:
            tl.store(control_ptr, frozen.to(tl.int32))
    else:
        frozen = False
    if not frozen:
        _prepare_body(pid, c_ptr, offset_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, bias_centred_ptr, c_exact_ptr, bias_exact_ptr, c_norm_ptr,
                      zero_f32_ptr, n_zero_f32, zero_i32_ptr, n_zero_i32, zero_f64_ptr, n_zero_f64,
                      half_parts_ptr, n_half_parts, half_ptr, k, d,
                      BLOCK_K, BLOCK_D, HAS_OFFSET, FAST, TF32, SPLIT, EXACT, HALF)


@triton.jit
def _prepare_body(
    pid, c_ptr, offset_ptr, c_mma_ptr, c_lo_ptr, bias_ptr, bias_centred_ptr, c_exact_ptr, bias_exact_ptr, c_norm_ptr,
    zero_f32_ptr, n_zero_f32, zero_i32_ptr, n_zero_i32, zero_f64_ptr, n_zero_f64,
    half_parts_ptr, n_half_parts, half_ptr, k, d,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr, FAST: tl.constexpr,
    TF32: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr, HALF: tl.constexpr,
):
    if HALF:
        # The scale into fp16's range, from the partial maxima of |x| and 2 |c| (``amax_parts``):
        # every program finds the same power of two.
        scale, row_floor = _half_scale(half_parts_ptr, n_half_parts, d)
        if pid == 0:
            tl.store(half_ptr, scale)
            tl.store(half_ptr + 1, (1.0 / scale) / scale)
            tl.store(half_ptr + 2, row_floor)
    rows = pid * BLOCK_K + tl.arange(0, BLOCK_K)
    row_mask = rows < k
    dims0 = tl.arange(0, BLOCK_D)
    sq = tl.zeros((BLOCK_K,), tl.float64)
    shift = tl.zeros((BLOCK_K,), tl.float64)
    sq_exact = tl.zeros((BLOCK_K,), tl.float64)
    norm_sq = tl.zeros((BLOCK_K,), tl.float32)
    residual_sq = tl.zeros((BLOCK_K,), tl.float32)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + dims0
        mask = row_mask[:, None] & (dims < d)[None, :]
        offs = rows.to(tl.int64)[:, None] * d + dims[None, :]
        c = tl.load(c_ptr + offs, mask=mask, other=0.0)
        norm_sq += tl.sum(c * c, axis=1)
        if FAST:
            # The tensor cores' operand: tf32-rounded for fp32 rows, rounded to the rows' dtype otherwise.
            if HALF:
                # fp16 of -2 s c (exact but for the rounding: s is a power of two), as the rows are
                # scaled by s; ``hi`` is what that operand stands for in the centroids' unit.
                h16 = (c * (-2.0 * scale)).to(tl.float16)
                tl.store(c_mma_ptr + offs, h16, mask=mask)
                hi = h16.to(tl.float32) * (-0.5 / scale)
                hi64 = hi.to(tl.float64)
            elif TF32:
                hi = _round_tf32(c)
                tl.store(c_mma_ptr + offs, hi * -2.0, mask=mask)
                hi64 = hi.to(tl.float64)
            else:
                hi = c.to(c_mma_ptr.dtype.element_ty)
                tl.store(c_mma_ptr + offs, hi * -2.0, mask=mask)
                hi64 = hi.to(tl.float64)
            # c - hi is exact in fp32 (and so is its difference with lo, the rounding of it).
            residual = c - hi.to(tl.float32)
            if SPLIT:
                lo = residual.to(c_lo_ptr.dtype.element_ty)
                tl.store(c_lo_ptr + offs, lo * -2.0, mask=mask)
                hi64 += lo.to(tl.float64)
                residual = residual - lo.to(tl.float32)
            residual_sq += tl.sum(residual * residual, axis=1)
            sq += tl.sum(hi64 * hi64, axis=1)
            if HAS_OFFSET:
                off = tl.load(offset_ptr + dims, mask=dims < d, other=0.0).to(tl.float64)
                shift += tl.sum(hi64 * off[None, :], axis=1)
        if EXACT:
            tl.store(c_exact_ptr + offs, c * -2.0, mask=mask)
            c64 = c.to(tl.float64)
            sq_exact += tl.sum(c64 * c64, axis=1)
    bias_abs = tl.zeros((BLOCK_K,), tl.float32)
    if FAST:
        # ||c||^2 - 2 (x - m).c = (||c||^2 + 2 m.c) - 2 x.c, so the pass multiplies raw rows.
        bias = (sq + 2.0 * shift).to(tl.float32)
        if HALF:
            # In the products' unit, s^2 (two steps: s^2 alone may overflow).
            tl.store(bias_ptr + rows, (bias * scale) * scale, mask=row_mask)
            if HAS_OFFSET:
                # ||c~||^2 alone, for a search that rounds the rows less the offset
                # (``Prepared.bias_centred``): here rather than in torch ops after the launch, which
                # cost 20-30 us a pass at 32,768 x 256 (H200, 2026-12-04).
                tl.store(bias_centred_ptr + rows, (sq.to(tl.float32) * scale) * scale, mask=row_mask)
        else:
            tl.store(bias_ptr + rows, bias, mask=row_mask)
        bias_abs = tl.abs(bias)
    if EXACT:
        tl.store(bias_exact_ptr + rows, sq_exact.to(tl.float32), mask=row_mask)
    # The exact mode's rounding bound takes the largest norm, norm of what rounding the centroids
    # left out, and |bias|: this program's maximum of each (``PREPARE_ROWS`` centroids a program),
    # so the exact pass reduces k / 16 values instead of k.
    parts = tl.cdiv(k, BLOCK_K)
    tl.store(c_norm_ptr + pid, tl.max(tl.sqrt(norm_sq), axis=0))
    tl.store(c_norm_ptr + parts + pid, tl.max(tl.sqrt(residual_sq), axis=0))
    tl.store(c_norm_ptr + 2 * parts + pid, tl.max(bias_abs, axis=0))
    # Clear the pass's accumulators, spread over the programs.
    step = tl.num_programs(0) * 1024
    z = tl.arange(0, 1024)
    for i in range(pid * 1024, n_zero_f32, step):
        tl.store(zero_f32_ptr + i + z, tl.zeros((1024,), tl.float32), mask=i + z < n_zero_f32)
    for i in range(pid * 1024, n_zero_i32, step):
        tl.store(zero_i32_ptr + i + z, tl.zeros((1024,), tl.int32), mask=i + z < n_zero_i32)
    for i in range(pid * 1024, n_zero_f64, step):
        tl.store(zero_f64_ptr + i + z, tl.zeros((1024,), tl.float64), mask=i + z < n_zero_f64)


def round_to_tf32(values: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to tf32 (10 mantissa bits, ties away from zero), still as float32.

    Exactly representable in tf32, they reach the tensor cores unchanged whether the hardware
    truncates or rounds, so their error is half a tf32 ulp, not a whole one. (Host twin of
    ``_round_tf32``.)
    """
    bits = values.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


class Prepared(NamedTuple):
    """Operands of the assignment pass for one set of centroids (see ``prepare_centroids``).

    ``c_mma``/``c_lo``/``bias``: the fast pass's centroids times -2 in the rows' dtype (``c_lo``: the
    low bf16 part when split, else ``c_mma``) and its score bias; ``c_exact``/``bias_exact``: fp32
    centroids times -2 and ``||c||^2`` for the exact products (the re-search, and the reference
    precisions); ``c_norm``: the exact mode's rounding bound, float32 (3p,): in every run of
    ``PREPARE_ROWS`` centroids (p = k / ``PREPARE_ROWS``, rounded up) the largest centroid norm,
    then the largest norm of ``c - c_mma / -2`` (``- c_lo / -2`` too when split: what the pass's
    centroids leave out), then the largest ``|bias|`` (zero for the reference precisions).
    ``half_scale``: with fp16 operands for fp32 rows (``prepare_centroids(half_parts=...)``), float32 (3,): the power of two ``s`` by which
    the rows and centroids are scaled into fp16's range, ``s^-2``, and the floor on a row's norm
    in the exact mode's bound (``half_row_floor``); ``c_mma`` is then fp16 and scaled by ``s``, and
    ``bias`` by ``s^2`` (the products' unit); ``c_norm`` stays unscaled. Else None.
    ``bias_centred``: with ``half_scale`` and an offset, ``||c~||^2`` alone in the same unit (the
    bias of a search that rounds the rows less the offset, ``hopper_search.search(centred=True)``);
    else None.
    """

    c_mma: torch.Tensor
    c_lo: torch.Tensor
    bias: torch.Tensor
    c_exact: torch.Tensor
    bias_exact: torch.Tensor
    c_norm: torch.Tensor
    half_scale: torch.Tensor | None = None
    bias_centred: torch.Tensor | None = None


def prepare_centroids(
    c32: torch.Tensor,
    offset: torch.Tensor | None,
    x_dtype: torch.dtype,
    *,
    fast: bool,
    split: bool,
    exact: bool,
    zero: tuple[torch.Tensor, ...] = (),
    control: torch.Tensor | None = None,
    stats_prev: torch.Tensor | None = None,
    iteration: int = 0,
    tol: float = 0.0,
    half_parts: torch.Tensor | None = None,
) -> Prepared:
    """Operands of the assignment pass for fp32 centroids ``c32`` (k, d), in one launch.

    ``fast``: the pass multiplies in ``x_dtype`` on tensor cores (tf32-rounded centroids for fp32
    rows); ``split``: bf16 centroids as hi + lo parts; ``exact``: also the fp32 operands (re-search or
    reference precisions). ``offset`` (d,) is folded into the bias. The contiguous float32, int32 and
    float64 tensors in ``zero`` (at most one of each) are cleared by the same launch.

    ``control`` (int32 (2,): frozen flag, iterations allowed) serves Lloyd iterations replayed in
    blocks: when given, the launch does nothing while ``control[0]`` is set, and with
    ``stats_prev`` (the previous iteration's ``[inertia, shift, changed, empty]``) it sets the flag
    first if that iteration changed no label with no empty cluster, moved the centroids by at most
    ``tol``, left a cluster empty, or if ``iteration >= control[1]``. Every later launch of the
    iteration checks the flag too.

    ``half_parts`` (fp32 rows, ``fast``, no ``split``): the pass multiplies fp16 operands instead of
    tf32 ones (as many significant bits, twice the tensor-core rate), rows and centroids scaled by
    one power of two into fp16's range; the tensor holds ``amax_parts``' partial maxima, from which
    every program finds the scale (``Prepared.half_scale``).
    """
    k, d = c32.shape
    device = c32.device
    half = half_parts is not None
    if half and (x_dtype != torch.float32 or not fast or split):
        raise ValueError("fp16 operands (half_parts) are for the fast products of fp32 rows")
    mma_dtype = (torch.float16 if half else x_dtype) if fast else torch.float32
    c_mma = torch.empty(k, d, dtype=mma_dtype, device=device) if fast else None
    c_lo = torch.empty(k, d, dtype=mma_dtype, device=device) if split else c_mma
    c_exact = torch.empty(k, d, dtype=torch.float32, device=device) if exact else None
    bias = torch.empty(k, dtype=torch.float32, device=device) if fast else None
    bias_exact = torch.empty(k, dtype=torch.float32, device=device) if exact else None
    c_norm = torch.empty(3 * triton.cdiv(k, PREPARE_ROWS), dtype=torch.float32, device=device)
    half_scale = torch.empty(3, dtype=torch.float32, device=device) if half else None
    bias_centred = torch.empty(k, dtype=torch.float32, device=device) if half and offset is not None else None
    zeros = {t.dtype: t for t in zero}
    if len(zeros) != len(zero) or any(not t.is_contiguous() for t in zero):
        raise ValueError("zero takes at most one contiguous tensor per dtype")
    # Every unused pointer gets a tensor of its own, and c_lo is not c_mma's (see ``unused``).
    def given(t: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return unused(device, dtype) if t is None else t

    block_d = min(32, max(16, triton.next_power_of_2(d)))
    block_k = PREPARE_ROWS
    grid = max(1, triton.cdiv(k, block_k))
    launcher(_prepare_kernel)[(grid,)](
        c32, given(offset), given(c_mma), c_lo if split else unused(device, mma_dtype),
        given(bias), given(bias_centred), given(c_exact), given(bias_exact), c_norm,
        given(zeros.get(torch.float32)), zeros[torch.float32].numel() if torch.float32 in zeros else 0,
        given(zeros.get(torch.int32), torch.int32), zeros[torch.int32].numel() if torch.int32 in zeros else 0,
        given(zeros.get(torch.float64), torch.float64), zeros[torch.float64].numel() if torch.float64 in zeros else 0,
        given(control, torch.int32), given(stats_prev, torch.float64), iteration, tol,
        given(half_parts), half_parts.numel() if half else 0, given(half_scale),
        k, d, BLOCK_K=block_k, BLOCK_D=block_d, HAS_OFFSET=offset is not None, FAST=fast,
        TF32=x_dtype == torch.float32, SPLIT=split, EXACT=exact, HAS_CONTROL=control is not None,
        CHECK_STOP=stats_prev is not None, HALF=half,
    )
    if not fast:  # the reference precisions multiply the fp32 centroids
        c_mma, c_lo, bias = c_exact, c_exact, bias_exact
    if not exact:
        c_exact, bias_exact = c_mma, bias
    return Prepared(c_mma, c_lo, bias, c_exact, bias_exact, c_norm, half_scale, bias_centred)


@triton.jit
def _neighbour_reach(need_sq, d):
    """``2 sqrt(D)`` with room for the roundings of a direct fp32 distance ``D`` (the exact pass's
    margin, twice): within it of the centroid lies a row's true nearest, if its winner so far is
    that centroid at distance ``D``. Monotone in ``D`` (the plan's rows' reach is at most their
    centroid's)."""
    margin = (d + 16) * 1.1920929e-07
    return 2.0 * tl.sqrt(need_sq * (1.0 + margin)) * (1.0 + margin)


@triton.jit
def _neighbours_kernel(
    c_ptr, norm_ptr, need_ptr, tally_ptr, ids_ptr, control_ptr, k, d, first_tile, col_tiles, splits,
    COUNT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_CONTROL: tl.constexpr,
):
    """``centroid_neighbours``' search: program (i, s) takes centroids [i BLOCK_M, (i + 1) BLOCK_M)
    against the column tiles first_tile + s, first_tile + s + splits, ... (up to col_tiles) of
    BLOCK_K centroids (tf32 products of the centred centroids ``c_ptr``, their norms ``norm_ptr``),
    appending each hit to its centroid's list through the tally. A row block with no need returns
    at once; a tile whose rows have all seen more than COUNT hits is skipped (N(0, 1) rows:
    everything lies within reach, so most tiles)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < k
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see prepare_centroids)
        row_mask = row_mask & (tl.load(control_ptr) == 0)
    need_bits = tl.load(need_ptr + rows, mask=row_mask, other=0)
    active = row_mask & (need_bits > 0)
    # (Rows already past COUNT, after an earlier launch, are done.)
    active = active & (tl.load(tally_ptr + rows, mask=active, other=0, volatile=True) <= COUNT)
    if tl.max(active.to(tl.int32), axis=0) > 0:
        reach = _neighbour_reach(tl.maximum(need_bits - 1, 0).to(tl.float32, bitcast=True), d)
        reach_sq = reach * reach * (1.0 + 2.0**-20)
        dims0 = tl.arange(0, BLOCK_D)
        rows64 = rows.to(tl.int64)
        norm_w = tl.load(norm_ptr + rows, mask=row_mask, other=0.0)
        # Once every row of the block has seen more than COUNT hits the rest of its tiles are skipped
        # without a load (a tally only grows: a row past COUNT stays past it, whatever the other
        # programs add). (``rows * 0 + done``: the interpreter takes no scalar into a mask.)
        done = tl.program_id(0) * 0
        for t in range(first_tile + tl.program_id(1), col_tiles, splits):
            tally = tl.load(tally_ptr + rows, mask=active & (rows * 0 + done == 0), other=COUNT + 1, volatile=True)
            searching = active & (tally <= COUNT)
            some = tl.max(searching.to(tl.int32), axis=0) > 0
            done = tl.where(some, done, 1)
            if some:
                cols = t * BLOCK_K + tl.arange(0, BLOCK_K)
                col_mask = cols < k
                cols64 = cols.to(tl.int64)
                norm_j = tl.load(norm_ptr + cols, mask=col_mask, other=0.0)
                # (The loads go straight to the product, which can then pipeline them.)
                acc = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
                for d0 in range(0, d, BLOCK_D):
                    dims = d0 + dims0
                    dim_mask = dims < d
                    a = tl.load(c_ptr + rows64[:, None] * d + dims[None, :], mask=row_mask[:, None] & dim_mask[None, :],
                                other=0.0)
                    b = tl.load(c_ptr + cols64[:, None] * d + dims[None, :], mask=col_mask[:, None] & dim_mask[None, :],
                                other=0.0)
                    acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
                sq_w = norm_w * norm_w
                sq_j = norm_j * norm_j
                dist_sq = sq_w[:, None] + sq_j[None, :] - 2.0 * acc
                # The products' tf32 operands (2^-10 each, truncated) and fp32 sums of d terms, the
                # norms' sums (and their square roots, squared here: 4 more units), with the usual
                # 1.25 factor: a centroid left out is farther than the reach.
                error = 1.25 * (2.0 * norm_w[:, None] * norm_j[None, :] * (2.0**-9 + d * 2.0**-22)
                                + (sq_w[:, None] + sq_j[None, :]) * ((d + 4) * 2.0**-23))
                hit = (searching[:, None] & col_mask[None, :] & (cols[None, :] != rows[:, None])
                       & (dist_sq - error <= reach_sq[:, None]))
                # Hits are few (a handful per row over all tiles, most tiles none): one atomic per
                # hit for its slot, in the tiles that have one. (Issuing the tile's masked atomics
                # regardless: H200, 4,096 x 128 tight blobs, 143 against 107 us for the search.)
                if tl.sum(hit.to(tl.int32), axis=None) > 0:
                    # The address from the mask's own tensor (``_common.ATOMIC_ADDRESS_FROM_MASK``),
                    # on every Triton version: on 3.6 it saves 14-15 registers here, and the search
                    # took 114-115 / 109-110 us against 125-130 with the broadcast address (H100,
                    # 1M x 128 x 4,096 over-split rows, from random rows / after two iterations;
                    # level at 1M x 768 x 8,192; 2026-12-07).
                    tallies = tally_ptr + tl.where(hit, rows[:, None], 0)
                    pos = tl.atomic_add(tallies, tl.full((BLOCK_M, BLOCK_K), 1, tl.int32), mask=hit, sem="relaxed")
                    tl.store(ids_ptr + rows64[:, None] * COUNT + pos, cols[None, :] + tl.zeros_like(pos),
                             mask=hit & (pos < COUNT))


@triton.jit
def _neighbours_finish_kernel(need_ptr, tally_ptr, count_ptr, radius_ptr, control_ptr, k, d,
                              COUNT: tl.constexpr, BLOCK: tl.constexpr, HAS_CONTROL: tl.constexpr):
    """``centroid_neighbours``' end: each centroid's count and radius from its tally and need, both
    then cleared for the next pass."""
    go = True
    if HAS_CONTROL:
        go = tl.load(control_ptr) == 0
    if go:
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        row_mask = rows < k
        need_bits = tl.load(need_ptr + rows, mask=row_mask, other=0)
        tally = tl.load(tally_ptr + rows, mask=row_mask, other=0)
        reach = _neighbour_reach(tl.maximum(need_bits - 1, 0).to(tl.float32, bitcast=True), d)
        tl.store(count_ptr + rows, tally, mask=row_mask)
        tl.store(radius_ptr + rows, tl.where((need_bits > 0) & (tally <= COUNT), reach, -1.0), mask=row_mask)
        tl.store(need_ptr + rows, tl.zeros_like(need_bits), mask=row_mask)
        tl.store(tally_ptr + rows, tl.zeros_like(tally), mask=row_mask)


# Programs of the neighbour search per SM (``centroid_neighbours``): enough that a program's tiles,
# one after another, overlap with the others', few enough that a row block's first tiles, all in
# flight at once, are a small part of its columns (a tile past its rows' COUNT is skipped).
NEIGHBOUR_PROGRAMS_PER_SM = 4
# The search's square tiles of centroids, the features a step, and warps a program. (H200, every
# centroid searched, tight blobs / N(0, 1), us: 4,096 x 128 101 / 33 at 64 and 4, 121 / 60 at 128
# and 8; 8,192 x 768 857 / 79 against 679 / 116; 16,384 x 128 1,031 against 1,012: see
# BENCHMARKS.md, 2026-12-04.)
NEIGHBOUR_BLOCK = 64
NEIGHBOUR_BLOCK_D = 64
NEIGHBOUR_WARPS = 4
# (8,192 x 768: 927 us at 2 stages, 845 at 3; level at d = 128)
NEIGHBOUR_STAGES = 3


def centroid_neighbours(
    c32: torch.Tensor,
    need: torch.Tensor,
    tally: torch.Tensor,
    ids: torch.Tensor,
    counts: torch.Tensor,
    radius: torch.Tensor,
    control: torch.Tensor | None = None,
) -> None:
    """The centroids near each centroid that deferred rows of the exact pass need compared, in three launches.

    ``need`` int32 (k,): per centroid, 0, or 1 + the bits of the largest squared distance ``D`` of
    a deferred row whose winner so far it is (``assign._neighbour_need_kernel``); cleared here
    for the next pass. ``tally`` int32 (k,): a work buffer, zero on entry and again on exit. For
    each centroid ``w`` with a need, every other centroid within the reach ``2 sqrt(D)`` (with room
    for the roundings of ``D``) goes to ``ids[w]`` (int32 (k, COUNT), in any order; ``counts[w]`` of
    them); ``radius[w]`` is then that reach, or -1 where more than COUNT lie within it (``ids[w]``
    partly written, ``counts[w]`` at least the hits seen) or there was no need. A row whose winner
    so far is ``w`` at ``D`` then has its true nearest among ``w`` and ``ids[w]`` (triangle
    inequality).

    Why: the exact mode defers rows whose fast scores cannot tell their nearest centroid; where
    several centroids split a cluster tighter than the fast products' rounding, those are many,
    each near a few centroids and far from the rest: then a handful of direct distances settles a
    row, instead of re-scoring it against a chunk of centroids.

    Distances of the centroids centred on their mean (the error scales with the norms), by tf32
    products; a centroid is left out only when its distance less the bound on that error is past the
    reach. The product runs in tiles over a two-dimensional grid (row blocks of the centroids with a
    need, column tiles split among programs), each tile appending its hits through ``tally``, so the
    k x k product is spread over the whole GPU. ``control``: see ``prepare_centroids``.
    """
    k, d = c32.shape
    count = ids.shape[1]
    device = c32.device
    # Centred once (the error scales with the norms), the norms beside them, so that the search's
    # loads go straight into its products (H200, tight blobs, every centroid searched, us, with the
    # tiles that have a hit alone taking atomics: 4,096 x 128 196 -> 101; 8,192 x 768 1,680 -> 857;
    # N(0, 1) 4,096 x 128 42 -> 33; BENCHMARKS.md, 2026-12-04).
    centred, _ = centre_rows(c32)
    norms = torch.empty(k, dtype=torch.float32, device=device)
    row_norms(centred, norms)
    block = max(16, min(NEIGHBOUR_BLOCK, triton.next_power_of_2(k)))
    row_blocks = col_tiles = triton.cdiv(k, block)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
    splits = max(1, min(col_tiles - 1, triton.cdiv(NEIGHBOUR_PROGRAMS_PER_SM * sms, row_blocks)))
    control_arg = unused(device, torch.int32) if control is None else control
    # The first column tile for every row block, then the rest where a row still searches: where
    # every centroid lies within reach (N(0, 1) rows) the first tile already passes COUNT, and the
    # second launch's programs return after two loads each (H200, N(0, 1) centroids, 4,096 x 128,
    # 64-centroid tiles: 42 us, against 67 when the first tiles of all the programs of a row block
    # ran at once).
    for first, stop, grid_splits in ((0, 1, 1), (1, col_tiles, splits)):
        if first < stop:
            launcher(_neighbours_kernel)[(row_blocks, grid_splits)](
                centred, norms, need, tally, ids, control_arg, k, d, first, stop, grid_splits,
                COUNT=count, BLOCK_M=block, BLOCK_K=block,
                BLOCK_D=max(16, min(NEIGHBOUR_BLOCK_D, triton.next_power_of_2(d))),
                HAS_CONTROL=control is not None, num_warps=NEIGHBOUR_WARPS, num_stages=NEIGHBOUR_STAGES,
            )
    launcher(_neighbours_finish_kernel)[(triton.cdiv(k, 1024),)](
        need, tally, counts, radius, control_arg, k, d, COUNT=count, BLOCK=1024, HAS_CONTROL=control is not None,
        num_warps=4)


def centroid_neighbours_reference(c32: torch.Tensor, need_sq: torch.Tensor, count: int) -> tuple[list, torch.Tensor]:
    """Float64 twin of ``centroid_neighbours``: for each centroid with a need (``need_sq``, the
    largest deferred distance, NaN for none), the set of other centroids within its reach, and
    the reach (-1 for none, or more than ``count`` within it)."""
    k, d = c32.shape
    margin = (d + 16) * 1.1920929e-07
    reach = 2.0 * (need_sq.double() * (1.0 + margin)).sqrt() * (1.0 + margin)
    dist = torch.cdist(c32.double(), c32.double())
    dist.fill_diagonal_(float("inf"))
    within = [set(torch.nonzero(dist[w] <= reach[w]).flatten().tolist()) if not torch.isnan(reach[w]) else set()
              for w in range(k)]
    radius = torch.tensor([float(reach[w]) if not torch.isnan(reach[w]) and len(within[w]) <= count else -1.0
                           for w in range(k)], dtype=torch.float64)
    return within, radius


def half_scale_reference(x: torch.Tensor, c32: torch.Tensor) -> float:
    """The power of two ``s`` of fp16 operands (``_half_scale``): ``s M`` in [2^8, 2^9) for M the
    largest of |x| and 2 |c|, 1 for M = 0, clamped to [2^-60, 2^60]."""
    m = max(float(x.float().abs().max()) if x.numel() else 0.0, 2.0 * float(c32.abs().max()) if c32.numel() else 0.0)
    if m == 0.0:
        return 1.0
    exponent = math.frexp(m)[1] - 1  # m in [2^e, 2^(e + 1))
    return 2.0 ** min(max(HALF_TOP_EXPONENT - exponent, -HALF_SCALE_LIMIT), HALF_SCALE_LIMIT)


def _with_maxima(*parts: torch.Tensor) -> torch.Tensor:
    """``Prepared.c_norm`` of its three per-centroid parts: the largest of each in every run of
    ``PREPARE_ROWS`` centroids."""
    pad = -parts[0].shape[0] % PREPARE_ROWS
    return torch.cat([torch.cat([p, p.new_zeros(pad)]).view(-1, PREPARE_ROWS).amax(1) for p in parts])


def prepare_centroids_reference(
    c32: torch.Tensor, offset: torch.Tensor | None, x_dtype: torch.dtype, *, fast: bool, split: bool, exact: bool,
    half_scale: float | None = None,
) -> Prepared:
    """Pure-torch reference of ``prepare_centroids`` (without the clearing); ``half_scale``: fp16
    operands scaled by it (see ``half_scale_reference``)."""
    if half_scale is not None:
        s = half_scale
        c_mma = (c32 * (-2.0 * s)).half()
        hi64 = c_mma.double() * (-0.5 / s)
        bias_centred = None if offset is None else (hi64.pow(2).sum(1).float() * s) * s
        bias = hi64.pow(2).sum(1)
        if offset is not None:
            bias = bias + 2.0 * (hi64 @ offset.double())
        residual = c32 - hi64.float()
        c_norm = _with_maxima(c32.norm(dim=1), residual.norm(dim=1), bias.float().abs())
        scale = torch.tensor([s, 1.0 / s / s, half_row_floor(c32.shape[1], s)], dtype=torch.float32,
                             device=c32.device)
        bias_scaled = (bias.float() * s) * s
        c_exact = (c32 * -2).contiguous() if exact else c_mma
        bias_exact = c32.double().pow(2).sum(1).float() if exact else bias_scaled
        return Prepared(c_mma, c_mma, bias_scaled, c_exact, bias_exact, c_norm, scale, bias_centred)
    c_exact = (c32 * -2).contiguous()
    bias_exact = c32.double().pow(2).sum(1).float()
    norms = c32.norm(dim=1)
    if not fast:
        zeros = torch.zeros_like(norms)
        return Prepared(c_exact, c_exact, bias_exact, c_exact, bias_exact, _with_maxima(norms, zeros, zeros))
    hi = round_to_tf32(c32) if x_dtype == torch.float32 else c32.to(x_dtype)
    hi64 = hi.double()
    c_lo = None
    residual = c32 - hi.float()
    if split:
        c_lo = residual.to(x_dtype)
        hi64 = hi64 + c_lo.double()
        residual = residual - c_lo.float()
    bias = hi64.pow(2).sum(1)
    if offset is not None:
        bias = bias + 2.0 * (hi64 @ offset.double())
    c_mma = (hi * -2).contiguous()
    c_lo_mma = c_mma if c_lo is None else (c_lo * -2).contiguous()
    c_norm = _with_maxima(norms, residual.norm(dim=1), bias.float().abs())
    if not exact:
        c_exact, bias_exact = c_mma, bias.float()
    return Prepared(c_mma, c_lo_mma, bias.float(), c_exact, bias_exact, c_norm)


@triton.jit(do_not_specialize=["log_rows"])  # (a block's length: one compile for every block)
def _finish_kernel(
    acc_sums_ptr, acc_counts_ptr, n_replicas, c_ptr, c_old_ptr, sums_ptr, counts_ptr,
    part_inertia_ptr, part_changed_ptr, n_parts, stats_ptr, control_ptr, shift_top_ptr, shift_margin, moves_ptr,
    tally_a_ptr, tally_b_ptr, k, d, log_ptr, log_rows, stats_prev_ptr,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, NORMALIZE: tl.constexpr, HAS_CONTROL: tl.constexpr,
    PARTS_BLOCK: tl.constexpr, SHIFT_TOP: tl.constexpr, MOVES: tl.constexpr, TALLIES: tl.constexpr,
    LOG_WIDTH: tl.constexpr,
):
    go = True
    if HAS_CONTROL:  # a frozen iteration of a replayed block (see prepare_centroids)
        go = tl.load(control_ptr) == 0
    if LOG_WIDTH > 0:  # noqa: SIM102 (a compile-time branch around a run-time one)
        # A frozen iteration changes nothing: its record is the stopped one's (as a copy made after
        # it would be), so later rows of the block repeat the row where the host stops.
        if (tl.load(control_ptr) != 0) & (tl.program_id(0) == 0):
            _record_stats(stats_ptr, log_ptr, log_rows, stats_prev_ptr, control_ptr, False, LOG_WIDTH)
    if go:
        if TALLIES:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if tl.program_id(0) == 0:
                # Final since the launches before this one ended.
                tl.store(stats_ptr + 4, tl.load(tally_a_ptr).to(tl.float64))
                tl.store(stats_ptr + 5, tl.load(tally_b_ptr).to(tl.float64))
        if tl.program_id(0) < tl.cdiv(k, BLOCK_K):
            _finish_body(acc_sums_ptr, acc_counts_ptr, n_replicas, c_ptr, c_old_ptr, sums_ptr, counts_ptr,
                         stats_ptr, shift_top_ptr, shift_margin, moves_ptr, k, d, BLOCK_K, BLOCK_D, NORMALIZE, SHIFT_TOP,
                         MOVES)
        else:
            _partials_body(part_inertia_ptr, part_changed_ptr, n_parts, stats_ptr,
                           tl.program_id(0) - tl.cdiv(k, BLOCK_K), PARTS_BLOCK)
        if LOG_WIDTH > 0:
            # The last program to finish records the statistics: every other program's atomics
            # (and program 0's tallies) precede its ticket, which releases them (the barrier first
            # orders the program's own threads' writes before the one that takes the ticket).
            tl.debug_barrier()
            ticket = tl.atomic_add(control_ptr + 3, 1, sem="acq_rel")
            if ticket == tl.num_programs(0) - 1:
                _record_stats(stats_ptr, log_ptr, log_rows, stats_prev_ptr, control_ptr, True, LOG_WIDTH)


@triton.jit
def _record_stats(stats_ptr, log_ptr, log_rows, stats_prev_ptr, control_ptr, ATOMIC: tl.constexpr,
                  LOG_WIDTH: tl.constexpr):
    """``stats`` (``LOG_WIDTH`` float64 words) into row ``control[2]`` of the log (``log_rows`` rows)
    and its first four into ``stats_prev``; then the next row, and the ticket cleared. As 64-bit
    words, so that the bits of what the record holds besides float64 statistics (the bounds
    engine's ``shift_top`` keys) pass unchanged; read with atomics (at L2, where the other
    programs' atomics landed) after the ticket."""
    tl.static_assert(LOG_WIDTH <= 8)
    cols = tl.arange(0, 8)
    m = cols < LOG_WIDTH
    words_ptr = stats_ptr.to(tl.pointer_type(tl.int64))
    if ATOMIC:
        tl.debug_barrier()
        words = tl.atomic_or(words_ptr + cols, 0, mask=m, sem="relaxed")
    else:
        words = tl.load(words_ptr + cols, mask=m, other=0)
    row = tl.load(control_ptr + 2)
    if row < log_rows:
        tl.store(log_ptr.to(tl.pointer_type(tl.int64)) + row.to(tl.int64) * LOG_WIDTH + cols, words, mask=m)
    tl.store(stats_prev_ptr.to(tl.pointer_type(tl.int64)) + cols, words, mask=cols < 4)
    tl.store(control_ptr + 2, row + 1)
    tl.store(control_ptr + 3, 0)


@triton.jit
def _finish_body(
    acc_sums_ptr, acc_counts_ptr, n_replicas, c_ptr, c_old_ptr, sums_ptr, counts_ptr, stats_ptr, shift_top_ptr,
    shift_margin, moves_ptr, k, d,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, NORMALIZE: tl.constexpr, SHIFT_TOP: tl.constexpr,
    MOVES: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_K + tl.arange(0, BLOCK_K)
    row_mask = rows < k
    dims0 = tl.arange(0, BLOCK_D)
    # Sums in the accumulators' dtype (float32 replicas, or the float64 sums kept across passes).
    acc_dtype = acc_sums_ptr.dtype.element_ty
    counts_acc = tl.zeros((BLOCK_K,), acc_dtype)
    for r in range(n_replicas):
        counts_acc += tl.load(acc_counts_ptr + r * k + rows, mask=row_mask, other=0.0)
    counts = counts_acc.to(tl.float32)
    tl.store(counts_ptr + rows, counts, mask=row_mask)
    filled = counts > 0
    divisor = tl.where(filled, counts, 1.0)
    norm_sq = tl.zeros((BLOCK_K,), tl.float32)
    shift = tl.zeros((BLOCK_K,), tl.float32)
    # Features in chunks; with NORMALIZE, a first sweep takes the means' norms.
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + dims0
        mask = row_mask[:, None] & (dims < d)[None, :]
        offs = rows.to(tl.int64)[:, None] * d + dims[None, :]
        s_acc = tl.zeros((BLOCK_K, BLOCK_D), acc_dtype)
        for r in range(n_replicas):
            s_acc += tl.load(acc_sums_ptr + r * k * d + offs, mask=mask, other=0.0)
        s = s_acc.to(tl.float32)
        tl.store(sums_ptr + offs, s, mask=mask)
        old = tl.load(c_ptr + offs, mask=mask, other=0.0)
        # Clusters with no weight keep their centroid: never NaN.
        new = tl.where(filled[:, None], s / divisor[:, None], old)
        if NORMALIZE:
            norm_sq += tl.sum(new * new, axis=1)
        else:
            tl.store(c_old_ptr + offs, old, mask=mask)
            tl.store(c_ptr + offs, new, mask=mask)
            shift += tl.sum((new - old) * (new - old), axis=1)
    if NORMALIZE:
        norm = tl.sqrt(norm_sq)
        # A mean of opposing unit vectors can vanish; keep the old direction then.
        keep = norm <= 1e-12
        inv = 1.0 / tl.maximum(norm, 1e-30)
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + dims0
            mask = row_mask[:, None] & (dims < d)[None, :]
            offs = rows.to(tl.int64)[:, None] * d + dims[None, :]
            s = tl.load(sums_ptr + offs, mask=mask, other=0.0)
            old = tl.load(c_ptr + offs, mask=mask, other=0.0)
            new = tl.where(filled[:, None], s / divisor[:, None], old)
            new = tl.where(keep[:, None], old, new * inv[:, None])
            tl.store(c_old_ptr + offs, old, mask=mask)
            tl.store(c_ptr + offs, new, mask=mask)
            shift += tl.sum((new - old) * (new - old), axis=1)
    tl.atomic_add(stats_ptr + 1, tl.sum(shift, axis=0).to(tl.float64), sem="relaxed")
    if SHIFT_TOP:
        # The two largest centroid moves (norms, rounded up) with the largest one's index, for the
        # bounds engine: keys (fp32 bits << 32 | index) order as the moves do (non-negative floats).
        # Each program offers its best key to slot 0; what that displaces (or its own key, if it
        # loses), and its second key, go to slot 1. Every key but the overall largest reaches slot
        # 1 that way, so slot 1 ends as the second largest: no second launch, no ordering.
        moved = tl.sqrt(shift) * (1.0 + shift_margin)
        keys = (moved.to(tl.int32, bitcast=True).to(tl.int64) << 32) | rows.to(tl.int64)
        keys = tl.where(row_mask, keys, 0)
        first = tl.max(keys, axis=0)
        second = tl.max(tl.where(keys == first, 0, keys), axis=0)
        displaced = tl.atomic_max(shift_top_ptr, first, sem="relaxed")
        tl.atomic_max(shift_top_ptr + 1, tl.maximum(tl.minimum(displaced, first), second), sem="relaxed")
    if MOVES:
        tl.store(moves_ptr + rows, tl.sqrt(shift) * (1.0 + shift_margin), mask=row_mask)
    tl.atomic_add(stats_ptr + 3, tl.sum((row_mask & (counts <= 0)).to(tl.float64), axis=0), sem="relaxed")


@triton.jit
def _partials_body(part_inertia_ptr, part_changed_ptr, n_parts, stats_ptr, block, PARTS_BLOCK: tl.constexpr):
    """Block ``block`` of the pass's per-program partials (inertia, changed labels), added into the
    statistics. One program per 8 x PARTS_BLOCK partials, its loads all in flight at once: a pass
    over millions of rows leaves tens of thousands of partials, and one program walking them one
    load after another took 0.1 ms (H200, 3.9M rows)."""
    inertia = tl.zeros((PARTS_BLOCK,), tl.float64)
    changed = tl.zeros((PARTS_BLOCK,), tl.int64)
    for j in tl.static_range(8):
        parts = (block * 8 + j) * PARTS_BLOCK + tl.arange(0, PARTS_BLOCK)
        m = parts < n_parts
        inertia += tl.load(part_inertia_ptr + parts, mask=m, other=0.0).to(tl.float64)
        changed += tl.load(part_changed_ptr + parts, mask=m, other=0)
    tl.atomic_add(stats_ptr, tl.sum(inertia, axis=0), sem="relaxed")
    tl.atomic_add(stats_ptr + 2, tl.sum(changed, axis=0).to(tl.float64), sem="relaxed")


def finish_update(
    acc_sums: torch.Tensor,
    acc_counts: torch.Tensor,
    centroids: torch.Tensor,
    part_inertia: torch.Tensor,
    part_changed: torch.Tensor,
    stats: torch.Tensor,
    *,
    normalize: bool,
    old_centroids: torch.Tensor,
    sums: torch.Tensor,
    counts: torch.Tensor,
    control: torch.Tensor | None = None,
    shift_top: torch.Tensor | None = None,
    shift_margin: float = 0.0,
    tallies: tuple[torch.Tensor, torch.Tensor] | None = None,
    record: tuple[torch.Tensor, torch.Tensor] | None = None,
    moves: torch.Tensor | None = None,
) -> None:
    """The update step of a Lloyd iteration, in one launch and in place.

    ``acc_sums`` (R, k, d) / ``acc_counts`` (R, k): the pass's accumulator replicas (float32, or
    float64), reduced into ``sums`` (k, d) and ``counts`` (k,) (float32). ``centroids`` (k, d,
    float32) move to the means (kept where a cluster has no weight; renormalised when
    ``normalize``), their previous values go to ``old_centroids``. ``stats`` (float64 (4,), zero on
    entry) receives ``[inertia, shift, changed, empty]``: the sums of the pass's per-program
    partials, the total squared centroid movement, and the number of clusters with no weight.
    Nothing happens while ``control[0]`` is set (see ``prepare_centroids``).

    ``shift_top`` (int64 (2,), zero on entry) receives the two largest centroid moves as keys
    ``(float32 bits of the move) << 32 | centroid index``: slot 0 the largest, slot 1 the second
    largest (``unpack_shift_top``). A move is the norm of the centroid's change, rounded up by the
    relative ``shift_margin``; ``moves`` (float32 (k,)) receives every centroid's move, rounded up
    alike (``moves_reference``). ``tallies``: two int32 counters the earlier launches of the iteration
    wrote (e.g. rows searched, rows deferred), copied as float64 into ``stats[4]`` and ``stats[5]``
    (``stats`` then has at least 6 elements), so that one copy of ``stats`` records the iteration.

    ``record = (log, stats_prev)`` (with ``control``, which then has four int32 elements: frozen
    flag, iterations allowed, log row, ticket): the launch also copies ``stats`` (``log.shape[1]``
    float64 words, at most 8) into row ``control[2]`` of ``log`` and its first four into
    ``stats_prev`` (float64 (4,)), and moves ``control[2]`` to the next row; a frozen iteration
    copies them too (unchanged). This saves a replayed block two copies an iteration, each a few
    microseconds of launch gaps. ``control[3]`` must be 0 on entry and is again on exit.
    """
    if record is not None and (control is None or control.numel() < 4 or record[0].dim() != 2
                               or not 1 <= record[0].shape[1] <= min(8, stats.numel()) or record[1].numel() != 4):
        raise ValueError("record needs control of 4 int32 elements, a (rows, <= 8) log no wider than stats, "
                         "and stats_prev of 4 elements")
    if shift_top is not None and (shift_top.dtype != torch.int64 or shift_top.numel() != 2):
        raise ValueError("shift_top must be an int64 tensor of 2 elements")
    if moves is not None and (moves.dtype != torch.float32 or moves.numel() != centroids.shape[0]):
        raise ValueError("moves must be a float32 tensor of one element per centroid")
    if tallies is not None and stats.numel() < 6:
        raise ValueError("tallies go to stats[4] and stats[5]: stats needs 6 elements")
    k, d = centroids.shape
    device = centroids.device
    block_k = 16
    block_d = min(64, max(16, triton.next_power_of_2(d)))
    parts_block = 512
    # Programs for the centroids, then programs summing blocks of the partials (``_partials_body``).
    grid = triton.cdiv(k, block_k) + max(1, triton.cdiv(part_inertia.numel(), 8 * parts_block))
    launcher(_finish_kernel)[(grid,)](
        acc_sums, acc_counts, acc_sums.shape[0], centroids, old_centroids, sums, counts,
        part_inertia, part_changed, part_inertia.numel(), stats,
        unused(device, torch.int32) if control is None else control,
        unused(device, torch.int64) if shift_top is None else shift_top, shift_margin,
        unused(device, torch.float32) if moves is None else moves,
        *(tallies if tallies is not None else (unused(device, torch.int32), unused(device, torch.int32))), k, d,
        *(unused(device, torch.float64), 0, unused(device, torch.float64)) if record is None
        else (record[0], record[0].shape[0], record[1]),
        BLOCK_K=block_k, BLOCK_D=block_d, NORMALIZE=normalize, HAS_CONTROL=control is not None,
        PARTS_BLOCK=parts_block, SHIFT_TOP=shift_top is not None, MOVES=moves is not None, TALLIES=tallies is not None,
        LOG_WIDTH=0 if record is None else record[0].shape[1],
    )


def unpack_shift_top(shift_top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(largest move, second largest move, index of the largest)`` from ``finish_update``'s keys."""
    moves = (shift_top >> 32).to(torch.int32).view(torch.float32)
    return moves[0], moves[1], shift_top[0] & 0xFFFFFFFF


def moves_reference(centroids: torch.Tensor, old_centroids: torch.Tensor, shift_margin: float) -> torch.Tensor:
    """``finish_update``'s ``moves``: each centroid's move (norm of its change), rounded up by
    ``shift_margin``, computed with torch (from any two sets of centroids)."""
    return torch.linalg.vector_norm((centroids - old_centroids).float(), dim=1) * (1.0 + shift_margin)


def shift_top_reference(centroids: torch.Tensor, old_centroids: torch.Tensor, shift_margin: float) -> torch.Tensor:
    """``finish_update``'s ``shift_top`` keys computed with torch (from any two sets of centroids)."""
    moved = moves_reference(centroids, old_centroids, shift_margin)
    keys = (moved.view(torch.int32).to(torch.int64) << 32) | torch.arange(moved.numel(), device=moved.device)
    top = torch.topk(keys, min(2, keys.numel())).values
    return torch.cat([top, top.new_zeros(2 - top.numel())])


def finish_update_reference(
    acc_sums: torch.Tensor, acc_counts: torch.Tensor, centroids: torch.Tensor, part_inertia: torch.Tensor,
    part_changed: torch.Tensor, *, normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch reference: ``(new_centroids, sums, counts, stats)``."""
    sums, counts = acc_sums.sum(0).float(), acc_counts.sum(0).float()
    filled = counts > 0
    new = torch.where(filled[:, None], sums / torch.where(filled, counts, 1.0)[:, None], centroids)
    if normalize:
        norm = new.norm(dim=1, keepdim=True)
        new = torch.where(norm > 1e-12, new / norm.clamp_min(1e-30), centroids)
    stats = torch.stack([part_inertia.double().sum(), ((new - centroids) ** 2).sum().double(),
                         part_changed.sum().double(), (counts <= 0).sum().double()])
    return new, sums, counts, stats


@triton.jit
def _column_partials_kernel(c_ptr, partials_ptr, k, d, ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_D: tl.constexpr):
    # Program p: the column sums of rows [p * ROWS, (p + 1) * ROWS) into partials[p].
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
        for r0 in range(0, ROWS, BLOCK_R):
            rows = tl.program_id(0) * ROWS + r0 + tl.arange(0, BLOCK_R)
            acc += tl.load(c_ptr + rows.to(tl.int64)[:, None] * d + dims[None, :],
                           mask=(rows < k)[:, None] & (dims < d)[None, :], other=0.0)
        tl.store(partials_ptr + tl.program_id(0) * d + dims, tl.sum(acc, axis=0), mask=dims < d)


@triton.jit
def _centre_kernel(c_ptr, partials_ptr, n_partials, out_ptr, mean_ptr, k, d,
                   ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):
    # Program (r, j): the mean of column block j from every partial (the same sum, in the same
    # order, in every program), then rows [r * ROWS, (r + 1) * ROWS) minus it.
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dim_mask = dims < d
    total = tl.zeros((BLOCK_P, BLOCK_D), tl.float32)
    for p0 in range(0, n_partials, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        total += tl.load(partials_ptr + parts[:, None] * d + dims[None, :],
                         mask=(parts < n_partials)[:, None] & dim_mask[None, :], other=0.0)
    mean = tl.sum(total, axis=0) / k
    if tl.program_id(0) == 0:
        tl.store(mean_ptr + dims, mean, mask=dim_mask)
    for r0 in range(tl.program_id(0) * ROWS, tl.minimum((tl.program_id(0) + 1) * ROWS, k), BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        offs = rows.to(tl.int64)[:, None] * d + dims[None, :]
        mask = (rows < k)[:, None] & dim_mask[None, :]
        tl.store(out_ptr + offs, tl.load(c_ptr + offs, mask=mask, other=0.0) - mean[None, :], mask=mask)


def centre_rows(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(c - mean, mean)`` of contiguous float32 rows ``c`` (k, d), the mean over the rows, in two
    launches and deterministically (fixed summation order). What torch does in a column reduction
    and a subtraction, 24 us for 8192 x 256 on an H200, much of it in the reduction's kernel for a
    leading dimension."""
    if c.dim() != 2 or c.dtype != torch.float32 or not c.is_contiguous():
        raise ValueError(f"c must be a contiguous float32 (k, d) tensor, got {c.dtype} {tuple(c.shape)}")
    k, d = c.shape
    out = torch.empty_like(c)
    mean = torch.empty(d, dtype=torch.float32, device=c.device)
    if k == 0 or d == 0:
        return out, mean.fill_(float("nan"))  # (torch's mean of no rows)
    # At most 128 partial sums (each then read by every program of the second launch, from L2),
    # and about 256 programs in the second launch.
    rows1 = max(16, triton.next_power_of_2(triton.cdiv(k, 128)))
    n_partials = triton.cdiv(k, rows1)
    partials = torch.empty(n_partials, d, dtype=torch.float32, device=c.device)
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    launcher(_column_partials_kernel)[(n_partials,)](c, partials, k, d, ROWS=rows1, BLOCK_R=min(rows1, 32),
                                                    BLOCK_D=block_d, num_warps=4)
    d_blocks = triton.cdiv(d, block_d)
    rows2 = max(32, triton.next_power_of_2(triton.cdiv(k * d_blocks, 256)))
    launcher(_centre_kernel)[(triton.cdiv(k, rows2), d_blocks)](
        c, partials, n_partials, out, mean, k, d, ROWS=rows2, BLOCK_R=32, BLOCK_D=block_d,
        BLOCK_P=min(64, max(2, triton.next_power_of_2(n_partials))), num_warps=4)
    return out, mean


def centre_rows_reference(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``centre_rows`` in torch."""
    mean = c.mean(0)
    return c - mean, mean
