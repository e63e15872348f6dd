"""A fit's engines kept for the next fit of the same rows (``torchkm._workspace``): the same
results as fresh engines, and kept only while they may serve."""

import gc
import weakref

import pytest
import torch

import torchkm
from torchkm import _workspace

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _blobs(n: int = 301, d: int = 17, k: int = 7, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(k, d, generator=g) * 4
    return (centres[torch.randint(k, (n,), generator=g)] + 0.3 * torch.randn(n, d, generator=g)).to(DEVICE)


def _alike(a, b) -> None:
    # Atomic float sums: reruns may differ in the centroids' last bits, never in labels or steps.
    assert torch.equal(a.labels, b.labels)
    assert a.n_iter == b.n_iter
    torch.testing.assert_close(a.centroids, b.centroids, rtol=1e-5, atol=1e-5)


def _engines() -> list:
    return [engine for kept in _workspace._kept.values() for engine in kept.engines.values()]


@pytest.mark.parametrize("algorithm", ["lloyd", "pruned", "auto"])
def test_a_refit_of_the_same_rows_restarts_the_kept_engines_and_matches_fresh_ones(kernels, monkeypatch, algorithm):
    x = _blobs()
    inits = [x[:7].clone(), x[100:107].clone()]
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    fresh = [torchkm.fit(x, 7, init=c, algorithm=algorithm) for c in inits]
    assert not _workspace._kept
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "1")
    first = torchkm.fit(x, 7, init=inits[0], algorithm=algorithm)
    engines = _engines()
    assert engines and all(engine.x is None for engine in engines)  # kept without the rows
    second = torchkm.fit(x, 7, init=inits[1], algorithm=algorithm)
    again = torchkm.fit(x, 7, init=inits[0], algorithm=algorithm)
    assert _engines() == engines  # the same engine objects, restarted
    for got, want in ((first, fresh[0]), (second, fresh[1]), (again, fresh[0])):
        _alike(got, want)
        assert [h.kernel for h in got.history] == [h.kernel for h in want.history]


def test_rows_changed_in_place_or_other_weights_get_new_engines(kernels):
    x = _blobs()
    c0 = x[:7].clone()
    torchkm.fit(x, 7, init=c0, algorithm="lloyd")
    engines = _engines()
    x.mul_(2.0)  # the rows' version counter moves
    changed = torchkm.fit(x, 7, init=c0 * 2.0, algorithm="lloyd")
    assert len(_workspace._kept) == 2  # a workspace of its own; the old one stays until evicted
    assert [e for e in _engines() if all(e is not old for old in engines)]
    _workspace.clear()
    _alike(changed, torchkm.fit(x, 7, init=c0 * 2.0, algorithm="lloyd"))
    _workspace.clear()
    weights = torch.rand(x.shape[0], device=x.device)
    weighted = torchkm.fit(x, 7, init=c0 * 2.0, algorithm="lloyd", sample_weight=weights)
    assert len(_workspace._kept) == 1  # its own
    _workspace.clear()
    _alike(weighted, torchkm.fit(x, 7, init=c0 * 2.0, algorithm="lloyd", sample_weight=weights))


def test_kept_engines_go_with_their_rows_and_never_keep_them_alive(kernels):
    x = _blobs()
    torchkm.fit(x, 7, init=x[:7].clone(), algorithm="pruned")
    assert len(_workspace._kept) == 1
    rows = weakref.ref(x)
    del x
    gc.collect()
    assert rows() is None
    assert not _workspace._kept


def test_what_is_kept_is_bounded(kernels, monkeypatch):
    xs = [_blobs(seed=s) for s in range(_workspace.KEPT + 1)]
    for x in xs:
        torchkm.fit(x, 7, init=x[:7].clone(), algorithm="lloyd")
    assert len(_workspace._kept) == _workspace.KEPT  # the least recently used went
    _workspace.clear()
    monkeypatch.setattr(_workspace, "MAX_ROWS", xs[0].shape[0] - 1)
    torchkm.fit(xs[0], 7, init=xs[0][:7].clone(), algorithm="lloyd")
    assert not _workspace._kept
    monkeypatch.setattr(_workspace, "MAX_ROWS", 1 << 22)
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    torchkm.fit(xs[0], 7, init=xs[0][:7].clone(), algorithm="lloyd")
    assert not _workspace._kept


