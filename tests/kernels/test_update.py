"""triton_kernels/update.py (atomic and sorted-deterministic) against a float64 reference."""

import pytest
import torch
from torchkm._kernels.update import update, update_reference

from tests.kernels.conftest import DEVICE, ON_GPU


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_update_matches_reference(deterministic, d, k):
    g = torch.Generator().manual_seed(d * 7 + k)
    n = 301
    x = torch.randn(n, d, generator=g).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    w = torch.rand(n, generator=g).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    sums, counts = update(x, labels, k, sample_weight=w, offset=offset, deterministic=deterministic)
    ref_sums, ref_counts = update_reference(x, labels, k, sample_weight=w, offset=offset)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)


def test_row_scale_half_input_and_int32_labels():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 10, generator=g).half().to(DEVICE)
    labels = torch.randint(0, 4, (200,), generator=g).int().to(DEVICE)
    scale = torch.rand(200, generator=g).to(DEVICE) + 0.5
    for deterministic in (False, True):
        sums, counts = update(x, labels, 4, row_scale=scale, deterministic=deterministic)
        ref_sums, ref_counts = update_reference(x, labels, 4, row_scale=scale)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(counts, ref_counts)


def test_sorted_update_is_bit_identical_across_runs():
    n, d, k = (2_000_000, 64, 16) if ON_GPU else (500, 8, 3)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, d, generator=g).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    first = update(x, labels, k, deterministic=True)
    for _ in range(3):
        again = update(x, labels, k, deterministic=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_bad_arguments():
    x = torch.randn(10, 3, device=DEVICE)
    with pytest.raises(ValueError, match="labels"):
        update(x, torch.zeros(9, dtype=torch.int64, device=DEVICE), 2)
    with pytest.raises(ValueError, match="labels"):
        update(x, torch.zeros(10, device=DEVICE), 2, deterministic=True)
    with pytest.raises(ValueError, match="n_clusters"):
        update(x, torch.zeros(10, dtype=torch.int64, device=DEVICE), 0)
