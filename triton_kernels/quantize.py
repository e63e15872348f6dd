"""A vector-quantization layer's codes and losses forward, and their backward, one pass each.

Forward, ``gather_codes`` writes the codes of a batch's labels in the batch's dtype (and, for
16-bit batches, in float32 for the backward) and the two loss scalars, in one launch: torch's
gather of fp32 codes and its cast take 21.5 and 33.2 us at 32,768 x 256 (H200, fp32 and bf16),
this kernel 10.8 and 6.7.

Backward:

A VQ layer returns ``quantized`` (the codes, straight through: its gradient passes to the input as
it is) and ``commitment = sum ||x - code||^2 / x.numel()`` (and the weighted ``loss``). The input's
gradient is

    grad_x = grad_quantized + (grad_commitment + loss_weight * grad_loss) * 2 / numel * (x - code)

which torch computes as a subtraction and a fused multiply-add, two passes over the batch plus a
few scalar launches. Here it is one kernel that reads the three (n, d) tensors once and writes the
gradient once, taking the two scalar gradients from device memory (no host synchronisation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._common import launcher, unused

__all__ = ["gather_codes", "gather_codes_reference", "straight_through_grad", "straight_through_grad_reference"]

_BLOCK = 2048
# Rows of a gather program: 8 rows of 256 fp32 features (H200, 32,768 x 256: 10.8 us; 16 rows 11.1,
# 32 rows 11.4, 64 rows 13.1).
_GATHER_ROWS = 8


@triton.jit
def _gather_codes_kernel(codebook_ptr, labels_ptr, out_ptr, out32_ptr, total_ptr, commitment_ptr, loss_ptr,
                         n, d, inv_numel, loss_scale, WRITE_FP32: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    if pid == 0:
        total = tl.load(total_ptr)
        tl.store(commitment_ptr, total * inv_numel)
        tl.store(loss_ptr, total * loss_scale)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n
    labels = tl.load(labels_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    out_rows = rows.to(tl.int64)[:, None] * d
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        mask = row_mask[:, None] & (dims < d)[None, :]
        code = tl.load(codebook_ptr + labels[:, None] * d + dims[None, :], mask=mask, other=0.0)
        tl.store(out_ptr + out_rows + dims[None, :], code.to(out_ptr.dtype.element_ty), mask=mask)
        if WRITE_FP32:
            tl.store(out32_ptr + out_rows + dims[None, :], code, mask=mask)


def gather_codes_reference(labels: torch.Tensor, codebook: torch.Tensor, dtype: torch.dtype, total: torch.Tensor,
                           inv_numel: float, loss_weight: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same in torch: ``codebook[labels]`` in ``dtype`` and in float32 (the same tensor where
    ``dtype`` is float32), ``total * inv_numel`` and ``total * (loss_weight * inv_numel)``."""
    codes = F.embedding(labels, codebook)
    return codes.to(dtype), codes, total * inv_numel, total * (loss_weight * inv_numel)


