"""triton_kernels/distances.py against a float64 reference."""

import pytest
import torch
from torchkm._kernels.distances import sq_distances, sq_distances_reference

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
