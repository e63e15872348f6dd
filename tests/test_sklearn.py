"""torchkm.sklearn.KMeans: a scikit-learn estimator that passes check_estimator."""

import numpy as np
import pytest

pytest.importorskip("sklearn")
from sklearn.base import clone
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

from torchkm.sklearn import KMeans


def test_check_estimator():
    # scikit-learn lists this same check as an expected failure for its own KMeans (the data are
    # shuffled and raw label ids are compared, which no randomly initialised k-means can pass);
    # test_integer_sample_weights_equal_repeated_rows checks the property itself.
    expected = {"check_sample_weight_equivalence_on_dense_data": "sample_weight is not equivalent to removing/repeating samples."}
    results = check_estimator(KMeans(device="cpu"), expected_failed_checks=expected, on_fail=None)
    failed = [(r["check_name"], repr(r["exception"])[:300]) for r in results if r["status"] == "failed"]
    assert not failed, failed
    assert sum(r["status"] == "passed" for r in results) >= 50


def test_pipeline_grid_search_and_clone():
    x = load_digits().data
    pipe = make_pipeline(StandardScaler(), KMeans(10, random_state=0, device="cpu"))
    labels = pipe.fit_predict(x)
    assert labels.shape == (len(x),) and labels.dtype == np.int64
    assert pipe.transform(x[:5]).shape == (5, 10)
    search = GridSearchCV(KMeans(random_state=0, device="cpu"), {"n_clusters": [5, 10]}, cv=2).fit(x)
    assert search.best_params_["n_clusters"] == 10  # score is -inertia, which falls as k grows
    params = clone(KMeans(7, metric="cosine")).get_params()
    assert params["n_clusters"] == 7 and params["metric"] == "cosine"


def test_takes_every_parameter_of_scikit_learns_kmeans():
    # A drop-in: any keyword scikit-learn's KMeans takes is accepted (device and metric are extras).
    assert set(SkKMeans().get_params()) - set(KMeans().get_params()) == set()
    x = load_digits().data
    before = x.copy()
    KMeans(10, copy_x=False, random_state=0, device="cpu").fit(x)
    np.testing.assert_array_equal(x, before)  # torchkm never writes to X, copy_x or not


def test_n_init_defaults_to_auto_as_scikit_learns():
    # Modern scikit-learn code passes n_init="auto" (its default): a drop-in must take it.
    x = load_digits().data
    assert KMeans().get_params()["n_init"] == SkKMeans().get_params()["n_init"] == "auto"
    once = KMeans(10, n_init="auto", random_state=0, device="cpu").fit(x)
    assert once.inertia_ == KMeans(10, n_init=1, random_state=0, device="cpu").fit(x).inertia_
    rand = KMeans(10, init="random", n_init="auto", random_state=0, device="cpu").fit(x)
    assert rand.inertia_ == KMeans(10, init="random", n_init=10, random_state=0, device="cpu").fit(x).inertia_


def test_callable_init_with_scikit_learns_signature():
    x = load_digits().data

    def first_rows(X, n_clusters, random_state):
        assert isinstance(X, np.ndarray) and isinstance(random_state, np.random.RandomState)
        # A copy: scikit-learn would update a view's rows in place, moving X's own first rows.
        return X[:n_clusters].copy()

    ours = KMeans(10, init=first_rows, n_init=1, max_iter=20, tol=0, device="cpu").fit(x)
    theirs = SkKMeans(10, init=first_rows, n_init=1, max_iter=20, tol=0, algorithm="lloyd").fit(x)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-7)
    # One that draws from its random_state, as scikit-learn's examples do.
    drawn = KMeans(10, init=lambda X, k, random_state: X[random_state.choice(len(X), k, replace=False)],
                   random_state=0, device="cpu").fit(x)
    assert drawn.cluster_centers_.shape == (10, 64) and np.isfinite(drawn.inertia_)


def test_matches_scikit_learn_from_the_same_init():
    x = load_digits().data
    init = x[:10]
    ours = KMeans(10, init=init, max_iter=20, tol=0, device="cpu").fit(x)
    theirs = SkKMeans(10, init=init, n_init=1, max_iter=20, tol=0, algorithm="lloyd").fit(x)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-7, atol=1e-7)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-7)
    assert (ours.labels_ == theirs.labels_).all()
    assert ours.score(x) == pytest.approx(theirs.score(x), rel=1e-7)
