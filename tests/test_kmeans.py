"""torchkm.KMeans and torchkm.fit: the public API on CPU tensors and numpy arrays."""

import io
import pickle
import warnings

import numpy as np
import pytest
import torch

import torchkm
from tests.helpers import blobs, f64_sq_distances


@pytest.fixture
def data(rng):
    return torch.from_numpy(blobs(rng, 2000, 8, 6))


def test_fit_finds_separated_blobs(rng):
    x = blobs(rng, 3000, 5, 4, spread=100.0, sigma=0.5)
    result = torchkm.fit(torch.from_numpy(x), 4, random_state=0)
    assert isinstance(result, torchkm.KMeansResult)
    assert result.centroids.shape == (4, 5) and result.labels.shape == (3000,)
    assert result.converged and 1 <= result.n_iter <= 300
    # Every centroid sits within noise of a true centre: k-means++ found all four blobs.
    assert len(torch.unique(result.labels)) == 4
    assert result.inertia / 3000 < 5 * 0.5**2 * 2


def test_module_api_and_fitted_attributes(data):
    km = torchkm.KMeans(6, random_state=0)
    assert isinstance(km, torch.nn.Module)
    assert km.fit(data) is km
    assert km.cluster_centers_.shape == (6, 8) and km.cluster_centers_.dtype == torch.float32
    assert km.labels_.dtype == torch.int64 and km.labels_.shape == (2000,)
    assert km.n_features_in_ == 8 and km.n_iter_ == len(km.history_) and km.converged_
    # Labels match the returned centroids (final E-step).
    assert torch.equal(km.predict(data), km.labels_)
    assert torch.equal(km(data), km.labels_)
    np.testing.assert_allclose(km.score(data), -km.inertia_, rtol=1e-5)
    d = km.transform(data[:10])
    assert d.shape == (10, 6)
    np.testing.assert_allclose(d.numpy(), np.sqrt(f64_sq_distances(data[:10].numpy(), km.cluster_centers_.numpy())), rtol=1e-4, atol=1e-4)
    assert torch.equal(torchkm.KMeans(6, random_state=0).fit_predict(data), km.labels_)


def test_history_records_every_iteration(data):
    km = torchkm.KMeans(6, random_state=1, max_iter=50).fit(data)
    h = km.history_
    assert [s.iteration for s in h] == list(range(1, len(h) + 1))
    assert h[0].labels_changed == 2000
    assert all(s.seconds >= 0 and s.center_shift >= 0 and s.empty_clusters >= 0 for s in h)
    # Lloyd never increases the objective.
    inertias = [s.inertia for s in h] + [km.inertia_]
    assert all(b <= a * (1 + 1e-6) for a, b in zip(inertias, inertias[1:]))


def test_same_seed_same_result_and_torch_manual_seed(data):
    a = torchkm.fit(data, 6, random_state=7)
    b = torchkm.fit(data, 6, random_state=7)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.labels, b.labels)
    torch.manual_seed(3)
    c = torchkm.fit(data, 6, init="random")
    torch.manual_seed(3)
    d = torchkm.fit(data, 6, init="random")
    assert torch.equal(c.centroids, d.centroids)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(torchkm.fit(data, 6, random_state=g1).centroids, torchkm.fit(data, 6, random_state=g2).centroids)


def test_n_init_keeps_the_best_run(rng):
    x = torch.from_numpy(rng.standard_normal((1500, 4)).astype(np.float32))
    singles = [torchkm.fit(x, 20, init="random", random_state=s).inertia for s in range(3)]
    best = torchkm.fit(x, 20, init="random", n_init=5, random_state=0)
    assert best.inertia <= max(singles)
    assert best.inertia == pytest.approx(min(best.inertia, *singles), rel=0.05)


