"""triton_kernels/quantize.py (a VQ layer's input gradient) against its torch reference."""

import pytest
import torch
from torchkm._kernels.quantize import (
    gather_codes,
    gather_codes_reference,
    straight_through_grad,
    straight_through_grad_reference,
)

from tests.kernels.conftest import DEVICE


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (17, 129), (2049, 1), (1001, 17)])
def test_straight_through_grad_matches_reference(dtype, shape):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) % (1 << 31))
    x = torch.randn(shape, generator=g).to(DEVICE, dtype)
    codes = torch.randn(shape, generator=g).to(DEVICE)  # float32, as a layer's codebook
    grad_q = torch.randn(shape, generator=g).to(DEVICE, dtype)
    grad_commitment, grad_loss = torch.tensor(0.75, device=DEVICE), torch.tensor(1.5, device=DEVICE)
    got = straight_through_grad(grad_q, x, codes, grad_commitment, grad_loss, 0.25)
    want = straight_through_grad_reference(grad_q, x, codes, grad_commitment, grad_loss, 0.25)
    assert got.dtype == dtype and got.shape == x.shape
    # Both compute in fp32 and round once; the interpreter's rounding to bf16 can differ by a unit
    # in the last place (it truncates).
    ulp = {torch.float32: 1e-6, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    torch.testing.assert_close(got, want, rtol=ulp, atol=1e-7)


def test_straight_through_grad_takes_any_strides_and_empty_inputs():
    x = torch.randn(33, 5, device=DEVICE)
    codes = torch.randn(5, 33, device=DEVICE).t()  # transposed view
    grad_q = torch.ones((), device=DEVICE).expand(33, 5)  # sum()'s gradient: stride 0
    one = torch.ones((), device=DEVICE)
    torch.testing.assert_close(straight_through_grad(grad_q, x, codes, one, one, 2.0),
                               straight_through_grad_reference(grad_q, x, codes, one, one, 2.0))
    empty = torch.empty(0, 5, device=DEVICE)
    assert straight_through_grad(empty, empty, empty, one, one, 1.0).shape == (0, 5)
    with pytest.raises(ValueError, match="shapes differ"):
        straight_through_grad(x, x, codes[:-1], one, one, 1.0)


@pytest.mark.parametrize("present", ["commitment", "loss", "neither"])
def test_straight_through_grad_counts_an_absent_scalar_gradient_as_zero(present):
    """Autograd leaves an unused output's gradient as None (the layer does not materialise it)."""
    g = torch.Generator().manual_seed(3)
    x, codes, grad_q = (torch.randn(29, 7, generator=g).to(DEVICE) for _ in range(3))
    gc = torch.tensor(0.5, device=DEVICE) if present == "commitment" else None
    gl = torch.tensor(1.5, device=DEVICE) if present == "loss" else None
    zero = torch.zeros((), device=DEVICE)
    want = straight_through_grad_reference(grad_q, x, codes, zero if gc is None else gc, zero if gl is None else gl,
                                           0.25)
    for fn in (straight_through_grad, straight_through_grad_reference):
        torch.testing.assert_close(fn(grad_q, x, codes, gc, gl, 0.25), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n, d, k", [(1, 1, 1), (7, 3, 7), (1001, 17, 1000), (33, 129, 7), (9, 300, 5)])
def test_gather_codes_matches_reference(n, d, k, dtype):
    g = torch.Generator().manual_seed(n * 7 + d)
    codebook = torch.randn(k, d, generator=g).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    total = torch.tensor(123.456, device=DEVICE)
    got = gather_codes(labels, codebook, dtype, total, 1.0 / (n * d), 0.25)
    want = gather_codes_reference(labels, codebook, dtype, total, 1.0 / (n * d), 0.25)
    assert got[0].dtype == dtype and got[0].shape == (n, d) and got[1].dtype == torch.float32
    assert (got[1] is got[0]) == (dtype == torch.float32)
    assert torch.equal(got[1], want[1])  # a copy: exact
    # The interpreter's rounding to bf16 can differ by a unit in the last place (it truncates).
    ulp = {torch.float32: 0.0, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    torch.testing.assert_close(got[0], want[0], rtol=ulp, atol=0)
    for a, b in zip(got[2:], want[2:]):
        assert a.shape == () and a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-7, atol=0)


def test_gather_codes_rejects_other_shapes():
    codebook, total = torch.randn(5, 3, device=DEVICE), torch.zeros((), device=DEVICE)
    with pytest.raises(ValueError, match="float32 codebook"):
        gather_codes(torch.zeros(4, 1, dtype=torch.int64, device=DEVICE), codebook, torch.float32, total, 1.0, 1.0)
    with pytest.raises(ValueError, match="float32 codebook"):
        gather_codes(torch.zeros(4, dtype=torch.int64, device=DEVICE), codebook.double(), torch.float32, total, 1.0, 1.0)
