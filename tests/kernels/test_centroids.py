"""prepare_centroids / finish_update against their pure-torch references, on odd shapes."""

import pytest
import torch

from tests.kernels.conftest import DEVICE, ON_GPU
from torchkm._kernels.centroids import (
    finish_update,
    finish_update_reference,
    prepare_centroids,
    prepare_centroids_reference,
)

HALF = [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16]


@pytest.mark.parametrize("k,d", [(1, 1), (7, 3), (33, 17), (5, 129)])
@pytest.mark.parametrize("x_dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("mode", ["exact", "fast", "reference"])
def test_prepare_matches_reference(k, d, x_dtype, mode):
    g = torch.Generator().manual_seed(k * 100 + d)
    c = (torch.randn(k, d, generator=g) * 3).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    fast, exact = mode != "reference", mode != "fast"
    split = mode == "exact" and x_dtype == torch.bfloat16
    zero_f32 = torch.full((2500,), 7.0, device=DEVICE)
    zero_i32 = torch.full((3,), 7, dtype=torch.int32, device=DEVICE)
    zero_f64 = torch.full((4,), 7.0, dtype=torch.float64, device=DEVICE)
    got = prepare_centroids(c, offset, x_dtype, fast=fast, split=split, exact=exact, zero=(zero_f32, zero_i32, zero_f64))
    want = prepare_centroids_reference(c, offset, x_dtype, fast=fast, split=split, exact=exact)
    for name, g_, w_ in zip(got._fields, got, want):
        assert g_.dtype == w_.dtype, name
        # Bias sums run in float64 either way; only their last fp32 rounding may differ.
        torch.testing.assert_close(g_.float(), w_.float(), rtol=1e-6, atol=1e-6, msg=name)
    assert not zero_f32.any() and not zero_i32.any() and not zero_f64.any()


@pytest.mark.parametrize("k,d,replicas", [(1, 1, 1), (7, 3, 4), (40, 17, 1), (5, 129, 2)])
@pytest.mark.parametrize("normalize", [False, True])
def test_finish_matches_reference(k, d, replicas, normalize):
    g = torch.Generator().manual_seed(k + d)
    acc_sums = torch.randn(replicas, k, d, generator=g).to(DEVICE)
    acc_counts = torch.randint(0, 3, (replicas, k), generator=g).float().to(DEVICE)
    acc_counts[:, 0] = 0  # an empty cluster keeps its centroid
    c = torch.randn(k, d, generator=g).to(DEVICE)
    if normalize:
        c = c / c.norm(dim=1, keepdim=True)
    # Partials over several of the programs that sum them (4,096 each).
    part_inertia = torch.rand(9000, generator=g).to(DEVICE)
    part_changed = torch.randint(0, 50, (9000,), generator=g).to(DEVICE)
    new_want, sums_want, counts_want, stats_want = finish_update_reference(
        acc_sums, acc_counts, c, part_inertia, part_changed, normalize=normalize)
    centroids = c.clone()
    old = torch.empty_like(c)
    sums, counts = torch.empty(k, d, device=DEVICE), torch.empty(k, device=DEVICE)
    stats = torch.zeros(4, dtype=torch.float64, device=DEVICE)
    finish_update(acc_sums, acc_counts, centroids, part_inertia, part_changed, stats, normalize=normalize,
                  old_centroids=old, sums=sums, counts=counts)
    torch.testing.assert_close(centroids, new_want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(old, c)
    torch.testing.assert_close(sums, sums_want, rtol=1e-6, atol=1e-6)
    assert torch.equal(counts, counts_want)
    torch.testing.assert_close(stats, stats_want, rtol=1e-5, atol=1e-6)


def test_finish_does_nothing_while_frozen():
    c = torch.randn(4, 3, device=DEVICE)
    centroids = c.clone()
    stats = torch.zeros(4, dtype=torch.float64, device=DEVICE)
    control = torch.tensor([1, 8], dtype=torch.int32, device=DEVICE)
    finish_update(torch.ones(1, 4, 3, device=DEVICE), torch.ones(1, 4, device=DEVICE), centroids,
                  torch.ones(2, device=DEVICE), torch.ones(2, dtype=torch.int64, device=DEVICE), stats, normalize=False,
                  old_centroids=torch.empty_like(c), sums=torch.empty(4, 3, device=DEVICE),
                  counts=torch.empty(4, device=DEVICE), control=control)
    assert torch.equal(centroids, c) and not stats.any()
