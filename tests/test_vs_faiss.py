"""torchkm against faiss-cpu (the reference users trust) on real and synthetic data."""

import numpy as np
import pytest
import torch

import torchkm
from tests.helpers import assert_labels_match_except_near_ties, blobs, f64_sq_distances

faiss = pytest.importorskip("faiss")
datasets = pytest.importorskip("sklearn.datasets")


def _real(name):
    loader = {"digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer,
              "wine": datasets.load_wine, "iris": datasets.load_iris}[name]
    return np.ascontiguousarray(loader().data, dtype=np.float32)


def _synthetic(name):
    rng = np.random.default_rng(7)
    if name == "blobs":
        return blobs(rng, 5000, 16, 20)
    if name == "gaussian":
        return rng.standard_normal((4000, 33)).astype(np.float32)
    raise KeyError(name)


DATASETS = {
    "digits": (lambda: _real("digits"), 10),
    "breast_cancer": (lambda: _real("breast_cancer"), 8),
    "wine": (lambda: _real("wine"), 3),
    "iris": (lambda: _real("iris"), 3),
    "blobs": (lambda: _synthetic("blobs"), 20),
    "gaussian": (lambda: _synthetic("gaussian"), 50),
}
REAL = ["digits", "breast_cancer", "wine", "iris"]


def _faiss_kmeans(x, k, niter, init=None, seed=1234):
    km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, max_points_per_centroid=10**7, min_points_per_centroid=1)
    km.train(x, init_centroids=init)
    return km


def _inertia64(x, c):
    return f64_sq_distances(x, c).min(1).sum()


@pytest.mark.parametrize("shift", [0.0, 0.01], ids=["rows", "shifted"])
@pytest.mark.parametrize("name", list(DATASETS))
def test_same_centroids_give_the_same_labels(name, shift):
    # Centroids equal to data rows give the exact ties that integer-valued real data is full of.
    x, k = DATASETS[name][0](), DATASETS[name][1]
    c = x[np.random.default_rng(0).choice(len(x), k, replace=False)] + np.float32(shift)
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(c)
    _, faiss_labels = index.search(x, 1)
    labels, dist = torchkm.assign(torch.from_numpy(x), torch.from_numpy(c))
    n_ties = assert_labels_match_except_near_ties(x, c, labels.numpy(), faiss_labels[:, 0])
    print(f"{name} shift={shift}: {n_ties} of {len(x)} labels differ from faiss, all near-ties")
    np.testing.assert_allclose(dist.numpy(), f64_sq_distances(x, c).min(1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", list(DATASETS))
def test_same_labels_give_the_same_centroids(name):
    x, k = DATASETS[name][0](), DATASETS[name][1]
    c0 = x[np.random.default_rng(1).choice(len(x), k, replace=False)]
    one_step = _faiss_kmeans(x, k, niter=1, init=c0.copy())
    index = faiss.IndexFlatL2(x.shape[1])
    index.add(c0)
    _, faiss_labels = index.search(x, 1)
    ours = torchkm.update(torch.from_numpy(x), torch.from_numpy(faiss_labels[:, 0]), torch.from_numpy(c0))
    np.testing.assert_allclose(ours.numpy(), one_step.centroids, rtol=1e-5, atol=1e-5 * np.abs(x).max())


@pytest.mark.parametrize("name", list(DATASETS))
def test_ten_iterations_from_the_same_init_reach_the_same_inertia(name):
    x, k = DATASETS[name][0](), DATASETS[name][1]
    c0 = x[np.random.default_rng(2).choice(len(x), k, replace=False)]
    theirs = _faiss_kmeans(x, k, niter=10, init=c0.copy())
    ours = torchkm.fit(torch.from_numpy(x), k, init=c0, max_iter=10, tol=0.0)
    ours_inertia, faiss_inertia = _inertia64(x, ours.centroids.numpy()), _inertia64(x, theirs.centroids)
    print(f"{name}: inertia after 10 iterations torchkm {ours_inertia:.6g} faiss {faiss_inertia:.6g}")
    assert ours_inertia == pytest.approx(faiss_inertia, rel=1e-3)


@pytest.mark.parametrize("name", REAL)
def test_own_init_is_no_worse_than_faiss_on_real_data(name):
    x, k = DATASETS[name][0](), DATASETS[name][1]
    # Each library with its defaults (faiss: random init, 25 iterations; torchkm: k-means++), three seeds.
    ours = np.mean([torchkm.fit(torch.from_numpy(x), k, random_state=s).inertia for s in range(3)])
    theirs = np.mean([_inertia64(x, _faiss_kmeans(x, k, niter=25, seed=s).centroids) for s in range(3)])
    print(f"{name}: mean inertia torchkm {ours:.6g} faiss {theirs:.6g}")
    assert ours <= theirs * 1.01
