"""torchkm against a textbook float64 Lloyd in numpy, including data far from the origin."""

import numpy as np
import pytest
import torch

import torchkm
from tests.helpers import assert_labels_match_except_near_ties, blobs, numpy_lloyd


@pytest.mark.parametrize("offset", [0.0, 1e4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lloyd_matches_float64_numpy(rng, offset, dtype):
    x = blobs(rng, 1500, 6, 8, spread=10.0, sigma=1.0, offset=offset, dtype=dtype)
    c0 = x[rng.choice(len(x), 8, replace=False)]
    c_ref, labels_ref, inertia_ref = numpy_lloyd(x, c0, n_iter=15)
    ours = torchkm.fit(torch.from_numpy(x), 8, init=c0, max_iter=15, tol=0.0)
    # fp32 centroids near 1e4 are stored with ~1e-3 absolute resolution.
    atol = 1e-9 if dtype == np.float64 else 4 * np.finfo(np.float32).eps * max(1.0, abs(offset)) * 10
    np.testing.assert_allclose(ours.centroids.numpy(), c_ref, rtol=0, atol=atol)
    assert_labels_match_except_near_ties(x, c_ref, ours.labels.numpy(), labels_ref)
    assert ours.inertia == pytest.approx(inertia_ref, rel=1e-5 if dtype == np.float32 else 1e-10)


def test_far_from_origin_would_break_without_centering(rng):
    # Sanity check of the test above: without centering, fp32 distances at 1e4 lose the clusters.
    x = blobs(rng, 1500, 6, 8, offset=1e4)
    c = torch.from_numpy(x[:8])
    xt = torch.from_numpy(x)
    naive = (-2 * xt @ c.T + (c * c).sum(1)).argmin(1)
    exact = ((x[:, None, :].astype(np.float64) - x[None, :8].astype(np.float64)) ** 2).sum(-1).argmin(1)
    assert (naive.numpy() != exact).mean() > 0.01
    labels, _ = torchkm.assign(xt, c)
    assert (labels.numpy() != exact).mean() < 1e-3
