"""triton_kernels/distances.py against a float64 reference."""

import pytest
import torch
from torchkm._kernels.distances import (
    labelled_sq_distances,
    labelled_sq_distances_reference,
    sq_distances,
    sq_distances_reference,
)

from tests.kernels.conftest import DEVICE


@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("m", [1, 7])
def test_sq_distances_match_reference(d, m):
    g = torch.Generator().manual_seed(d + 100 * m)
    x = (torch.randn(131, d, generator=g) + 100).to(DEVICE)  # far from the origin: no cancellation
    p = (torch.randn(m, d, generator=g) + 100).to(DEVICE)
    torch.testing.assert_close(sq_distances(x, p), sq_distances_reference(x, p), rtol=1e-5, atol=1e-4)
    offset = torch.full((d,), 100.0, device=DEVICE)
    scale = torch.rand(131, generator=g).to(DEVICE)
    got = sq_distances(x, p - 100, offset=offset, row_scale=scale)
    torch.testing.assert_close(got, sq_distances_reference(x, p - 100, offset=offset, row_scale=scale), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 1000])
@pytest.mark.parametrize("label_dtype", [torch.int32, torch.int64])
def test_labelled_sq_distances_match_reference(d, k, label_dtype):
    n = 131 if k < 1000 else 1031  # not a multiple of any block
    g = torch.Generator().manual_seed(d + 100 * k)
    x = (torch.randn(n, d, generator=g) + 100).to(DEVICE)
    c = (torch.randn(k, d, generator=g) + 100).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g).to(DEVICE, label_dtype)
    want = labelled_sq_distances_reference(x, c, labels)
    torch.testing.assert_close(labelled_sq_distances(x, c, labels), want, rtol=1e-5, atol=1e-4)
    offset = torch.full((d,), 100.0, device=DEVICE)
    scale = torch.rand(n, generator=g).to(DEVICE)
    got = labelled_sq_distances(x, c - 100, labels, offset=offset, row_scale=scale)
    want = labelled_sq_distances_reference(x, c - 100, labels, offset=offset, row_scale=scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_labelled_sq_distances_read_half_rows_and_strides(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(200, 2 * 33, generator=g).to(DEVICE, dtype)[:, ::2]  # a strided view
    c = torch.randn(9, 33, generator=g).to(DEVICE)
    labels = torch.randint(0, 9, (200,), generator=g).to(DEVICE)
    got = labelled_sq_distances(x, c, labels)
    torch.testing.assert_close(got, labelled_sq_distances_reference(x, c, labels), rtol=1e-5, atol=1e-4)


def test_labelled_sq_distances_reject_mismatched_shapes():
    x = torch.zeros(5, 3, device=DEVICE)
    with pytest.raises(ValueError, match="centroids"):
        labelled_sq_distances(x, torch.zeros(2, 4, device=DEVICE), torch.zeros(5, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="labels"):
        labelled_sq_distances(x, torch.zeros(2, 3, device=DEVICE), torch.zeros(4, dtype=torch.long, device=DEVICE))
    assert labelled_sq_distances(x[:0], torch.zeros(2, 3, device=DEVICE), torch.zeros(0, dtype=torch.long, device=DEVICE)).shape == (0,)
