"""triton_kernels/assign.py against its pure-torch reference (Triton interpreter on CPU, or a GPU)."""

import os

import pytest
import torch

from tests.helpers import assert_labels_match_except_near_ties

triton = pytest.importorskip("triton")
from torchkm._kernels.assign import assign, assign_reference  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
# The interpreter is slow: small blocks keep these tests to seconds.
BLOCKS = {} if ON_GPU else {"block_n": 32, "block_k": 32, "block_d": 16}


@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 100])
def test_assign_matches_reference_on_odd_shapes(d, k):
    g = torch.Generator().manual_seed(d * 1000 + k)
    n = 97  # not a multiple of any block
    x = torch.randn(n, d, generator=g).to(DEVICE)
    c = torch.randn(k, d, generator=g).to(DEVICE)
    labels, best, second = assign(x, c, with_second=True, **BLOCKS)
    ref_labels, ref_best, ref_second = assign_reference(x.cpu(), c.cpu())
    xs, cs = x.cpu().double().numpy(), c.cpu().double().numpy()
    assert_labels_match_except_near_ties(xs, cs, labels.cpu().numpy(), ref_labels.numpy())
    scale = 1e-5 * (x.cpu().double().pow(2).sum(1) + c.cpu().double().pow(2).sum(1).max())
    assert torch.all((best.cpu().double() - ref_best).abs() <= scale)
    finite = torch.isfinite(ref_second)
    assert torch.all((second.cpu().double()[finite] - ref_second[finite]).abs() <= scale[finite])
    assert torch.all(torch.isinf(second.cpu()[~finite]))


def test_ties_break_to_the_lowest_index_across_tiles():
    # Centroid 3 and centroid 40 (another tile) are identical: every row must pick 3.
    c = torch.randn(64, 8)
    c[40] = c[3]
    x = c[3].repeat(50, 1) + 0.0
    labels, _, _ = assign(x.to(DEVICE), c.to(DEVICE), **BLOCKS)
    assert labels.cpu().tolist() == [3] * 50


INTERPRETER_BF16 = pytest.mark.skipif(
    not ON_GPU, reason="Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584); runs on GPU"
)


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=INTERPRETER_BF16)])
def test_half_precision_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(61, 24, generator=g).to(dtype)
    c = torch.randn(9, 24, generator=g)
    labels, best, _ = assign(x.to(DEVICE), c.to(DEVICE), **BLOCKS)
    ref_labels, ref_best, _ = assign_reference(x, c)
    agree = (labels.cpu() == ref_labels).float().mean()
    assert agree >= 0.95  # products of rounded inputs accumulate in fp32; near-ties may flip
    torch.testing.assert_close(best.cpu().double(), ref_best, rtol=2e-2, atol=2e-1)


def test_strided_input_and_bad_arguments():
    x = torch.randn(40, 20)[:, ::2].to(DEVICE)  # non-contiguous view
    c = torch.randn(5, 10).to(DEVICE)
    labels, _, second = assign(x, c, **BLOCKS)
    assert second is None
    assert torch.equal(labels.cpu(), assign_reference(x.cpu(), c.cpu())[0])
    with pytest.raises(ValueError, match="expected x"):
        assign(x, torch.randn(5, 11).to(DEVICE))
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        assign(x.double(), c)
    with pytest.raises(ValueError, match="input_precision"):
        assign(x, c, input_precision="fp8")
