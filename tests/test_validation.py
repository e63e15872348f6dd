"""Every bad input gets a ValueError/TypeError that names the problem and the offending value."""

import numpy as np
import pytest
import torch

import torchkm

X = torch.randn(20, 3)


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), ValueError, r"non-finite.*1 NaN.*first bad row 0"),
        (torch.tensor([[1.0, 2.0], [float("inf"), 1.0]]), ValueError, r"non-finite.*1 Inf.*first bad row 1"),
        (torch.empty(0, 3), ValueError, r"empty: shape \(0, 3\)"),
        (torch.empty(5, 0), ValueError, r"empty: shape \(5, 0\)"),
        (torch.randn(10), ValueError, r"2-D.*got 1-D shape \(10,\).*reshape\(-1, 1\)"),
        (torch.randn(2, 3, 4), ValueError, r"2-D.*got 3-D shape \(2, 3, 4\)"),
        (torch.randint(0, 5, (10, 2)), TypeError, r"dtype torch.int64.*float"),
        (torch.ones(10, 2, dtype=torch.bool), TypeError, r"dtype torch.bool"),
        (torch.randn(10, 2, dtype=torch.complex64), TypeError, r"complex"),
        (np.ones((10, 2), dtype=np.int32), TypeError, r"dtype int32"),
        (np.ones((10, 2), dtype=np.complex128), TypeError, r"complex"),
        ([[1.0, 2.0], [3.0, 4.0]], TypeError, r"torch.Tensor or a numpy.ndarray, got list"),
    ],
)
def test_bad_data(x, error, match):
    with pytest.raises(error, match=match):
        torchkm.fit(x, 1)
    with pytest.raises(error, match=match):
        torchkm.KMeans(1).fit(x)


@pytest.mark.parametrize(
    "k, error, match",
    [
        (0, ValueError, "n_clusters must be >= 1, got 0"),
        (-3, ValueError, "n_clusters must be >= 1, got -3"),
        (21, ValueError, "n_clusters=21 is larger than n_samples=20"),
        (2.5, TypeError, "n_clusters must be an int, got 2.5"),
        (True, TypeError, "n_clusters must be an int"),
    ],
)
def test_bad_n_clusters(k, error, match):
    with pytest.raises(error, match=match):
        torchkm.fit(X, k)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"init": "kmeans++"}, ValueError, r"init must be one of \('auto', 'k-means\+\+', 'random', 'k-means\|\|'\).*'kmeans\+\+'"),
        ({"init": torch.randn(3, 3)}, ValueError, r"init has 3 rows but n_clusters=2.*got \(3, 3\)"),
        ({"init": torch.randn(2, 4)}, ValueError, r"init has 4 features but x has 3"),
        ({"init": torch.randn(2)}, ValueError, r"init must be 2-D"),
        ({"init": 5}, TypeError, r"init must be a string"),
        ({"n_init": 0}, ValueError, "n_init must be >= 1, got 0"),
        ({"max_iter": 0}, ValueError, "max_iter must be >= 1, got 0"),
        ({"tol": -1.0}, ValueError, r"tol must be a finite number >= 0, got -1.0"),
        ({"metric": "manhattan"}, ValueError, r"metric must be one of \('euclidean', 'cosine'\), got 'manhattan'"),
        ({"n_init": "best"}, TypeError, "n_init must be an int or 'auto', got 'best'"),
        ({"random_state": "seed"}, TypeError, "random_state must be None, an int, a torch.Generator or a numpy"),
        ({"random_state": -1}, ValueError, "random_state must be >= 0"),
        ({"sample_weight": -torch.ones(20)}, ValueError, r"sample_weight must be >= 0; 20 negative values, first at index 0"),
        ({"sample_weight": torch.ones(19)}, ValueError, r"sample_weight must have shape \(20,\).*got shape \(19,\)"),
        ({"sample_weight": torch.ones(20, 1)}, ValueError, r"sample_weight must have shape \(20,\)"),
        ({"sample_weight": torch.zeros(20)}, ValueError, "sample_weight sums to 0"),
        ({"sample_weight": torch.full((20,), float("nan"))}, ValueError, "sample_weight contains NaN"),
    ],
)
def test_bad_parameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        torchkm.fit(X, 2, **kwargs)


