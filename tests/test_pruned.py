"""``algorithm="pruned" | "triangle" | "auto"`` through the public API: the same fit as dense Lloyd.

On a CPU machine the kernels run under the Triton interpreter (``TORCHKM_ENGINE=triton``); on a
GPU the same tests run compiled kernels on CUDA.
"""

import itertools
import logging
import os

import numpy as np
import pytest
import torch

import torchkm
from tests.helpers import assert_passes_count_changed_labels, fp32_tie_rows

pytest.importorskip("triton")
ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if ON_GPU else "cpu"
from torchkm._kernels._common import NEAR_SCORE_TIES  # noqa: E402 (needs triton)


def _seed000(n, d, k, sigma2, seed):
    """Seed 000 section V: k centres uniform in the unit cube, n / k rows around each, N(0, sigma2)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(k, d, generator=g)
    x = centres[torch.arange(n) % k] + sigma2**0.5 * torch.randn(n, d, generator=g)
    return x[torch.randperm(n, generator=g)].to(DEVICE)


def _same_fit(got, ref):
    assert got.n_iter == ref.n_iter
    np.testing.assert_array_equal(got.labels.cpu().numpy(), ref.labels.cpu().numpy())
    torch.testing.assert_close(got.centroids, ref.centroids, rtol=1e-5, atol=1e-5)
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-5)
    assert [h.labels_changed for h in got.history] == [h.labels_changed for h in ref.history]


# The triangle scan is slow under the interpreter (a loop per warp): fewer seeds for it on CPU.
CASES = [("pruned", seed, s2) for seed in (0, 1, 2) for s2 in (0.0125, 0.05, 0.3)] + [
    ("triangle", seed, s2) for seed in ((0, 1, 2) if ON_GPU else (0,)) for s2 in (0.0125, 0.05, 0.3)]


@pytest.mark.parametrize("algorithm,seed,sigma2", CASES)
def test_pruned_fit_equals_dense_fit(kernels, algorithm, seed, sigma2):
    x = _seed000(400, 17, 24, sigma2, seed)
    kw = {"init": "random", "random_state": seed, "max_iter": 40, "tol": 0.0}
    ref = torchkm.fit(x, 24, **kw)
    got = torchkm.fit(x, 24, algorithm=algorithm, **kw)
    _same_fit(got, ref)
    assert {h.kernel for h in got.history} == {algorithm}
    assert all(h.kernel == "lloyd" and h.skipped == 0.0 for h in ref.history)


# (bf16 rows: their one-hot sums multiply bf16 parts, which the interpreter mishandles.)
@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if ON_GPU else []))
@pytest.mark.parametrize("k", [48, 64])
def test_pruned_over_33_to_64_clusters_of_32_features(kernels, k, dtype):
    """The bounds engine over 33-64 clusters of rows of 32 features, whose exact passes defer
    rows to the re-search: its first iteration gives the centroids of a float64 Lloyd step, and
    the fit lands where the dense one does. (On an H200 the re-search's one-hot sums were
    miscompiled there: wrong centroids over fp32 rows, an illegal memory access over bf16 ones;
    the re-search now adds its rows by atomics.)"""
    n = 24_576 if ON_GPU else 300
    x = _seed000(n, 32, k, 0.05, 3).to(dtype)
    c0 = x[:k].float()  # distinct rows: seed 000's rows are shuffled around k centres
    one = torchkm.fit(x, k, init=c0, max_iter=1, tol=0.0, algorithm="pruned")
    assert {h.kernel for h in one.history} == {"pruned"}
    x64 = x.double()
    labels64 = torch.cdist(x64, c0.double()).argmin(1)
    counts = torch.bincount(labels64, minlength=k).double()
    means = torch.zeros(k, 32, dtype=torch.float64, device=x.device).index_add_(0, labels64, x64) / counts[:, None]
    torch.testing.assert_close(one.centroids.double(), means, rtol=0, atol=1e-5)
    kw = {"init": "random", "random_state": 3, "max_iter": 8 if ON_GPU else 3, "tol": 0.0}
    ref = torchkm.fit(x, k, **kw)
    got = torchkm.fit(x, k, algorithm="pruned", **kw)
    assert {h.kernel for h in got.history} == {"pruned"}
    # (fp32 ties may part the two fits by a few rows)
    assert float((got.labels != ref.labels).double().mean()) < 1e-3
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-4)


@pytest.mark.skipif(not ON_GPU, reason="many clusters over many rows: too slow under the interpreter")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_pruned_over_many_clusters_of_half_precision_rows(dtype):
    """The bounds engine over more than 512 clusters of short rows (the lazy packed search, its list
    search register-capped, ``configs.lazy_register_cap``) in each dtype. The fit lands where the
    dense one does (16-bit rows tie often: a few rows may part the two), its first step exactly."""
    k = 523
    x = _seed000(49_152, 32, k, 0.02, 7).to(dtype)
    kw = {"init": "random", "random_state": 7, "max_iter": 30, "tol": 0.0}
    ref = torchkm.fit(x, k, **kw)
    got = torchkm.fit(x, k, algorithm="pruned", **kw)
    assert {h.kernel for h in got.history} == {"pruned"}
    assert got.history[0].labels_changed == ref.history[0].labels_changed
    assert float((got.labels != ref.labels).double().mean()) < 1e-3
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-4)
    assert max(h.skipped for h in got.history[1:]) > 0.3


@pytest.mark.parametrize("algorithm", ["pruned", "triangle"])
def test_pruned_with_weights_cosine_and_far_from_origin(kernels, algorithm):
    x = _seed000(300, 17, 10, 0.02, 5) + 50.0  # centred inside, so the distances stay accurate
    w = torch.rand(300, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for metric in ("euclidean", "cosine"):
        kw = {"init": "k-means++", "random_state": 3, "max_iter": 30, "metric": metric, "sample_weight": w}
        _same_fit(torchkm.fit(x, 10, algorithm=algorithm, **kw), torchkm.fit(x, 10, **kw))


def test_pruned_with_duplicates_and_an_empty_cluster(kernels):
    x = _seed000(200, 17, 5, 0.01, 4)
    x[50:120] = x[0]  # many identical rows
    init = torch.cat([x[:4], torch.full((1, 17), 40.0, device=DEVICE)])  # the last centroid gets no rows
    kw = {"init": init, "max_iter": 20, "tol": 0.0}
    ref = torchkm.fit(x, 5, **kw)
    got = torchkm.fit(x, 5, algorithm="pruned", **kw)
    _same_fit(got, ref)
    assert got.history[0].empty_clusters == 1


def test_pruning_stats_in_history(kernels):
    x = _seed000(640, 17, 16, 0.0125, 0)
    km = torchkm.KMeans(16, init="random", random_state=0, algorithm="pruned", tol=0.0).fit(x)
    h = km.history_
    assert h[0].skipped_bound <= 0.0  # the first pass searches every row
    assert max(s.skipped_bound for s in h[1:]) > 0.8  # well-clustered: most rows settle
    assert all(s.skipped <= s.skipped_bound + 1e-12 and s.imbalance >= 0.0 for s in h)
    tri = torchkm.KMeans(16, init="random", random_state=0, algorithm="triangle", tol=0.0).fit(x)
    assert tri.n_iter_ == km.n_iter_
    assert all(0.0 <= s.skipped <= s.skipped_bound <= 1.0 for s in tri.history_)


def _dense_passes_cost_nothing(monkeypatch, patience: int) -> None:
    """The hybrid is told that a dense pass costs nothing, so it judges pruned passes slower and,
    after ``patience`` of them, hands the run back to the dense engine for good (a pass whose
    skipped fraction still rose by more than the plateau would not count)."""
    from torchkm import _loop

    monkeypatch.setattr(_loop._Hybrid, "patience", patience)
    monkeypatch.setattr(_loop._Hybrid, "plateau", 2.0)
    real_after = _loop._Hybrid.after

    def after(self, stats, how, seconds, host_seconds, launch_seconds=None):
        switch = real_after(self, stats, how, seconds, host_seconds, launch_seconds)
        if self.dense_seconds is not None:
            self.dense_seconds = 0.0
        return switch

    monkeypatch.setattr(_loop._Hybrid, "after", after)


def test_auto_keeps_small_problems_dense_and_matches(kernels):
    x = _seed000(300, 17, 8, 0.05, 0)
    kw = {"init": "random", "random_state": 0, "tol": 0.0}
    got = torchkm.fit(x, 8, algorithm="auto", **kw)
    _same_fit(got, torchkm.fit(x, 8, **kw))
    assert {h.kernel for h in got.history} == {"lloyd"}


def test_auto_starts_dense_tries_pruned_then_falls_back_when_slower(kernels, monkeypatch):
    from torchkm import _loop

    monkeypatch.setattr(_loop._Hybrid, "min_work", 0)
    monkeypatch.setattr(_loop._Hybrid, "trial_share", float("inf"))  # try as soon as a dense pass is timed
    # Fresh engines in every fit: an engine kept from the reference fit would not compile at its
    # first pass, which the hybrid then times (tests/test_workspace.py covers kept engines).
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    x = _seed000(640, 17, 16, 0.0125, 1)
    kw = {"init": "random", "random_state": 1, "tol": 0.0}
    ref = torchkm.fit(x, 16, **kw)
    # Blocks of 2 where graphs are on. The dense engine's first timed iteration is the second either
    # way (the first compiles): on the GPU the capture's replay, which ends the first block; on the
    # CPU (blocks of one) the first eager iteration.
    monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)
    dense = 2
    # Pruned passes never judged slower: the bounds engine runs the rest of the fit, its first pass full.
    monkeypatch.setattr(_loop._Hybrid, "patience", 10**9)
    got = torchkm.fit(x, 16, algorithm="auto", **kw)
    _same_fit(got, ref)
    assert [h.kernel for h in got.history] == ["lloyd"] * dense + ["pruned"] * (got.n_iter - dense)
    assert got.history[dense].skipped_bound <= 0.0  # the full pass that records the bounds
    assert max(h.skipped_bound for h in got.history[dense + 1:]) > 0.5
    # Told that a dense pass costs nothing, the hybrid hands the run back to the dense engine for
    # good (a pass whose skipped fraction still rose by more than the plateau would not count).
    _dense_passes_cost_nothing(monkeypatch, patience=2)
    monkeypatch.setattr(_loop._Hybrid, "trials", 1)
    x = _seed000(640, 17, 16, 0.3, 1)  # overlapping clusters: a fit long enough to switch twice
    got = torchkm.fit(x, 16, algorithm="auto", **kw)
    _same_fit(got, torchkm.fit(x, 16, **kw))
    kernels_run = [h.kernel for h in got.history]
    # Not judged: the full pass and the first settle pass (it compiles). Where graphs are on, the
    # block in which patience runs out finishes first (here it ends there).
    pruned = 2 + 2
    assert kernels_run == ["lloyd"] * dense + ["pruned"] * pruned + ["lloyd"] * (got.n_iter - dense - pruned)
    # Allowed a second trial at once, the hybrid tries again after one dense block, fails again
    # (dense passes still cost nothing), and the dense engine finishes the run.
    monkeypatch.setattr(_loop._Hybrid, "trials", 2)
    monkeypatch.setattr(_loop._Hybrid, "retry_after", 0.0)
    got = torchkm.fit(x, 16, algorithm="auto", **kw)
    _same_fit(got, torchkm.fit(x, 16, **kw))
    runs = [(kernel, len(list(group))) for kernel, group in itertools.groupby(h.kernel for h in got.history)]
    assert [kernel for kernel, _ in runs] == ["lloyd", "pruned", "lloyd", "pruned", "lloyd"]
    assert runs[1][1] == runs[3][1] == pruned


def test_pure_torch_engine_runs_dense_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv("TORCHKM_ENGINE", "torch")
    x = _seed000(200, 17, 4, 0.05, 0).cpu()
    with caplog.at_level(logging.INFO, logger="torchkm"):
        got = torchkm.fit(x, 4, random_state=0, algorithm="pruned")
    assert {h.kernel for h in got.history} == {"lloyd"}
    assert "needs the Triton kernels" in caplog.text
    _same_fit(got, torchkm.fit(x, 4, random_state=0))


@pytest.mark.parametrize("d,seed,sigma2", [(1, 0, 0.05), (2, 1, 0.0125), (2, 2, 0.3), (3, 3, 0.05)])
def test_small_d_pruned_runs_the_box_engine_and_equals_dense(kernels, monkeypatch, d, seed, sigma2):
    x = _seed000(400, d, 12, sigma2, seed)
    kw = {"init": "random", "random_state": seed, "max_iter": 15, "tol": 0.0}
    ref = torchkm.fit(x, 12, **kw)
    # Tiles of 16 rows, all walked by one program: several tiles per program, the last one short.
    monkeypatch.setenv("TORCHKM_BOX_CONFIG", "16,1")
    got = torchkm.fit(x, 12, algorithm="pruned", **kw)
    _same_fit(got, ref)
    assert {h.kernel for h in got.history} == {"pruned"}
    # Tiles of sorted rows search few of the 12 centroids on clustered data.
    assert all(0.0 <= h.skipped == h.skipped_bound < 1.0 and h.imbalance == 0.0 for h in got.history)
    if sigma2 <= 0.05 and d <= 2:
        assert got.history[-1].skipped > 0.25
    if d == 3:
        _same_fit(torchkm.fit(x, 12, algorithm="triangle", **kw), ref)  # the scan serves any d


def test_auto_tries_the_box_engine_at_small_d_and_hands_back(kernels, monkeypatch):
    from torchkm import _loop

    monkeypatch.setattr(_loop._Hybrid, "min_work", 0)
    monkeypatch.setattr(_loop._Hybrid, "trial_share", float("inf"))  # try as soon as a dense pass is timed
    monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)
    monkeypatch.setenv("TORCHKM_BOX_CONFIG", "16,1")
    x = _seed000(400, 2, 12, 0.3, 4)
    kw = {"init": "random", "random_state": 4, "tol": 0.0, "max_iter": 30}
    ref = torchkm.fit(x, 12, **kw)
    # Never judged slower: the box engine takes over from the dense one's labels and ends the fit.
    monkeypatch.setattr(_loop._Hybrid, "patience", 10**9)
    got = torchkm.fit(x, 12, algorithm="auto", **kw)
    _same_fit(got, ref)
    kernels_run = [h.kernel for h in got.history]
    assert kernels_run[0] == "lloyd" and "pruned" in kernels_run
    assert kernels_run == sorted(kernels_run)  # lloyd, then pruned for good
    # Judged slower at once: the dense engine takes the run back from the box engine's labels.
    _dense_passes_cost_nothing(monkeypatch, patience=1)
    got = torchkm.fit(x, 12, algorithm="auto", **kw)
    _same_fit(got, ref)
    kernels_run = [h.kernel for h in got.history]
    first = kernels_run.index("pruned")
    assert "lloyd" in kernels_run[first:]


def test_pruned_from_4_to_8_features_runs_dense(kernels, caplog):
    x = _seed000(200, 5, 4, 0.05, 0)
    with caplog.at_level(logging.INFO, logger="torchkm"):
        got = torchkm.fit(x, 4, random_state=0, algorithm="pruned")
    assert {h.kernel for h in got.history} == {"lloyd"} and "d <= 3" in caplog.text
    _same_fit(got, torchkm.fit(x, 4, random_state=0))


def test_small_d_pruned_with_weights_cosine_duplicates_and_an_empty_cluster(kernels):
    x = _seed000(300, 3, 6, 0.02, 5) + 50.0
    w = torch.rand(300, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for metric in ("euclidean", "cosine"):
        kw = {"init": "k-means++", "random_state": 3, "max_iter": 30, "metric": metric, "sample_weight": w}
        _same_fit(torchkm.fit(x, 6, algorithm="pruned", **kw), torchkm.fit(x, 6, **kw))
    x = _seed000(200, 2, 5, 0.01, 4)
    x[50:120] = x[0]
    init = torch.cat([x[:4], torch.full((1, 2), 40.0, device=DEVICE)])  # the last centroid gets no rows
    kw = {"init": init, "max_iter": 20, "tol": 0.0}
    got = torchkm.fit(x, 5, algorithm="pruned", **kw)
    _same_fit(got, torchkm.fit(x, 5, **kw))
    assert got.history[0].empty_clusters == 1


def test_bad_algorithm_and_conflicts():
    x = torch.randn(50, 4)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        torchkm.fit(x, 3, algorithm="elkan")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        torchkm.KMeans(3, algorithm="fast")
    with pytest.raises(ValueError, match="deterministic=True needs algorithm='lloyd'"):
        torchkm.fit(x, 3, algorithm="pruned", deterministic=True)


def test_sklearn_wrapper_maps_elkan_to_pruned():
    pytest.importorskip("sklearn")
    from torchkm.sklearn import KMeans as SkKMeans

    x = _seed000(200, 17, 4, 0.05, 0).cpu().numpy()
    est = SkKMeans(4, algorithm="elkan", random_state=0, device="cpu").fit(x)
    assert est.get_params()["algorithm"] == "elkan"
    np.testing.assert_array_equal(est.labels_, SkKMeans(4, random_state=0, device="cpu").fit(x).labels_)


def _pass(hybrid, how, seconds, kernel="pruned", skipped=0.5, wall=1.0, host=None):
    from torchkm import _loop

    stats = _loop.IterationStats(1, 0.0, 0.0, 0, 0, wall, kernel, skipped, skipped, 0.0)
    return hybrid.after(stats, how, seconds, host)


def test_hybrid_decision_rules():
    """The hybrid's bookkeeping alone: when it tries pruned passes, which passes are judged
    against which reference, and when it hands back (no kernels involved)."""
    from torchkm import _loop
    from torchkm._reference import DataView

    data = DataView(torch.zeros(4096, 64), torch.float32)
    hybrid = _loop._Hybrid(data, 1024)
    hybrid.done = False  # the CPU engine has no bounds: judge as if it had
    # Dense iterations: the fastest timed one is the reference; the eager and captured ones say what
    # a trial's host-bound passes cost (3 x 0.5 s here), and the trial waits for 20 x that spent.
    assert _pass(hybrid, "initial", None, "lloyd", wall=5.0) is None and hybrid.dense_seconds is None
    assert _pass(hybrid, "first", None, "lloyd", wall=5.0) is None
    assert _pass(hybrid, "capture", 2.0, "lloyd", wall=5.0, host=0.5) is None
    assert hybrid.dense_seconds == 2.0 and hybrid.trial_cost == pytest.approx(1.5)
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=5.0) is None and hybrid.dense_seconds == 1.0
    assert _pass(hybrid, "replay", 3.0, "lloyd", wall=5.0) is None and hybrid.dense_seconds == 1.0
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=4.5) is None  # 29.5 s spent: not yet
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=0.5) == "pruned" and hybrid.trying
    # Dense rows left in the block, the full pass and the first settle pass: never judged.
    assert _pass(hybrid, "replay", 9.0, "lloyd") is None
    for how in ("full", "first"):
        assert _pass(hybrid, how, None) is None and hybrid.judged == 0
    # Slower, but the skipped fraction still rises: the bounds are settling in, not counted.
    for skipped in (0.1, 0.3, 0.5, 0.7):
        assert _pass(hybrid, "replay", 1.2, skipped=skipped) is None
    assert hybrid.slow == 0 and hybrid.excess == pytest.approx(0.8)
    # Faster passes reset the count; patience (6) slower ones on a plateau in a row hand back.
    assert _pass(hybrid, "capture", 1.1, skipped=0.7) is None
    assert _pass(hybrid, "replay", 0.5, skipped=0.7) is None and hybrid.slow == 0
    for _ in range(hybrid.patience - 1):
        assert _pass(hybrid, "replay", 1.1, skipped=0.7) is None
    assert hybrid.excess == pytest.approx(0.9) and hybrid.budget == pytest.approx(1.5)
    assert _pass(hybrid, "replay", 1.1, skipped=0.7) == "lloyd" and not hybrid.trying and not hybrid.done
    # One more trial may start once the fit has run retry_after (2) times as long, its budget
    # what the failed one (1.0 s beyond dense passes) left of trial_share of the time spent.
    assert hybrid.wasted == pytest.approx(1.0) and hybrid.retry_at == pytest.approx(2 * hybrid.elapsed)
    assert _pass(hybrid, "replay", 0.2, skipped=0.7) is None and hybrid.dense_seconds == 1.0  # left in the block
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=hybrid.retry_at - hybrid.elapsed - 0.5) is None
    assert _pass(hybrid, "replay", 1.0, "lloyd") == "pruned" and hybrid.trials_run == 2
    assert hybrid.budget == pytest.approx(hybrid.spent * hybrid.trial_share - 1.0)
    for how in ("full", "first"):
        assert _pass(hybrid, how, None) is None
    for _ in range(hybrid.patience):  # the first still rises from the new trial's 0
        assert _pass(hybrid, "replay", 1.1, skipped=0.7) is None
    assert _pass(hybrid, "replay", 1.1, skipped=0.7) == "lloyd" and hybrid.done  # the last trial: for good
    assert _pass(hybrid, "replay", 0.1, "lloyd") is None and hybrid.dense_seconds == 1.0
    # A trial whose passes, settling or not, cost more than trial_share of the time spent before it
    # (1.5 s of 30 s here) ends there.
    hybrid = _loop._Hybrid(data, 1024)
    hybrid.done = False
    assert _pass(hybrid, "capture", 1.0, "lloyd", wall=10.0, host=0.2) is None
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=20.0) == "pruned" and hybrid.budget == pytest.approx(1.5)
    # (A process that ran the shape before captures the first settle pass at once: still not judged.)
    assert _pass(hybrid, "full", None) is None and _pass(hybrid, "capture", 9.0) is None and hybrid.judged == 0
    assert _pass(hybrid, "replay", 1.7, skipped=0.2) is None
    assert _pass(hybrid, "replay", 1.7, skipped=0.4) is None
    assert _pass(hybrid, "replay", 1.2, skipped=0.6) == "lloyd" and hybrid.slow == 0


def test_hybrid_failed_trial_costs_its_unjudged_passes_too():
    """What a failed trial takes from the next one's budget is every pass of it beyond a dense
    pass, in wall time: the full and first settle passes, never judged, count as well."""
    from torchkm import _loop
    from torchkm._reference import DataView

    hybrid = _loop._Hybrid(DataView(torch.zeros(4096, 64), torch.float32), 1024)
    hybrid.done = False
    assert _pass(hybrid, "capture", 1.0, "lloyd", wall=10.0, host=0.2) is None
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=20.0) == "pruned" and hybrid.budget == pytest.approx(1.5)
    assert _pass(hybrid, "full", None, wall=3.0) is None and _pass(hybrid, "first", None, wall=2.5) is None
    for _ in range(3):  # judged: 0.5 s over the reference each, wall time as the device's
        assert _pass(hybrid, "replay", 1.5, skipped=0.2, wall=1.5) is None
    assert _pass(hybrid, "replay", 1.5, skipped=0.2, wall=1.5) == "lloyd"
    # Judged excess 2.0 s; the trial as a whole 2.0 + 1.5 + 2.0 = 5.5 s beyond six dense passes.
    assert hybrid.excess == pytest.approx(2.0) and hybrid.wasted == pytest.approx(5.5)
    # The second trial's budget is what is left of trial_share of the time spent: none here yet.
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=hybrid.retry_at - hybrid.elapsed) is None
    assert not hybrid.trying
    assert _pass(hybrid, "replay", 1.0, "lloyd", wall=100.0) == "pruned"
    assert hybrid.budget == pytest.approx(hybrid.spent * hybrid.trial_share - 5.5)


def test_hybrid_stops_judging_where_no_trial_can_start():
    """With host-bound passes only the trial_share rule starts a trial; after a block of iterations
    the hybrid stops (no more timing or bookkeeping) where the fit is projected to end first."""
    from torchkm import _loop
    from torchkm._reference import DataView

    data = DataView(torch.zeros(4096, 64), torch.float32)
    for wall, last in ((0.001, None), (4.0, "pruned")):
        hybrid = _loop._Hybrid(data, 1024)
        hybrid.done = False
        _pass(hybrid, "initial", None, "lloyd", wall=wall)
        # 0.1 s passes issued in 0.5 s of host time: host-bound; a trial costs 1.5 s.
        _pass(hybrid, "capture", 0.1, "lloyd", wall=wall, host=0.5)
        for _ in range(5):
            assert _pass(hybrid, "replay", 0.1, "lloyd", wall=wall) is None and not hybrid.done
        # The 8th iteration: 8 ms spent leaves no room, 32 s does (and starts the trial).
        assert _pass(hybrid, "replay", 0.1, "lloyd", wall=wall) == last
        assert hybrid.done == (last is None) and hybrid.trying == (last is not None)
        assert _pass(hybrid, "replay", 0.1, "lloyd", wall=wall) is None


def _dense(hybrid, iteration, shift, seconds=None, how="replay", host=None, launch=None):
    from torchkm import _loop

    stats = _loop.IterationStats(iteration, 0.0, shift, 1, 0, 0.001, "lloyd")
    return hybrid.after(stats, how, seconds, host, launch)


def test_hybrid_projects_the_fits_remaining_iterations():
    """The projection behind the box trial's early start: the fewest of the last ``window``
    shifts' geometric decay down to tol, the changed-label counts' decay below one row, and as
    many iterations as have run; a series that does not decay sets no bound; never past max_iter."""
    from torchkm import _loop
    from torchkm._reference import DataView

    data = DataView(torch.zeros(4096, 2), torch.float32)
    hybrid = _loop._Hybrid(data, 1024, tol=2.0**-20, max_iter=300)
    assert hybrid.box and hybrid.remaining_iterations(0) == 0.0
    for i in range(10):
        hybrid._shifts.append(2.0**-i)
        hybrid._changed.append(1000.0)  # not decaying: no bound from the labels
        if i < 2:
            assert hybrid.remaining_iterations(i + 1) == 0.0  # fewer than three iterations
    assert hybrid.remaining_iterations(20) == 11.0  # halving from 2^-9 down to 2^-20
    assert hybrid.remaining_iterations(10) == 10.0  # at most as many as have run
    hybrid.max_iter = 15
    assert hybrid.remaining_iterations(10) == 5.0
    hybrid.max_iter = 300
    hybrid._changed = [2.0 ** (10 - i) for i in range(10)]  # halving down to 2 rows: 2 more below one
    assert hybrid.remaining_iterations(20) == 2.0
    hybrid._changed[-1] = 0.0  # no label changed: the fit stops
    assert hybrid.remaining_iterations(20) == 0.0
    hybrid._changed = [1000.0] * 10
    hybrid._shifts += [2.0**-9] * 8  # a plateau
    assert hybrid.remaining_iterations(18) == 18.0
    hybrid.tol = 0.0  # strict convergence only: no level for the shifts to reach
    hybrid._shifts = [2.0**-i for i in range(10)]
    assert hybrid.remaining_iterations(10) == 10.0
    hybrid.tol = 1.0
    assert hybrid.remaining_iterations(10) == 0.0  # already below tol


def test_hybrid_starts_the_box_trial_once_the_projected_passes_pay_back_its_set_up(monkeypatch):
    """At d <= 3 the trial's cost includes the box engine's set-up, and the trial starts as soon
    as the dense passes projected to remain cost ``payback`` times the trial (long before the
    ``trial_share`` rule would), where a dense pass outlasts an iteration's host work; dense blocks
    are cut short once that is near. The bounds engine (d > 8) starts early the same way, with no
    set-up to measure; an early trial's budget counts the projected passes."""
    from torchkm import _loop
    from torchkm._reference import DataView

    asked = []
    monkeypatch.setattr(_loop._ops, "box_setup_seconds", lambda data: asked.append(data.n_samples) or 2.0)
    data = DataView(torch.zeros(4096, 2), torch.float32)
    hybrid = _loop._Hybrid(data, 1024, tol=2.0**-30, max_iter=300)
    hybrid.done = False
    assert _dense(hybrid, 1, 1.0, how="initial") is None
    assert _dense(hybrid, 2, 0.5, 1.0, how="capture", host=0.1) is None  # trial: 0.3 s of host passes
    assert hybrid.dense_seconds == 1.0 and hybrid.trial_cost == pytest.approx(0.3)
    assert not asked and not hybrid.near and hybrid.max_block(8) == 8
    # Halving shifts project 28 more passes down to 2^-30, capped at the 3 run so far: 3 s, at
    # least 2 x 0.3 s, so the set-up is measured (2 s); under 2 x 2.3 s, no trial yet, but near,
    # and a pass outlasts its host work: blocks of trial_block.
    assert _dense(hybrid, 3, 0.25) is None
    assert asked == [4096] and hybrid.setup_seconds() == 2.0 and hybrid.near and hybrid.max_block(8) == 4
    assert _dense(hybrid, 4, 0.125) is None  # 4 s
    assert _dense(hybrid, 5, 0.0625) == "pruned" and hybrid.trying and hybrid.max_block(8) == 8  # 5 s >= 4.6 s
    assert asked == [4096] and hybrid.budget == pytest.approx((hybrid.spent + 5.0) * hybrid.trial_share)
    # Where a pass is shorter than the host's work per iteration, nothing starts early: the
    # trial waits for trial_share, blocks stay long and the set-up is not measured.
    quick = _loop._Hybrid(data, 1024, tol=2.0**-30, max_iter=300)
    quick.done = False
    _dense(quick, 1, 1.0, how="initial")
    _dense(quick, 2, 0.5, 0.5, how="capture", host=1.0)
    for i in range(3, 30):
        assert _dense(quick, i, 2.0 ** (1 - i)) is None
    assert not quick.near and quick.max_block(8) == 8 and asked == [4096] and quick.done
    # The bounds engine: a trial of 3 x 0.1 s starts once 2 x that is projected (6 passes of 0.1 s),
    # but not before a window of shifts (its first passes search most rows): at the 8th iteration,
    # with 8 passes projected (at most as many as have run).
    bounds = _loop._Hybrid(DataView(torch.zeros(4096, 64), torch.float32), 1024, tol=2.0**-30, max_iter=300)
    bounds.done = False
    _dense(bounds, 1, 1.0, how="initial")
    _dense(bounds, 2, 0.5, 0.1, how="capture", host=0.1)
    for i in range(3, bounds.window):
        assert _dense(bounds, i, 2.0 ** (1 - i)) is None and not bounds.near and bounds.max_block(8) == 8
    assert _dense(bounds, bounds.window, 2.0 ** (1 - bounds.window)) == "pruned" and bounds.trying
    assert bounds.setup_seconds() == 0.0 and asked == [4096]
    assert bounds.budget == pytest.approx((bounds.spent + 0.8) * bounds.trial_share)


