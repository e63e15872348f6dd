"""The backward of a vector-quantization layer's output and commitment loss, in one pass.

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
import triton
import triton.language as tl

from ._common import launcher

__all__ = ["straight_through_grad", "straight_through_grad_reference"]

_BLOCK = 2048


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
