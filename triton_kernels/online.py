"""The online (EMA) codebook update of a VQ layer's training step, in two launches.

After the assignment pass has left each code's sum and count of the batch in its accumulators,
the update of an EMA codebook (VQ-VAE, van den Oord et al. 2017, appendix) is

    cluster_size <- lerp(cluster_size, counts, 1 - decay)
    embed_sum    <- lerp(embed_sum, sums, 1 - decay)
    codebook     <- embed_sum / smoothed(cluster_size)        (rows of no weight keep theirs)

with Laplace smoothing ``(size + eps) / (total + k eps) * total`` (``total``: the sum of the new
sizes), an optional L2 normalisation (cosine codebooks), and the revival of dead codes (size below
a threshold) onto given batch rows. In torch that is some twenty launches over (k, d) tensors,
each a node of a replayed training step's graph and, eagerly, tens of microseconds of host time.
Here it is two: ``_sizes_kernel`` updates the sizes and writes per-block partial totals (and sums
the pass's inertia partials into the batch's total squared distance); ``_codebook_kernel`` reads
every partial total (so the total is the same in every program, and the same from run to run),
then updates each code's row whole (its sums, EMA, smoothing, norm and revival), reading the
accumulators, the EMA sums and the codebook once and writing them, and the old codebook, once.

``decay=None`` adds instead of averaging (cumulative statistics: scikit-learn's mini-batch
``partial_fit``), and ``eps=None`` divides by the sizes themselves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import launcher, unused

__all__ = ["ema_update", "ema_update_reference"]

_SIZES_BLOCK = 1024


@triton.jit
def _lerp(start, end, weight, HIGH: tl.constexpr):
    # torch.lerp's two forms (weight below / from 0.5 on), so that results match it bit for bit.
    if HIGH:
        return end - (end - start) * (1.0 - weight)
    else:
        return start + weight * (end - start)


@triton.jit
def _sum_parts(parts_ptr, n_parts, BLOCK: tl.constexpr):
    """The sum of ``n_parts`` float32 partials, by one program."""
    parts = tl.zeros((BLOCK,), tl.float32)
    for p0 in range(0, n_parts, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        parts += tl.load(parts_ptr + p, mask=p < n_parts, other=0.0)
    return tl.sum(parts, axis=0)


@triton.jit
def _sizes_kernel(acc_counts_ptr, n_replicas, size_ptr, total_parts_ptr, part_inertia_ptr, n_inertia_parts,
                  sq_total_ptr, k, weight,
                  DECAY: tl.constexpr, HIGH: tl.constexpr, HAS_INERTIA: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    mask = rows < k
    counts = tl.zeros((BLOCK,), tl.float32)
    for r in range(n_replicas):
        counts += tl.load(acc_counts_ptr + r * k + rows, mask=mask, other=0.0)
    old_size = tl.load(size_ptr + rows, mask=mask, other=0.0)
    if DECAY:
        size = _lerp(old_size, counts, weight, HIGH)
    else:
        size = old_size + counts
    if HAS_INERTIA:
        # Every program sums the squared distances: a batch with a non-finite row (NaN or Inf in
        # x, or a distance that overflowed) has a non-finite sum and updates nothing (``GUARD``).
        sq_total = _sum_parts(part_inertia_ptr, n_inertia_parts, BLOCK)
        size = tl.where(tl.abs(sq_total) < float("inf"), size, old_size)
        if pid == 0:
            tl.store(sq_total_ptr, sq_total)
    tl.store(size_ptr + rows, size, mask=mask)
    tl.store(total_parts_ptr + pid, tl.sum(tl.where(mask, size, 0.0), axis=0))


@triton.jit
def _codebook_kernel(
    acc_sums_ptr, acc_counts_ptr, n_replicas, offset_ptr, size_ptr, total_parts_ptr, n_total_parts,
    embed_sum_ptr, codebook_ptr, used_ptr, x_ptr, stride_xn, stride_xd, revive_rows_ptr, sq_total_ptr,
    k, d, weight, eps, threshold,
    DECAY: tl.constexpr, HIGH: tl.constexpr, SMOOTH: tl.constexpr, NORMALIZE: tl.constexpr,
    HAS_OFFSET: tl.constexpr, REVIVE: tl.constexpr, STORE_USED: tl.constexpr, GUARD: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, PARTS_BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_mask = rows < k
    # GUARD: the batch's squared distances summed to a non-finite value (``_sizes_kernel``, which
    # then kept the sizes): the codes and their sums stay, and no code is revived onto its rows.
    apply = True
    if GUARD:
        apply = tl.abs(tl.load(sq_total_ptr)) < float("inf")
    rows64 = rows.to(tl.int64)
    dims0 = tl.arange(0, BLOCK_D)
    size = tl.load(size_ptr + rows, mask=row_mask, other=0.0)
    if SMOOTH:
        total = _sum_parts(total_parts_ptr, n_total_parts, PARTS_BLOCK)
        divisor = (size + eps) / (total + k * eps) * total
    else:
        divisor = size
    filled = divisor > 0
    divisor = tl.where(filled, divisor, 1.0)
    counts = tl.zeros((BLOCK_K,), tl.float32)
    if HAS_OFFSET:
        for r in range(n_replicas):
            counts += tl.load(acc_counts_ptr + r * k + rows, mask=row_mask, other=0.0)
    dead = rows < 0
    source = rows64 * 0
    if REVIVE:
        dead = tl.where(apply, row_mask & (size < threshold), False)
        source = tl.load(revive_rows_ptr + rows, mask=dead, other=0).to(tl.int64)
    norm_sq = tl.zeros((BLOCK_K,), tl.float32)
    # A second sweep for the normalised rows recomputes the first's values (never reading back
    # what this program stored, which other threads of it may have written).
    for sweep in tl.static_range(2 if NORMALIZE else 1):
        if sweep == 1:
            norm = tl.sqrt(norm_sq)
            keep = norm <= 1e-12  # a vanishing mean keeps the old direction
            inv = 1.0 / tl.maximum(norm, 1e-30)
        for d0 in range(0, d, BLOCK_D):
            dims = d0 + dims0
            dim_mask = dims < d
            mask = row_mask[:, None] & dim_mask[None, :]
            offs = rows64[:, None] * d + dims[None, :]
            sums = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
            for r in range(n_replicas):
                sums += tl.load(acc_sums_ptr + (r * k).to(tl.int64) * d + offs, mask=mask, other=0.0)
            if HAS_OFFSET:  # the pass summed centred rows
                sums += counts[:, None] * tl.load(offset_ptr + dims, mask=dim_mask, other=0.0)[None, :]
            old_embed = tl.load(embed_sum_ptr + offs, mask=mask, other=0.0)
            if DECAY:
                embed = _lerp(old_embed, sums, weight, HIGH)
            else:
                embed = old_embed + sums
            embed = tl.where(apply, embed, old_embed)
            old = tl.load(codebook_ptr + offs, mask=mask, other=0.0)
            new = tl.where(filled[:, None], embed / divisor[:, None], old)
            new = tl.where(apply, new, old)
            if NORMALIZE and sweep == 0:
                norm_sq += tl.sum(new * new, axis=1)
            else:
                if NORMALIZE:
                    new = tl.where(keep[:, None], old, new * inv[:, None])
                    new = tl.where(apply, new, old)
                if STORE_USED:
                    tl.store(used_ptr + offs, old, mask=mask)
                if REVIVE:
                    revived = tl.load(x_ptr + source[:, None] * stride_xn + dims[None, :] * stride_xd,
                                      mask=dead[:, None] & dim_mask[None, :], other=0.0).to(tl.float32)
                    new = tl.where(dead[:, None], revived, new)
                    embed = tl.where(dead[:, None], revived * threshold, embed)
                tl.store(embed_sum_ptr + offs, embed, mask=mask)
                tl.store(codebook_ptr + offs, new, mask=mask)
    if REVIVE:
        tl.store(size_ptr + rows, tl.where(dead, threshold, size), mask=row_mask)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if t.dtype != torch.float32 or tuple(t.shape) != shape or not t.is_contiguous() or t.device != device:
        raise ValueError(f"{name} must be a contiguous float32 tensor of shape {shape} on {device}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")


def ema_update(
    acc_sums: torch.Tensor,
    acc_counts: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    codebook: torch.Tensor,
    *,
    decay: float | None,
    eps: float | None,
    offset: torch.Tensor | None = None,
    normalize: bool = False,
    used: torch.Tensor | None = None,
    part_inertia: torch.Tensor | None = None,
    sq_total: torch.Tensor | None = None,
    revive_threshold: float = 0.0,
    revive_from: torch.Tensor | None = None,
    revive_rows: torch.Tensor | None = None,
) -> None:
    """Fold one batch's per-code sums into EMA statistics and move the codebook, in place.

    ``acc_sums`` (R, k, d) / ``acc_counts`` (R, k): float32 replicas whose sum over R is the batch's
    per-code sums of rows ``x - offset`` and counts (``offset`` (d,), or None for 0). Updated in
    place, all float32: ``cluster_size`` (k,), ``embed_sum`` (k, d) and ``codebook`` (k, d), as the
    module docstring says (``decay``: EMA decay in [0, 1), or None to add; ``eps``: Laplace
    smoothing, or None for none; ``normalize``: unit rows, a vanishing row keeping its old one).
    ``used`` (k, d): receives the codebook as it was. ``part_inertia`` (P,) float32 partials are
    summed into the 0-d float32 ``sq_total``; where that sum is not finite (a row of NaN or Inf, or a
    distance that overflowed) nothing else changes: one bad batch does not poison the codebook for
    good (under AMP a step with Inf activations is skipped the same way). With ``revive_threshold > 0``, codes whose updated
    size is below it move onto the rows ``revive_from[revive_rows[j]]`` (``revive_from`` (m, d) of
    any float dtype, ``revive_rows`` (k,) int64), with size ``revive_threshold`` and sum
    ``revive_threshold`` times that row.
    """
    k, d = codebook.shape
    device = codebook.device
    _check("codebook", codebook, (k, d), device)
    _check("embed_sum", embed_sum, (k, d), device)
    _check("cluster_size", cluster_size, (k,), device)
    if acc_sums.dim() != 3:
        raise ValueError(f"acc_sums must be (R, k, d), got {tuple(acc_sums.shape)}")
    n_replicas = acc_sums.shape[0]
    _check("acc_sums", acc_sums, (n_replicas, k, d), device)
    _check("acc_counts", acc_counts, (n_replicas, k), device)
    for name, t, shape in (("offset", offset, (d,)), ("used", used, (k, d)), ("sq_total", sq_total, ())):
        if t is not None:
            _check(name, t, shape, device)
    if (part_inertia is None) != (sq_total is None):
        raise ValueError("pass both part_inertia and sq_total, or neither")
    if decay is not None and not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must lie in [0, 1) or be None, got {decay!r}")
    revive = revive_threshold > 0
    if revive and (revive_from is None or revive_rows is None or revive_rows.shape != (k,)
                   or revive_from.dim() != 2 or revive_from.shape[1] != d):
        raise ValueError(f"reviving codes needs revive_from (m, {d}) and revive_rows ({k},)")
    if k == 0:
        return
    weight = 0.0 if decay is None else 1.0 - decay
    n_size_blocks = triton.cdiv(k, _SIZES_BLOCK)
    total_parts = torch.empty(n_size_blocks, dtype=torch.float32, device=device)
    launcher(_sizes_kernel)[(n_size_blocks,)](
        acc_counts, n_replicas, cluster_size, total_parts,
        unused(device, torch.float32) if part_inertia is None else part_inertia,
        0 if part_inertia is None else part_inertia.numel(),
        unused(device, torch.float32) if sq_total is None else sq_total, k, weight,
        DECAY=decay is not None, HIGH=weight >= 0.5, HAS_INERTIA=part_inertia is not None, BLOCK=_SIZES_BLOCK,
    )
    block_k = 16
    block_d = min(128, max(16, triton.next_power_of_2(d)))
    source = revive_from if revive else unused(device, torch.float32)
    launcher(_codebook_kernel)[(triton.cdiv(k, block_k),)](
        acc_sums, acc_counts, n_replicas, unused(device, torch.float32) if offset is None else offset,
        cluster_size, total_parts, n_size_blocks, embed_sum, codebook,
        unused(device, torch.float32) if used is None else used,
        source, source.stride(0) if revive else 0, source.stride(1) if revive else 0,
        revive_rows if revive else unused(device, torch.int64),
        unused(device, torch.float32) if sq_total is None else sq_total,
        k, d, weight, 0.0 if eps is None else eps, revive_threshold,
        DECAY=decay is not None, HIGH=weight >= 0.5, SMOOTH=eps is not None, NORMALIZE=normalize,
        HAS_OFFSET=offset is not None, REVIVE=revive, STORE_USED=used is not None, GUARD=sq_total is not None,
        BLOCK_K=block_k, BLOCK_D=block_d, PARTS_BLOCK=min(1024, max(16, triton.next_power_of_2(n_size_blocks))),
        num_warps=8,
    )


def ema_update_reference(
    acc_sums: torch.Tensor,
    acc_counts: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    codebook: torch.Tensor,
    *,
    decay: float | None,
    eps: float | None,
    offset: torch.Tensor | None = None,
    normalize: bool = False,
    used: torch.Tensor | None = None,
    part_inertia: torch.Tensor | None = None,
    sq_total: torch.Tensor | None = None,
    revive_threshold: float = 0.0,
    revive_from: torch.Tensor | None = None,
    revive_rows: torch.Tensor | None = None,
) -> None:
    """Pure-torch ``ema_update``, in place on the same arguments."""
    counts = acc_counts.sum(0)
    sums = acc_sums.sum(0)
    if offset is not None:
        sums = sums + counts[:, None] * offset
    if used is not None:
        used.copy_(codebook)
    if sq_total is not None:
        assert part_inertia is not None
        sq_total.copy_(part_inertia.sum())
        if not bool(torch.isfinite(sq_total)):
            return  # a batch with a non-finite row updates nothing (``ema_update``)
    if decay is None:
        cluster_size.add_(counts)
        embed_sum.add_(sums)
    else:
        cluster_size.lerp_(counts, 1.0 - decay)
        embed_sum.lerp_(sums, 1.0 - decay)
    sizes = cluster_size
    if eps is not None:
        total = cluster_size.sum()
        sizes = (cluster_size + eps) / (total + cluster_size.numel() * eps) * total
    filled = sizes > 0
    new = torch.where(filled[:, None], embed_sum / torch.where(filled, sizes, 1.0)[:, None], codebook)
    if normalize:
        norm = torch.sqrt((new * new).sum(1, keepdim=True))
        new = torch.where(norm <= 1e-12, codebook, new / norm.clamp_min(1e-30))
    if revive_threshold > 0:
        assert revive_from is not None and revive_rows is not None
        dead = cluster_size < revive_threshold
        revived = revive_from[revive_rows].float()
        new = torch.where(dead[:, None], revived, new)
        embed_sum.copy_(torch.where(dead[:, None], revived * revive_threshold, embed_sum))
        cluster_size.copy_(torch.where(dead, torch.full_like(cluster_size, revive_threshold), cluster_size))
    codebook.copy_(new)