def test_the_hybrid_still_tries_pruned_passes_from_a_kept_dense_engine(kernels, monkeypatch):
    from torchkm import _loop

    # Try as soon as a dense pass is timed: the trial's estimate needs the dense engine's host
    # costs, which a kept engine (replays only, on CUDA) brings from the fit that set it up.
    monkeypatch.setattr(_loop._Hybrid, "min_work", 0)
    monkeypatch.setattr(_loop._Hybrid, "trial_share", float("inf"))
    monkeypatch.setattr(_loop._Hybrid, "patience", 10**9)
    monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)  # the switch waits for the end of a block: a short one
    x = _blobs(640, 17, 16)
    kw = {"init": x[:16].clone(), "tol": 0.0}
    torchkm.fit(x, 16, algorithm="lloyd", **kw)
    got = torchkm.fit(x, 16, algorithm="auto", **kw)
    assert "pruned" in [h.kernel for h in got.history]
    _alike(got, torchkm.fit(x, 16, algorithm="lloyd", **kw))


def test_a_kept_bounds_engine_makes_the_hybrids_trial_estimate_its_unreplayed_passes(kernels, monkeypatch):
    from torchkm import _loop

    monkeypatch.setattr(_loop._Hybrid, "min_work", 0)
    monkeypatch.setattr(_loop._Hybrid, "trial_share", float("inf"))
    monkeypatch.setattr(_loop._Hybrid, "patience", 10**9)
    monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)
    x = _blobs(640, 17, 16)
    kw = {"init": x[:16].clone(), "tol": 0.0}
    hybrids = []
    init = _loop._Hybrid.__init__
    monkeypatch.setattr(_loop._Hybrid, "__init__", lambda self, *a, **k: hybrids.append(self) or init(self, *a, **k))
    kernels_run = [h.kernel for h in torchkm.fit(x, 16, algorithm="auto", **kw).history]
    assert kernels_run.count("pruned") >= 3  # the full pass and two settle passes at least
    assert hybrids[-1].trial_passes == 3  # a new bounds engine
    (trial,) = [e for e in _engines() if e.kernel == "pruned"]
    left = trial.unreplayed_passes()
    # With CUDA graphs the first trial compiled its full pass and captured its settle passes (or
    # called them once): the next trial captures the full pass and at most the settle pass.
    assert left in ((1, 2) if _loop._ops.cuda_graphs_enabled(x.device) else (3,))
    torchkm.fit(x, 16, algorithm="auto", **kw)
    assert hybrids[-1].trial_passes == max(1, left)


def test_engines_that_cannot_restart_are_not_kept(kernels):
    # The box engine (d <= 3) sorts the rows and takes the caller's labels when it is built: a fit
    # builds its own, and only the label buffer is kept.
    x = _blobs(d=2)
    first = torchkm.fit(x, 7, init=x[:7].clone(), algorithm="pruned")
    assert {h.kernel for h in first.history} == {"pruned"}
    assert len(_workspace._kept) == 1 and not _engines()
    _alike(torchkm.fit(x, 7, init=x[:7].clone(), algorithm="pruned"), first)


def test_another_torchkm_setting_gets_new_engines(kernels, monkeypatch):
    """The kernels read their ``TORCHKM_*`` switches when an engine is built: a fit under other
    settings must not restart engines built under the old ones."""
    x = _blobs()
    c0 = x[:7].clone()
    torchkm.fit(x, 7, init=c0, algorithm="lloyd")
    engines = _engines()
    monkeypatch.setenv("TORCHKM_CHUNK_MINS", "0")
    other = torchkm.fit(x, 7, init=c0, algorithm="lloyd")
    assert len(_workspace._kept) == 2
    assert [e for e in _engines() if all(e is not old for old in engines)]
    monkeypatch.delenv("TORCHKM_CHUNK_MINS")
    again = torchkm.fit(x, 7, init=c0, algorithm="lloyd")
    assert len(_workspace._kept) == 2  # the first settings' workspace, taken back
    _alike(other, again)