def test_hybrid_judges_dense_passes_by_their_launches_and_a_kept_engines_trial_by_its_unreplayed_passes():
    """A pass is device-bound where it outlasts its launches, not a capture's whole host time (which
    also builds the graph): H100, bf16 at 3.9M x 32, k = 1,024, a 2.5 ms pass against a 3.56 ms
    capture had kept the fit dense. A bounds engine kept from an earlier fit replays most of a
    trial (``trial_passes``, set by ``lloyd``): its estimate is that many host-bound passes."""
    from torchkm import _loop
    from torchkm._reference import DataView

    def started(launch, trial_passes=None):
        hybrid = _loop._Hybrid(DataView(torch.zeros(4096, 64), torch.float32), 1024, tol=2.0**-30, max_iter=300)
        hybrid.done = False
        if trial_passes is not None:
            hybrid.trial_passes = trial_passes
        _dense(hybrid, 1, 1.0, how="initial")
        _dense(hybrid, 2, 0.5, 2.5, how="capture", host=3.5, launch=launch)
        for i in range(3, hybrid.window + 1):
            verdict = _dense(hybrid, i, 2.0 ** (1 - i), 2.5)
            if verdict is not None or hybrid.done:
                return hybrid, i, verdict
        return hybrid, None, None

    # Judged by the capture's host time, the passes are host-bound: no early start, and the fit
    # (8 ms of wall time spent) leaves no room for a trial of 3 x 3.5 s.
    hybrid, at, verdict = started(launch=None)
    assert not hybrid._device_bound() and hybrid.done and verdict is None
    assert hybrid.trial_cost == pytest.approx(10.5)
    # By its launches (2.3 s) a 2.5 s pass is device-bound: the early start weighs the 8 passes
    # projected (20 s) against payback x the trial; 3 host-bound passes (10.5 s) do not pay back yet ...
    hybrid, at, verdict = started(launch=2.3)
    assert hybrid._device_bound() and hybrid.launch_costs == [2.3] and hybrid.host_costs == [3.5]
    assert verdict is None and not hybrid.trying
    # ... one (a kept engine's trial) does, at the window's end.
    hybrid, at, verdict = started(launch=2.3, trial_passes=1)
    assert verdict == "pruned" and at == hybrid.window and hybrid.trial_cost == pytest.approx(3.5)