def test_n_init_auto_and_numpy_random_states_as_scikit_learn_takes_them(data):
    # n_init="auto": one run from a spreading seeding or given centroids, ten from random rows.
    assert torchkm.KMeans(6, n_init="auto").n_init == 1
    assert torchkm.KMeans(6, init="random", n_init="auto").n_init == 10
    assert torchkm.KMeans(6, init=data[:6], n_init="auto").n_init == 1
    auto = torchkm.fit(data, 6, init="random", n_init="auto", random_state=0)
    ten = torchkm.fit(data, 6, init="random", n_init=10, random_state=0)
    assert torch.equal(auto.centroids, ten.centroids)
    # A numpy RandomState or Generator seeds the fit, and is advanced by it, as scikit-learn's are.
    for make in (np.random.RandomState, np.random.default_rng):
        a, b = make(4), make(4)
        first = torchkm.fit(data, 6, random_state=a)
        assert torch.equal(first.centroids, torchkm.fit(data, 6, random_state=b).centroids)
        assert torch.equal(torchkm.fit(data, 6, random_state=a).centroids, torchkm.fit(data, 6, random_state=b).centroids)
        draw = (lambda r: r.randint(1 << 30)) if make is np.random.RandomState else (lambda r: r.integers(1 << 30))
        assert draw(a) != draw(make(4))  # ``a`` moved on by its two fits


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_init_methods_and_given_centroids(data, init):
    r = torchkm.fit(data, 6, init=init, random_state=0)
    assert torch.isfinite(r.centroids).all()
    given = data[:6].clone()
    a = torchkm.fit(data, 6, init=given, max_iter=1)
    b = torchkm.fit(data.numpy(), 6, init=given.numpy(), max_iter=1)
    torch.testing.assert_close(a.centroids, b.centroids)
    with pytest.warns(RuntimeWarning, match="n_init=3"):
        torchkm.fit(data, 6, init=given, n_init=3)
    called = {}

    def my_init(x, k, seed):
        called["args"] = (x.shape, k, type(seed))
        return x[:k]

    torchkm.fit(data, 6, init=my_init, random_state=0)
    assert called["args"] == ((2000, 8), 6, int)


def test_kmeans_plusplus_is_weighted_like_repeated_rows(rng):
    x = rng.standard_normal((40, 3)).astype(np.float32)
    w = rng.integers(0, 4, size=40)
    repeated = np.repeat(x, w, axis=0)
    a = torchkm.fit(torch.from_numpy(x), 5, sample_weight=torch.from_numpy(w.astype(np.float32)), random_state=3, max_iter=1)
    b = torchkm.fit(torch.from_numpy(repeated), 5, random_state=3, max_iter=1)
    torch.testing.assert_close(a.centroids, b.centroids)