def test_device_names_and_missing_gpus_get_clear_errors():
    with pytest.raises(ValueError, match="device must be a torch.device or a name such as 'cpu' or 'cuda:0', got 'gpu'"):
        torchkm.fit(X, 2, device="gpu")
    if torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=r"device='cuda:\d+', but only \d+ CUDA device\(s\) are visible"):
            torchkm.fit(X, 2, device=f"cuda:{torch.cuda.device_count()}")
        return
    # torch's own error here is an AssertionError from the first copy to the GPU.
    for fit in (lambda: torchkm.fit(X, 2, device="cuda"), lambda: torchkm.KMeans(2, device="cuda:0").fit(X)):
        with pytest.raises(RuntimeError, match=r"device='cuda(:0)?' needs a CUDA GPU; this torch .* Pass device='cpu'"):
            fit()


def test_module_parameters_are_checked_at_construction():
    with pytest.raises(ValueError, match="n_clusters must be >= 1"):
        torchkm.KMeans(0)
    with pytest.raises(ValueError, match="metric must be one of"):
        torchkm.KMeans(2, metric="l1")


def test_predict_before_fit_and_with_wrong_features():
    km = torchkm.KMeans(2)
    for method in (km.predict, km.transform, km.score):
        with pytest.raises(torchkm.NotFittedError, match=r"not fitted yet; call \.fit\(x\)"):
            method(X)
    with pytest.raises(AttributeError, match="not fitted"):
        km.cluster_centers_
    km.fit(X)
    with pytest.raises(ValueError, match="x has 4 features, but this KMeans was fitted on 3"):
        km.predict(torch.randn(5, 4))
    with pytest.raises(ValueError, match="non-finite"):
        km.predict(torch.tensor([[float("nan"), 0.0, 0.0]]))


def test_assign_checks_centroids_and_devices():
    with pytest.raises(ValueError, match="x has 3 features but the centroids have 2"):
        torchkm.assign(X, torch.randn(4, 2))
    with pytest.raises(ValueError, match="centroids.*non-finite"):
        torchkm.assign(X, torch.tensor([[float("inf"), 0.0, 0.0]]))
    meta = torch.randn(4, 3, device="meta")
    with pytest.raises(ValueError, match="x is on cpu but the centroids are on meta"):
        torchkm.functional._checked_query(X, meta, "euclidean")


def test_assign_skips_the_finite_scan_only_when_asked():
    x = X.clone()
    x[4, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains non-finite"):
        torchkm.assign(x, X[:3])
    labels, _ = torchkm.assign(x, X[:3], check_finite=False)  # the caller vouches for x: no error, no sync
    assert labels.shape == (20,)
    assert torch.equal(labels[:4], torchkm.assign(X[:4], X[:3])[0])


def test_empty_cache_frees_the_kept_passes(kernels):
    from torchkm._kernels import assign as assign_module

    x = X.cuda() if torch.cuda.is_available() else X  # (the kernels take CPU tensors only when interpreted)
    torchkm.assign(x, x[:3])
    assert assign_module._reused_passes()
    torchkm.empty_cache()
    assert not assign_module._reused_passes()
    torchkm.assign(x, x[:3])  # and later calls build theirs again
    assert assign_module._reused_passes()


def test_cosine_rejects_zero_rows():
    x = X.clone()
    x[7] = 0
    with pytest.raises(ValueError, match="1 all-zero rows.*index 7"):
        torchkm.fit(x, 2, metric="cosine")
    km = torchkm.KMeans(2, metric="cosine", random_state=0).fit(X)
    with pytest.raises(ValueError, match="1 all-zero rows.*index 7"):
        km.predict(x)