def gather_codes(labels: torch.Tensor, codebook: torch.Tensor, dtype: torch.dtype, total: torch.Tensor,
                 inv_numel: float, loss_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A VQ layer's forward outputs from its labels, in one launch: ``(codes, codes32, commitment,
    loss)``, the codes ``codebook[labels]`` ((n, d), in ``dtype``), the same in float32 (the same
    tensor where ``dtype`` is float32), and the 0-d float32 ``total * inv_numel`` and ``total *
    (loss_weight * inv_numel)``. ``labels``: (n,) integers in [0, k) (not checked); ``codebook``:
    contiguous float32 (k, d); ``total``: a 0-d float32 tensor (a sum of squared distances)."""
    if labels.dim() != 1 or codebook.dim() != 2 or codebook.dtype != torch.float32 or total.numel() != 1:
        raise ValueError(f"expected labels (n,), a float32 codebook (k, d) and a 0-d total, got {tuple(labels.shape)}, "
                         f"{tuple(codebook.shape)} {codebook.dtype} and {tuple(total.shape)}")
    n, d = labels.shape[0], codebook.shape[1]
    codes = torch.empty((n, d), dtype=dtype, device=codebook.device)
    codes32 = codes if dtype == torch.float32 else torch.empty((n, d), dtype=torch.float32, device=codebook.device)
    commitment = torch.empty((), dtype=torch.float32, device=codebook.device)
    loss = torch.empty((), dtype=torch.float32, device=codebook.device)
    launcher(_gather_codes_kernel)[(max(1, triton.cdiv(n, _GATHER_ROWS)),)](
        codebook.contiguous(), labels.contiguous(), codes, codes32 if codes32 is not codes else unused(codes.device),
        total.reshape(()).to(torch.float32), commitment, loss, n, d, inv_numel, loss_weight * inv_numel,
        WRITE_FP32=codes32 is not codes, BLOCK_R=_GATHER_ROWS, BLOCK_D=min(256, max(16, triton.next_power_of_2(d))),
        num_warps=4)
    return codes, codes32, commitment, loss


@triton.jit
def _straight_through_grad_kernel(grad_q_ptr, x_ptr, codes_ptr, grad_commitment_ptr, grad_loss_ptr, out_ptr,
                                  numel, loss_weight, inv_numel, HAS_COMMITMENT: tl.constexpr,
                                  HAS_LOSS: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    scale = 0.0
    if HAS_COMMITMENT:
        scale += tl.load(grad_commitment_ptr)
    if HAS_LOSS:
        scale += loss_weight * tl.load(grad_loss_ptr)
    scale = scale * (2.0 * inv_numel)
    g = tl.load(grad_q_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    code = tl.load(codes_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (g + scale * (x - code)).to(out_ptr.dtype.element_ty), mask=mask)


def straight_through_grad_reference(grad_quantized: torch.Tensor, x: torch.Tensor, codes: torch.Tensor,
                                    grad_commitment: torch.Tensor | None, grad_loss: torch.Tensor | None,
                                    loss_weight: float) -> torch.Tensor:
    """The same in torch: fp32 arithmetic, rounded once to ``x``'s dtype."""
    if grad_commitment is None and grad_loss is None:
        return grad_quantized.float().to(x.dtype)
    scale = 0.0 if grad_commitment is None else grad_commitment.float()
    if grad_loss is not None:
        scale = scale + loss_weight * grad_loss.float()
    return torch.addcmul(grad_quantized.float(), x.float() - codes.float(), scale * (2.0 / max(x.numel(), 1))).to(x.dtype)


def straight_through_grad(grad_quantized: torch.Tensor, x: torch.Tensor, codes: torch.Tensor,
                          grad_commitment: torch.Tensor | None, grad_loss: torch.Tensor | None,
                          loss_weight: float) -> torch.Tensor:
    """``grad_quantized + (grad_commitment + loss_weight * grad_loss) * 2 / x.numel() * (x - codes)``
    in ``x``'s dtype, computed in fp32. ``grad_quantized``, ``x`` and ``codes`` share a shape (any
    strides: non-contiguous ones are copied first); the two gradients are 0-d float32 tensors, or
    None for 0 (autograd's gradient of an unused output, not materialised as a zero)."""
    if not (grad_quantized.shape == x.shape == codes.shape):
        raise ValueError(f"shapes differ: {tuple(grad_quantized.shape)}, {tuple(x.shape)}, {tuple(codes.shape)}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    numel = x.numel()
    if numel == 0:
        return out
    given = grad_commitment if grad_commitment is not None else grad_loss
    if given is None:
        return out.copy_(grad_quantized)
    # (A missing gradient's pointer is the other's, never read: both are read-only.)
    launcher(_straight_through_grad_kernel)[(triton.cdiv(numel, _BLOCK),)](
        grad_quantized.contiguous(), x.contiguous(), codes.contiguous(),
        (given if grad_commitment is None else grad_commitment).to(torch.float32).reshape(1),
        (given if grad_loss is None else grad_loss).to(torch.float32).reshape(1), out,
        numel, float(loss_weight), 1.0 / numel, HAS_COMMITMENT=grad_commitment is not None,
        HAS_LOSS=grad_loss is not None, BLOCK=_BLOCK, num_warps=8)
    return out