def test_group_bounds_engine_through_the_api_equals_dense(kernels, monkeypatch):
    """``TORCHKM_BOUNDS=groups`` (the experimental engine with a bound per group of centroids): the
    same fits as dense Lloyd, with weights, cosine, duplicates and an empty cluster relocated."""
    from torchkm._kernels import groups

    built = []
    monkeypatch.setenv("TORCHKM_BOUNDS", "groups")
    monkeypatch.setattr(groups, "GROUP_SIZE", 16)  # two groups at k = 32
    init = groups.GroupBoundsEngine.__init__
    monkeypatch.setattr(groups.GroupBoundsEngine, "__init__", lambda self, *a, **kw: built.append(1) or init(self, *a, **kw))
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    x = _seed000(256, 17, 32, 0.02, 6)
    got = torchkm.fit(x, 32, init="random", random_state=1, max_iter=12, tol=0.0, algorithm="pruned")
    _same_fit(got, torchkm.fit(x, 32, init="random", random_state=1, max_iter=12, tol=0.0))
    assert max(h.skipped_bound for h in got.history) > 0.5
    w = torch.rand(256, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    kw = {"init": "k-means++", "random_state": 3, "max_iter": 8, "metric": "cosine", "sample_weight": w}
    # Rows off the origin, but not so far that cosine distances fall under fp32's rounding of the
    # products: at x + 50 (rows nearly parallel, 8 a cluster) the two exact routes (3xTF32 for dense
    # Lloyd here, the best two and a re-search for the engine) part on rows whose gap is a tie by
    # ``tie_tolerance`` (scripts/diag_exact_routes.py). (The parted histories an H200 showed at
    # x + 50 on 2026-12-02 were the fused pass's undercount of changed labels, fixed on 2026-12-03:
    # with the fix 12 such fits at x + 50 and x + 5 kept dense Lloyd's histories, BENCHMARKS.md.)
    _same_fit(torchkm.fit(x + 5.0, 32, algorithm="pruned", **kw), torchkm.fit(x + 5.0, 32, **kw))
    y = x.clone()
    y[50:120] = y[0]  # many identical rows
    start = torch.cat([y[:31], torch.full((1, 17), 40.0, device=DEVICE)])  # the last centroid gets no rows
    got = torchkm.fit(y, 32, init=start, max_iter=8, tol=0.0, algorithm="pruned")
    _same_fit(got, torchkm.fit(y, 32, init=start, max_iter=8, tol=0.0))
    assert got.history[0].empty_clusters == 1
    assert len(built) == 3


@pytest.mark.parametrize("kind,d,bounds", [("pruned", 2, "rows"), ("pruned", 33, "rows"), ("pruned", 33, "groups"),
                                           ("triangle", 5, "rows")])
def test_pruned_engines_count_the_labels_they_change(monkeypatch, kind, d, bounds):
    """Each pass's changed count is the number of labels it changed: the box (d = 2), bounds,
    group-bounds and triangle engines write labels over the previous ones, as the dense pass does,
    whose counts were short on an H200 (tests/kernels/test_update.py)."""
    from torchkm import _ops
    from torchkm._reference import DataView

    monkeypatch.setenv("TORCHKM_BOUNDS", bounds)
    n, k = (100_003, 70) if ON_GPU else ((1_003, 7) if kind == "triangle" else (2_003, 70))
    x = _seed000(n, d, k, 0.05, seed=d)
    engine = _ops.pruned_engine(DataView(x, torch.float32), x[:k].clone(), torch.empty(n, dtype=torch.int32, device=DEVICE),
                                None, 0.0, kind, graphs=False)
    assert_passes_count_changed_labels(engine, 5)


@pytest.mark.parametrize("algorithm", ["lloyd", "pruned"])
def test_a_fit_stopped_by_tol_labels_its_rows_by_the_final_centroids_in_one_more_pass(kernels, monkeypatch,
                                                                                       algorithm):
    # Stopped by tol while labels still change: the labels returned are those of the centroids
    # returned, from one more pass of the fit's own engine, not a separate assignment.
    from torchkm import _ops

    x = _seed000(600, 17, 12, 0.05, 7)
    init = x[:12].clone()

    def no_separate_assignment(*args, **kwargs):
        raise AssertionError("the final labels came from a separate assignment")

    monkeypatch.setattr(_ops, "assign", no_separate_assignment)
    got = torchkm.fit(x, 12, init=init, max_iter=40, tol=0.3, algorithm=algorithm)
    assert got.converged and got.history[-1].labels_changed > 0
    assert {h.kernel for h in got.history} == {algorithm}
    sq = torch.cdist(x.double(), got.centroids.double()) ** 2
    np.testing.assert_array_equal(got.labels.cpu().numpy(), sq.argmin(1).cpu().numpy())
    assert got.inertia == pytest.approx(float(sq.min(1).values.sum()), rel=1e-5)


@pytest.mark.parametrize("algorithm", ["lloyd", "pruned"])
@pytest.mark.parametrize("case", ["plain", "weighted", "cosine", "more than the kernels move"])
def test_empty_clusters_relocated_on_the_device_as_by_torch_ops(kernels, monkeypatch, algorithm, case):
    """The dense and bounds engines relocate empty clusters on the device with no host sync but the
    shift's (``engine.relocate``, a replayed graph where graphs are on): the same fit, pass for pass,
    as the torch relocation (``_loop._relocate_empty`` and ``new_centroids``), which the other
    engines and several ranks keep."""
    from torchkm._kernels import lloyd, prune

    x = _seed000(600, 17, 12, 0.02, 9)
    start = torch.cat([x[:9], x[:2], torch.full((1, 17), 40.0, device=DEVICE)])  # three clusters empty at first
    kw = {"init": start, "max_iter": 10, "tol": 0.0, "algorithm": algorithm}
    if case == "weighted":
        w = torch.rand(600, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        w[::7] = 0.0  # rows of zero weight are never picked
        kw["sample_weight"] = w
    if case == "cosine":
        x, kw["metric"] = x + 0.5, "cosine"
    if case == "more than the kernels move":  # torch.topk picks the rows (one host sync)
        from torchkm._kernels import update

        monkeypatch.setattr(lloyd, "RELOCATE_MAX", 1)
        monkeypatch.setattr(update, "RELOCATE_MAX", 1)
    calls = []
    relocate = lloyd.ReplayedEngine.relocate
    monkeypatch.setattr(lloyd.ReplayedEngine, "relocate", lambda self, *a: calls.append(self.kernel) or relocate(self, *a))
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    got = torchkm.fit(x, 12, **kw)
    monkeypatch.setattr(lloyd.LloydEngine, "relocates_on_device", False)
    monkeypatch.setattr(prune.BoundsEngine, "relocates_on_device", False)
    want = torchkm.fit(x, 12, **kw)
    assert calls and set(calls) == {algorithm} and got.history[0].empty_clusters == want.history[0].empty_clusters >= 2
    _same_fit(got, want)
    assert [h.empty_clusters for h in got.history] == [h.empty_clusters for h in want.history]
    assert [h.center_shift for h in got.history] == pytest.approx([h.center_shift for h in want.history], rel=1e-4)


@pytest.mark.parametrize("case", ["plain", "weighted", "cosine", "empty clusters", "auto"])
def test_dense_float64_moves_take_the_bounds_engines_steps(kernels, monkeypatch, case):
    """Dense Lloyd with float64 moves (``TORCHKM_DENSE_MOVES=1``, the default up to 32 features; more
    than 64 clusters): its sums are the bounds engine's, float64 sums of fp32 rows, which come out
    the same in any order of the atomics. So a dense fit and a pruned fit take the same steps:
    equal labels and iteration counts, and centroids equal to the last bit, pass for pass; and the
    fit's labels are those of the fp32 sums' dense fit. ``auto``: the hybrid tries the bounds engine and hands the run back to the
    dense engine (its sums then those of the labels it takes over), and still takes those steps."""
    from torchkm._kernels import lloyd

    from torchkm import _loop

    k = 80
    x = _seed000(720, 17, k, 0.02, 5)
    kw = {"init": "random", "random_state": 2, "max_iter": 30, "tol": 0.0}
    if case == "weighted":
        w = torch.rand(720, generator=torch.Generator().manual_seed(4)).to(DEVICE)
        w[::9] = 0.0
        kw["sample_weight"] = w
    if case == "cosine":
        x, kw["metric"] = x + 0.5, "cosine"
    if case == "empty clusters":
        kw["init"] = torch.cat([x[:k - 3], x[:2], torch.full((1, 17), 40.0, device=DEVICE)])
    if case == "auto":
        # Overlapping clusters, a fit long enough to hand back; blocks of 2 where graphs are on, so
        # that the hand-over is not held back to the end of a long block (as in the auto test above).
        x, kw["max_iter"] = _seed000(720, 17, k, 0.3, 5), 60
        monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    monkeypatch.setenv("TORCHKM_DENSE_MOVES", "0")  # (the default at 17 features is moves)
    fp32_sums = torchkm.fit(x, k, **kw)
    monkeypatch.setenv("TORCHKM_DENSE_MOVES", "1")
    engines = []
    init = lloyd.LloydEngine.__init__
    monkeypatch.setattr(lloyd.LloydEngine, "__init__", lambda self, *a, **kws: init(self, *a, **kws) or engines.append(self))
    dense = torchkm.fit(x, k, **kw)
    assert engines and all(e.moves for e in engines)
    pruned = torchkm.fit(x, k, algorithm="pruned", **kw)
    assert {h.kernel for h in pruned.history} == {"pruned"}
    if case == "auto":
        monkeypatch.setattr(_loop._Hybrid, "min_work", 0)
        monkeypatch.setattr(_loop._Hybrid, "trial_share", float("inf"))  # try as soon as a dense pass is timed
        monkeypatch.setattr(_loop._Hybrid, "trials", 1)
        _dense_passes_cost_nothing(monkeypatch, patience=2)
        pruned = torchkm.fit(x, k, algorithm="auto", **kw)
        runs = [kernel for kernel, _ in itertools.groupby(h.kernel for h in pruned.history)]
        assert runs == ["lloyd", "pruned", "lloyd"]
    assert torch.equal(dense.centroids, pruned.centroids) and torch.equal(dense.labels, pruned.labels)
    assert [h.center_shift for h in dense.history] == [h.center_shift for h in pruned.history]
    _same_fit(dense, pruned)
    _same_fit(dense, fp32_sums)
    if case == "empty clusters":
        assert dense.history[0].empty_clusters >= 2


X3_TIES_ON = pytest.mark.skipif(not NEAR_SCORE_TIES, reason=(
    "TORCHKM_X3_TIES=1 is read at import: run in a process of its own by "
    "tests/kernels/test_assign.py::test_near_scores_settle_in_a_process_with_x3_ties_on"))


@pytest.mark.parametrize("d, k", [(33, 70), pytest.param(17, 70, marks=X3_TIES_ON),
                                  pytest.param(32, 100, marks=X3_TIES_ON)])
def test_dense_and_pruned_fits_settle_fp32_ties_alike(kernels, monkeypatch, d, k):
    """Rows on the bisectors of close centroid pairs (``fp32_tie_rows``: their two distances part by
    less than fp32 rounds them): the dense pass and the bounds engine's first pass run on different
    tiles, so their fp32 sums run in different orders, but both settle such a pair by float64
    distances. So the fits (float64 moves, one process) take the same steps: equal labels,
    centroids to the bit and iteration counts. (With the float64 sweep compiled out,
    ``TORCHKM_FLOAT64_TIES=0``, the first pass already parts them.) At most 32 features and 128
    clusters the dense exact pass is 3xTF32 scores alone, whose near scores are settled by direct
    distances the same way only with ``TORCHKM_X3_TIES=1`` (without it about half of these rows
    end apart there)."""
    n = 600
    x, c = fp32_tie_rows(n, d, k, seed=7, device=DEVICE)
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    monkeypatch.setenv("TORCHKM_DENSE_MOVES", "1")
    kw = {"init": c, "max_iter": 5, "tol": 0.0}
    dense = torchkm.fit(x, k, **kw)
    pruned = torchkm.fit(x, k, algorithm="pruned", **kw)
    assert {h.kernel for h in pruned.history} == {"pruned"}
    assert dense.n_iter == pruned.n_iter
    assert torch.equal(dense.labels, pruned.labels) and torch.equal(dense.centroids, pruned.centroids)