def test_integer_sample_weights_equal_repeated_rows(rng):
    x = blobs(rng, 300, 4, 5)
    w = rng.integers(0, 4, size=300)
    init = x[w > 0][:5]
    weighted = torchkm.fit(torch.from_numpy(x), 5, init=init, sample_weight=w.astype(np.float64), max_iter=30, tol=0)
    repeated = torchkm.fit(torch.from_numpy(np.repeat(x, w, axis=0)), 5, init=init, max_iter=30, tol=0)
    torch.testing.assert_close(weighted.centroids, repeated.centroids, rtol=1e-5, atol=1e-5)
    assert weighted.inertia == pytest.approx(repeated.inertia, rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_input_dtypes(data, dtype):
    x = data.to(dtype)
    km = torchkm.KMeans(6, random_state=0).fit(x)
    expected = torch.float64 if dtype == torch.float64 else torch.float32
    assert km.cluster_centers_.dtype == expected
    assert km.predict(x).dtype == torch.int64
    assert torch.isfinite(km.cluster_centers_).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
def test_half_rows_centroids_are_their_float64_means(dtype, weighted):
    """16-bit rows are centred on an offset on a coarse grid (``_loop.coarse_offset``): centred on
    their float32 mean, equal rows rounded alike and a cluster's mean came out 5e-7 off (here)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(200_000, 8, generator=gen) * 0.3 + 0.01).to(dtype)
    w = torch.ones(200_000, dtype=torch.float64) if weighted else None
    result = torchkm.fit(x, 1, init=x[:1], max_iter=2, sample_weight=w)
    mean = x.double().mean(0)
    assert float((result.centroids.double() - mean).abs().max() / mean.abs().max()) < 1.5e-7


def test_coarse_offset_centres_half_rows_exactly():
    from torchkm._loop import coarse_offset

    gen = torch.Generator().manual_seed(1)
    for scale, shift in [(1.0, 0.0), (0.01, 3.0), (300.0, -1e4)]:
        x = (torch.randn(10_000, 5, generator=gen) * scale + shift).to(torch.bfloat16)
        mean = x.double().mean(0).float()
        offset = coarse_offset(mean, float(x.double().var(0).mean()), x.dtype)
        assert float((offset - mean).abs().max()) <= scale / 256
        big = x.float().abs() >= scale / 2
        assert torch.equal((x.float() - offset).double()[big], (x.double() - offset.double())[big])
        if shift == 0.0:  # the float32 mean itself is not exact there
            assert not torch.equal((x.float() - mean).double()[big], (x.double() - mean.double())[big])
    assert coarse_offset(mean, 1.0, torch.float32) is mean


def test_numpy_input_and_noncontiguous_views(data):
    a = torchkm.fit(data.numpy(), 6, random_state=0)
    b = torchkm.fit(data, 6, random_state=0)
    assert torch.equal(a.labels, b.labels)
    wide = torch.zeros(2000, 16)
    wide[:, ::2] = data  # strided view with the same values
    view = wide[:, ::2]
    assert not view.is_contiguous()
    c = torchkm.fit(view, 6, random_state=0)
    assert torch.equal(c.labels, b.labels)
    transposed = data.T.contiguous().T
    assert torch.equal(torchkm.fit(transposed, 6, random_state=0).labels, b.labels)
    # Rows in the other byte order (a .npy from a big-endian machine) are read as their values.
    swapped = data.numpy().astype(">f4")
    assert torch.equal(torchkm.fit(swapped, 6, random_state=0).labels, b.labels)
    assert torch.equal(torchkm.KMeans(6, random_state=0).fit(swapped).predict(swapped), b.labels)


def _engine_device(engine: str, monkeypatch) -> str:
    """Where an ``engine`` case runs: "kernels" on CUDA tensors where there is a GPU (compiled
    kernels), else on CPU tensors through the Triton interpreter; "torch" on CPU tensors."""
    if engine == "kernels":
        if torch.cuda.is_available():
            return "cuda"
        monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    return "cpu"


@pytest.mark.parametrize("engine", ["torch", "kernels"])
def test_fit_takes_features_that_require_grad(rng, engine, monkeypatch):
    """Features straight out of a model require grad: the fit (not differentiable) takes them, as
    well as weights and initial centroids that do, returns nothing that does, and gives the labels
    of the same values detached. It had failed in k-means++ (``minimum(out=...)`` under autograd)."""
    device = _engine_device(engine, monkeypatch)
    x = torch.from_numpy(blobs(rng, 301, 7, 5)).to(device).requires_grad_()
    w = torch.rand(301, generator=torch.Generator().manual_seed(0)).add_(0.5).to(device).requires_grad_()
    init = x[:5].detach().clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kwargs in ({}, {"sample_weight": w}, {"init": init}):
            got = torchkm.fit(x, 5, random_state=0, **kwargs)
            detached = {key: value.detach() for key, value in kwargs.items()}
            want = torchkm.fit(x.detach(), 5, random_state=0, **detached)
            assert not got.centroids.requires_grad and not got.labels.requires_grad
            # (CUDA sums by atomics, in no fixed order: equal up to their rounding.)
            assert torch.equal(got.labels, want.labels)
            torch.testing.assert_close(got.centroids, want.centroids, rtol=1e-6, atol=1e-6)
            assert got.inertia == pytest.approx(want.inertia, rel=1e-6)
        km = torchkm.KMeans(5, random_state=0)
        plain = torchkm.fit(x.detach(), 5, random_state=0)
        assert torch.equal(km.fit_predict(x), plain.labels) and not km.cluster_centers_.requires_grad
        assert isinstance(km.score(x, sample_weight=w), float)
    assert x.grad is None and w.grad is None


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("engine", ["torch", "kernels"])
def test_distances_overflowing_float32_are_an_error_not_collapsed_clusters(rng, engine, monkeypatch):
    """Finite rows spread beyond about 1e19 overflow float32 squared distances: the fit had run all
    its iterations and returned one or two clusters with a warning about duplicate rows."""
    x = torch.from_numpy(blobs(rng, 301, 5, 4)).to(_engine_device(engine, monkeypatch)) * 1e20
    # (On CUDA the rows' moments overflow first, and say so.)
    with pytest.raises(ValueError, match=r"squared distances to their centroids overflow torch.float32 \(inertia (inf|nan)\)"
                       r"|squared deviations from the mean overflow torch.float32"):
        torchkm.fit(x, 4, random_state=0)
    wide = torchkm.fit(x.double(), 4, random_state=0)
    assert np.isfinite(wide.inertia) and len(torch.unique(wide.labels)) == 4


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("engine", ["torch", "kernels"])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_queries_whose_distances_overflow_float32_are_an_error_not_arbitrary_labels(rng, engine, metric, monkeypatch):
    """Finite rows near 1e20: assign had labelled every row 0 (each row is one of the centroids),
    distance inf; cosine, whose norms overflowed, 0 with distance 0."""
    x = torch.from_numpy(blobs(rng, 61, 5, 4)).float().to(_engine_device(engine, monkeypatch)) * 1e20
    c = x[:7].clone()
    km = torchkm.KMeans(7, metric=metric).fit(x[:40] * 1e-20)
    km.centroids.copy_(c)
    for query in (lambda: torchkm.assign(x, c, metric=metric), lambda: torchkm.transform(x, c, metric=metric),
                  lambda: km.predict(x), lambda: km.score(x)):
        with pytest.raises(ValueError, match=r"distances of x's rows to the centroids overflow torch.float32"):
            query()
    labels, _ = torchkm.assign(x.double(), c.double(), metric=metric)
    assert torch.equal(labels[:7].cpu(), torch.arange(7))
    # Large values that do not overflow are labelled as before, with no second read-back.
    labels, _ = torchkm.assign(x * 1e-4, c * 1e-4, metric=metric)
    assert torch.equal(labels[:7].cpu(), torch.arange(7))


def test_state_dict_round_trip_into_a_fresh_module(data):
    km = torchkm.KMeans(6, random_state=0).fit(data)
    buffer = io.BytesIO()
    torch.save(km.state_dict(), buffer)
    buffer.seek(0)
    fresh = torchkm.KMeans(6)
    with pytest.raises(torchkm.NotFittedError):
        fresh.predict(data)
    fresh.load_state_dict(torch.load(buffer, weights_only=False))
    assert torch.equal(fresh.cluster_centers_, km.cluster_centers_)
    assert fresh.inertia_ == km.inertia_ and fresh.n_iter_ == km.n_iter_
    assert torch.equal(fresh.predict(data), km.labels_)
    with pytest.raises(RuntimeError, match="n_clusters=5"):
        torchkm.KMeans(5).load_state_dict(km.state_dict())
    assert set(km.state_dict()) == {"centroids", "_extra_state"}


def test_to_half_and_pickle(data):
    km = torchkm.KMeans(6, random_state=0).fit(data)
    half = pickle.loads(pickle.dumps(km)).half()
    assert half.cluster_centers_.dtype == torch.float16
    agree = (half.predict(data) == km.labels_).float().mean()
    assert agree > 0.99  # fp16 centroids round; labels agree except near boundaries
    moved = km.to("cpu", torch.float64)
    assert moved.cluster_centers_.dtype == torch.float64


def test_cosine_metric_is_spherical_kmeans(rng):
    directions = rng.standard_normal((4, 10))
    x = np.concatenate([d + 0.05 * rng.standard_normal((200, 10)) for d in directions])
    x *= rng.uniform(0.1, 50, size=(len(x), 1))  # norms must not matter
    km = torchkm.KMeans(4, metric="cosine", random_state=0).fit(torch.from_numpy(x))
    norms = km.cluster_centers_.norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(4, dtype=norms.dtype))
    assert len(torch.unique(km.labels_)) == 4
    labels, dist = torchkm.assign(torch.from_numpy(x), km.cluster_centers_, metric="cosine")
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = xn @ km.cluster_centers_.numpy().T
    np.testing.assert_array_equal(labels.numpy(), cos.argmax(1))
    np.testing.assert_allclose(dist.numpy(), 1 - cos.max(1), atol=1e-10)
    assert km.inertia_ == pytest.approx(float((1 - cos.max(1)).sum()), rel=1e-6)


def test_empty_clusters_are_repaired_never_nan():
    # Init with a centroid far away from all data: it gets no points on the first pass.
    x = torch.cat([torch.randn(100, 2, generator=torch.Generator().manual_seed(0)), torch.randn(100, 2, generator=torch.Generator().manual_seed(1)) + 8])
    init = torch.tensor([[0.0, 0.0], [8.0, 8.0], [1000.0, 1000.0]])
    r = torchkm.fit(x, 3, init=init)
    assert torch.isfinite(r.centroids).all()
    assert r.history[0].empty_clusters == 1
    assert len(torch.unique(r.labels)) == 3


def test_fewer_distinct_points_than_clusters_warns_and_stays_valid():
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    with pytest.warns(torchkm.ConvergenceWarning, match="2 distinct clusters"):
        r = torchkm.fit(x, 4, random_state=0)
    assert torch.isfinite(r.centroids).all() and r.inertia == 0.0
    assert set(r.labels.tolist()) <= {0, 1, 2, 3}


def test_a_run_stopped_by_max_iter_with_an_empty_cluster_says_so():
    """The final labels of a run cut short may leave a cluster empty (its refill would have come at
    the next iteration): the warning names max_iter, not duplicate points; run on, it converges with
    every cluster filled."""
    x = torch.tensor([9.0, 9.0, 0.0, 1.0, 2.0, 3.0])[:, None]
    init = torch.tensor([0.5, 5.5, 5.5])[:, None]
    with pytest.warns(torchkm.ConvergenceWarning, match="2 distinct clusters.*max_iter=1"):
        r = torchkm.fit(x, 3, init=init, max_iter=1)
    assert not r.converged and torch.isfinite(r.centroids).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", torchkm.ConvergenceWarning)
        r = torchkm.fit(x, 3, init=init)
    assert r.converged and sorted(set(r.labels.tolist())) == [0, 1, 2]


def test_k_equals_one_and_k_equals_n(rng):
    x = torch.from_numpy(rng.standard_normal((50, 3)))
    r1 = torchkm.fit(x, 1)
    torch.testing.assert_close(r1.centroids[0], x.mean(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rn = torchkm.fit(x, 50, random_state=0)
    assert rn.inertia == pytest.approx(0.0, abs=1e-9)


def test_functional_assign_and_update(rng):
    x = torch.from_numpy(blobs(rng, 500, 5, 3))
    c = x[:3].clone()
    labels, dist = torchkm.assign(x, c)
    ref = f64_sq_distances(x.numpy(), c.numpy())
    np.testing.assert_array_equal(labels.numpy(), ref.argmin(1))
    new = torchkm.update(x, labels, c)
    for j in range(3):
        torch.testing.assert_close(new[j], x[labels == j].mean(0))
    # A cluster nobody chose keeps its centroid.
    stale = torchkm.update(x, torch.zeros(500, dtype=torch.int64), c)
    torch.testing.assert_close(stale[1:], c[1:])


def test_verbose_logs_through_the_torchkm_logger(data, caplog):
    with caplog.at_level("INFO", logger="torchkm"):
        torchkm.KMeans(3, verbose=True, random_state=0, max_iter=3).fit(data)
    assert any("iter 1" in r.getMessage() for r in caplog.records)
    assert any("run 1" in r.getMessage() for r in caplog.records)


def test_kmeans_parallel_finds_separated_blobs_and_is_seeded(rng):
    x = torch.from_numpy(blobs(rng, 3000, 5, 12, spread=100.0, sigma=0.5))
    a = torchkm.fit(x, 12, init="k-means||", random_state=4)
    b = torchkm.fit(x, 12, init="k-means||", random_state=4)
    assert torch.equal(a.centroids, b.centroids)
    assert len(torch.unique(a.labels)) == 12
    assert a.inertia <= 1.05 * torchkm.fit(x, 12, random_state=4).inertia


@pytest.mark.parametrize(("n", "d", "k", "in_memory", "expected"), [
    (1_000_000, 128, 4096, True, "k-means||"),   # many clusters over many rows
    (1 << 20, 32, 256, True, "k-means||"),       # exactly at every threshold
    (1 << 20, 32, 255, True, "k-means++"),       # too few clusters
    ((1 << 20) - 1, 32, 256, True, "k-means++"),  # too few row elements
    (32_768, 1024, 8192, True, "k-means++"),     # fewer than 32 rows per cluster
    (1_000_000, 128, 4096, False, "k-means++"),  # streamed: k-means++ on a sample
    (245_760, 32, 1024, True, "k-means++"),      # seed 000's size: level, greedy k-means++ kept
])
def test_auto_init_takes_kmeans_parallel_for_many_clusters_over_many_rows(n, d, k, in_memory, expected):
    from torchkm._loop import resolve_init

    assert resolve_init("auto", n, d, k, in_memory) == expected
    for given in ("k-means++", "random", "k-means||"):
        assert resolve_init(given, n, d, k, in_memory) == given


def test_auto_init_is_the_default_and_runs_the_init_it_names(rng, monkeypatch):
    from torchkm import _loop
    from torchkm.init import kmeans_parallel

    x = torch.from_numpy(blobs(rng, 600, 4, 8))
    assert torchkm.KMeans(8).init == "auto"
    # Small data: greedy k-means++, the same fit as asking for it.
    plus = torchkm.fit(x, 8, init="k-means++", random_state=1, max_iter=5)
    auto = torchkm.fit(x, 8, random_state=1, max_iter=5)
    assert torch.equal(auto.centroids, plus.centroids) and torch.equal(auto.labels, plus.labels)
    # Thresholds lowered to this data's shape: k-means||, the same fit as asking for it.
    monkeypatch.setattr(_loop, "AUTO_PARALLEL_MIN_CLUSTERS", 8)
    monkeypatch.setattr(_loop, "AUTO_PARALLEL_MIN_ELEMENTS", 600 * 4)
    calls = []
    monkeypatch.setattr(_loop, "kmeans_parallel", lambda *a, **kw: calls.append(1) or kmeans_parallel(*a, **kw))
    parallel = torchkm.fit(x, 8, init="k-means||", random_state=1, max_iter=5)
    auto = torchkm.fit(x, 8, random_state=1, max_iter=5)
    assert torch.equal(auto.centroids, parallel.centroids) and torch.equal(auto.labels, parallel.labels)
    assert len(calls) == 2


def test_kmeans_parallel_picks_data_rows_and_fills_up_few_candidates():
    from torchkm._reference import DataView
    from torchkm.init import kmeans_parallel

    # Three distinct points repeated: the rounds stop finding new candidates (every D^2 is zero).
    x = torch.tensor([[0.0, 0.0], [5.0, 5.0], [9.0, 0.0]]).repeat(20, 1)
    gen = torch.Generator().manual_seed(0)
    c = kmeans_parallel(DataView(x, torch.float32), 3, gen)
    assert sorted(map(tuple, c.tolist())) == [(0.0, 0.0), (5.0, 5.0), (9.0, 0.0)]
    c = kmeans_parallel(DataView(x, torch.float32), 5, gen)  # more clusters than candidates: random rows join
    assert c.shape == (5, 2) and all(tuple(row) in {(0.0, 0.0), (5.0, 5.0), (9.0, 0.0)} for row in c.tolist())


def test_kmeans_parallel_is_weighted_like_repeated_rows(rng):
    x = blobs(rng, 200, 3, 4, spread=50.0, sigma=0.5)
    w = np.zeros(200, dtype=np.float32)
    w[:100] = 1.0  # rows of zero weight are never candidates
    c = torchkm.fit(torch.from_numpy(x), 4, init="k-means||", sample_weight=w, random_state=0, max_iter=1).centroids
    assert all(any(np.allclose(row, x[i], atol=50.0) for i in range(100)) for row in c.numpy())


def test_max_points_per_centroid_subsamples_and_says_so(rng, caplog):
    x = torch.from_numpy(blobs(rng, 5000, 4, 5, spread=30.0))
    with caplog.at_level("INFO", logger="torchkm"):
        out = torchkm.fit(x, 5, random_state=0, max_points_per_centroid=100)
    assert "max_points_per_centroid=100: Lloyd iterations on a uniform sample of 500 of 5000 rows" in caplog.text
    labels, dist = torchkm.assign(x, out.centroids)
    assert torch.equal(out.labels, labels)  # labels and inertia are of every row
    assert out.inertia == pytest.approx(float(dist.double().sum()), rel=1e-6)
    caplog.clear()
    with caplog.at_level("INFO", logger="torchkm"):
        torchkm.fit(x, 5, random_state=0, max_points_per_centroid=1000)  # 5000 rows: no sampling
    assert "max_points_per_centroid" not in caplog.text
    with pytest.raises(ValueError, match="max_points_per_centroid must be >= 1"):
        torchkm.fit(x, 5, max_points_per_centroid=0)
