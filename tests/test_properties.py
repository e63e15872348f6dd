"""Property-based checks over arbitrary small inputs, duplicates and exact ties included."""

import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchkm
from tests.helpers import f64_sq_distances


@st.composite
def problems(draw):
    n = draw(st.integers(1, 40))
    d = draw(st.integers(1, 5))
    k = draw(st.integers(1, n))
    # Small integer grids make duplicate rows and exact distance ties common.
    values = draw(st.lists(st.integers(-3, 3), min_size=n * d, max_size=n * d))
    x = np.array(values, dtype=np.float64).reshape(n, d)
    init = draw(st.sampled_from(["k-means++", "random"]))
    metric = draw(st.sampled_from(["euclidean", "cosine"]))
    weights = draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    return x, k, init, metric, weights


@settings(max_examples=150, deadline=None)
@given(problems(), st.integers(0, 2**31 - 1))
def test_any_input_gives_a_valid_consistent_result(problem, seed):
    x, k, init, metric, weights = problem
    if metric == "cosine":
        x[np.linalg.norm(x, axis=1) == 0] = 1.0
    w = None if weights is None else np.array(weights, dtype=np.float64)
    if w is not None and w.sum() == 0:
        w[0] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchkm.ConvergenceWarning)
        r = torchkm.fit(torch.from_numpy(x), k, init=init, metric=metric, sample_weight=w, random_state=seed)
    c = r.centroids.numpy()
    assert c.shape == (k, x.shape[1]) and np.isfinite(c).all()
    labels = r.labels.numpy()
    assert labels.min() >= 0 and labels.max() < k
    xs, cs = (x, c) if metric == "euclidean" else (x / np.linalg.norm(x, axis=1, keepdims=True), c)
    d = f64_sq_distances(xs, cs)
    # Labels are a nearest centroid (ties may pick any of the tied ones, up to rounding).
    assert np.all(d[np.arange(len(x)), labels] <= d.min(1) + 1e-9)
    per_row = d[np.arange(len(x)), labels] * (0.5 if metric == "cosine" else 1.0)
    expected = per_row.sum() if w is None else per_row @ w
    assert abs(r.inertia - expected) <= 1e-9 * max(1.0, expected)
