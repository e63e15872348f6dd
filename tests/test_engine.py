"""The kernel engine end to end through the public API, against the pure-torch engine.

On a CPU machine ``TORCHKM_ENGINE=triton`` sends CPU tensors through the Triton kernels (run by
the interpreter), so CI covers the wiring of ``_ops`` (fused pass, exact re-check, deterministic
update, k-means++ distances) without a GPU; on a GPU the same tests run compiled kernels on CUDA.
"""

import os

import numpy as np
import pytest
import torch

import torchkm
from tests.helpers import assert_labels_match_except_near_ties, blobs, f64_sq_distances

pytest.importorskip("triton")
ON_GPU = torch.cuda.is_available()
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if ON_GPU else "cpu"


def _fit_both(monkeypatch, x, k, **kw):
    monkeypatch.setenv("TORCHKM_ENGINE", "torch")
    ref = torchkm.fit(x, k, **kw)
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    got = torchkm.fit(x, k, **kw)
    return got, ref


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_fit_through_kernels_matches_torch_engine(monkeypatch, metric, precision, deterministic):
    x = torch.from_numpy(blobs(np.random.default_rng(1), 400, 6, 5, offset=50.0)).to(DEVICE)
    got, ref = _fit_both(monkeypatch, x, 5, random_state=0, metric=metric, precision=precision, deterministic=deterministic)
    if precision == "fast" and ON_GPU:
        # tf32 products may settle near-ties differently from the fp32 engine: same clustering quality.
        assert got.inertia == pytest.approx(ref.inertia, rel=1e-3)
        return
    assert torch.equal(got.labels, ref.labels)
    assert got.n_iter == ref.n_iter
    torch.testing.assert_close(got.centroids, ref.centroids, rtol=1e-5, atol=1e-4)
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-5)


def test_weights_empty_clusters_and_half_input(monkeypatch):
    rng = np.random.default_rng(2)
    x = torch.from_numpy(blobs(rng, 300, 4, 3)).to(DEVICE)
    w = torch.from_numpy(rng.random(300).astype(np.float32)).to(DEVICE)
    got, ref = _fit_both(monkeypatch, x, 3, random_state=1, sample_weight=w)
    assert torch.equal(got.labels, ref.labels)
    assert got.inertia == pytest.approx(ref.inertia, rel=1e-5)
    # Five copies of one point plus a far one, k=3 from an init that leaves a cluster empty.
    dup = torch.tensor([[0.0, 0.0]] * 5 + [[10.0, 10.0]], device=DEVICE)
    init = torch.tensor([[0.0, 0.0], [100.0, 100.0], [10.0, 10.0]], device=DEVICE)
    with pytest.warns(torchkm.ConvergenceWarning):
        got, ref = _fit_both(monkeypatch, dup, 3, init=init, max_iter=5)
    assert torch.isfinite(got.centroids).all()
    assert got.history[0].empty_clusters == ref.history[0].empty_clusters == 1
    half = x.half()
    got, ref = _fit_both(monkeypatch, half, 3, random_state=3)
    assert torch.equal(got.labels, ref.labels)


def test_deterministic_reruns_are_bit_identical(kernels):
    x = torch.from_numpy(blobs(np.random.default_rng(3), 500, 5, 4)).to(DEVICE)
    a = torchkm.fit(x, 4, random_state=0, deterministic=True)
    b = torchkm.fit(x, 4, random_state=0, deterministic=True)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.labels, b.labels) and a.inertia == b.inertia


def test_assign_update_and_module_through_kernels(monkeypatch):
    x = torch.from_numpy(blobs(np.random.default_rng(4), 200, 7, 6, offset=1e3)).to(DEVICE)
    c = x[:6].clone()
    results = {}
    for engine in ("torch", "triton"):
        monkeypatch.setenv("TORCHKM_ENGINE", engine)
        labels, dist = torchkm.assign(x, c)
        labels_cos, dist_cos = torchkm.assign(x - 1e3, c - 1e3, metric="cosine", precision="fast")
        new = torchkm.update(x, labels, c)
        km = torchkm.KMeans(6, random_state=0, precision="fast").fit(x)
        results[engine] = (labels, dist, labels_cos, dist_cos, new, km.predict(x))
    for i, (got, ref) in enumerate(zip(results["triton"], results["torch"])):
        if got.dtype == torch.int64:
            assert torch.equal(got, ref), i
        else:
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-3)


def test_assign_compiles_without_graph_breaks():
    x = torch.randn(100, 5, device=DEVICE)
    c = torch.randn(7, 5, device=DEVICE)
    eager = torchkm.assign(x, c)
    compiled = torch.compile(lambda a, b: torchkm.assign(a, b), fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    labels, dist = compiled(x, c)
    assert torch.equal(labels, eager[0])
    torch.testing.assert_close(dist, eager[1])


def test_eager_queries_skip_the_op_dispatch_and_match_it():
    """Outside torch.compile the query ops run their bodies directly (the op's dispatch costs the host
    more than a VQ pass's GPU time): same results as the registered op, no autograd history, and the
    op for a tracer's tensor subclasses."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchkm import _ops

    x = torch.randn(100, 5, device=DEVICE)
    c = torch.nn.Parameter(torch.randn(7, 5, device=DEVICE))
    assert not _ops._through_op(x, c)
    direct = _ops.query_assign(x, c, "euclidean", "exact")
    via_op = torch.ops.torchkm.assign(x, c.detach(), "euclidean", "exact")
    assert torch.equal(direct[0], via_op[0])
    torch.testing.assert_close(direct[1], via_op[1])
    summed = _ops.query_assign_and_sum(x, c, "exact")
    for got, ref in zip(summed, torch.ops.torchkm.assign_and_sum(x, c.detach(), "exact")):
        assert not got.requires_grad
        torch.testing.assert_close(got, ref)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert _ops._through_op(fake, fake[:7])
        labels, _ = _ops.query_assign(fake, fake[:7], "euclidean", "exact")
        assert labels.shape == (100,)


def test_precision_and_deterministic_arguments_are_checked():
    x = torch.randn(20, 3)
    with pytest.raises(ValueError, match="precision"):
        torchkm.fit(x, 2, precision="tf32")
    with pytest.raises(ValueError, match="precision"):
        torchkm.assign(x, x[:2], precision="half")
    with pytest.raises(ValueError, match="precision"):
        torchkm.KMeans(2, precision="bf16")


def test_relocation_ranks_rows_without_another_assignment_pass(monkeypatch):
    """A fit on the kernels that relocates empty clusters ranks the rows by their distance to the
    centroid its pass gave them (the dense engine's ``labelled_sq_distances`` launch), not by
    another assignment pass (which cost 2x a replayed iteration at 1M x 128 x 4096, H200,
    2026-12-04); the clusters are relocated as the torch engine's, onto rows farthest from their
    centroids."""
    from torchkm._kernels import lloyd

    from torchkm import _ops

    rng = np.random.default_rng(5)
    x = torch.from_numpy(blobs(rng, 300, 5, 4, offset=3.0)).to(DEVICE)
    init = x[:3].repeat(2, 1)[:5]  # duplicated centroids: two clusters empty at the first pass
    calls = {"assign": 0, "labelled_sq_distances": 0}
    for owner, name in ((_ops, "assign"), (lloyd, "labelled_sq_distances")):
        inner = getattr(owner, name)

        def counted(*args, _inner=inner, _name=name, **kwargs):
            calls[_name] += 1
            return _inner(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    got = torchkm.fit(x, 5, init=init, max_iter=20, tol=0.0)
    monkeypatch.setenv("TORCHKM_ENGINE", "torch")
    want = torchkm.fit(x, 5, init=init, max_iter=20, tol=0.0)
    assert got.history[0].empty_clusters == want.history[0].empty_clusters == 2
    assert calls["labelled_sq_distances"] >= 1 and calls["assign"] == 0, calls
    assert got.n_iter == want.n_iter
    assert torch.equal(got.labels, want.labels)


@pytest.mark.parametrize("case", ["strict", "tol", "max_iter", "empty"])
def test_blocks_of_iterations_stop_where_single_iterations_do(monkeypatch, case):
    """Iterations run in blocks (as CUDA graphs replay them) freeze on the device at the iteration
    where the host stops or must relocate an empty cluster: the same run as one at a time."""
    from torchkm import _loop

    rng = np.random.default_rng(5)
    x = torch.from_numpy(blobs(rng, 300, 5, 4, offset=3.0)).to(DEVICE)
    kw = {"random_state": 3, "init": "random", "max_iter": 20, "tol": 0.0}
    if case == "tol":
        kw["tol"] = 1e-3
    if case == "max_iter":
        kw["max_iter"] = 4
    k = 4
    if case == "empty":
        # Duplicated initial centroids: one of each pair gets no rows and is relocated mid-block.
        init = x[:3].repeat(2, 1)[:5]
        kw = {"init": init, "max_iter": 20, "tol": 0.0}
        k = 5
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    monkeypatch.setattr(_loop, "_use_cuda_graphs", lambda data, k, comm: False)
    one = torchkm.fit(x, k, **kw)
    monkeypatch.setattr(_loop, "_use_cuda_graphs", lambda data, k, comm: True)
    monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)  # the strict and tol cases then stop mid-block
    blocks = torchkm.fit(x, k, **kw)
    assert blocks.n_iter == one.n_iter
    assert [(h.labels_changed, h.empty_clusters) for h in blocks.history] == [
        (h.labels_changed, h.empty_clusters) for h in one.history]
    if case == "empty":
        assert any(h.empty_clusters for h in one.history)
    assert torch.equal(blocks.labels, one.labels)
    torch.testing.assert_close(blocks.centroids, one.centroids, rtol=1e-5, atol=1e-5)
    assert blocks.converged == one.converged


@pytest.mark.parametrize("case", ["strict", "tol", "max_iter", "empty", "empty, then tol"])
@pytest.mark.parametrize("algorithm", ["lloyd", "pruned", "box"])
def test_blocks_launched_ahead_of_their_read_give_the_fit_of_blocks_read_in_turn(monkeypatch, algorithm, case):
    """``_loop.lloyd`` launches a block before it reads the one before (``_pipelined``): a block
    behind one that stops (convergence, max_iter, an empty cluster mid-block or at its end) does
    nothing and is dropped unread, and the dense and bounds engines launch the next block behind
    their relocation of empty clusters before its shift is read. Each engine (dense, bounds, box)
    fits as with one block at a time."""
    from torchkm._kernels.lloyd import ReplayedEngine

    from torchkm import _loop

    d = {"lloyd": 5, "pruned": 17, "box": 2}[algorithm]
    rng = np.random.default_rng(7)
    x = torch.from_numpy(blobs(rng, 300, d, 4, sigma=3.0, offset=3.0)).to(DEVICE)  # a few blocks long
    kw = {"random_state": 3, "init": "random", "max_iter": 20, "tol": 0.0,
          "algorithm": "lloyd" if algorithm == "lloyd" else "pruned"}
    k = 4
    if case == "tol":
        kw["tol"] = 1e-3
    if case == "max_iter":
        kw["max_iter"] = 5  # (the block behind the second is one iteration)
    if case.startswith("empty"):
        init = x[:3].repeat(2, 1)[:5]
        kw = {**kw, "init": init, "random_state": None}
        k = 5
    if case == "empty, then tol":  # the relocation's shift meets tol: the block behind it is dropped
        kw["tol"] = 1e6
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    monkeypatch.setenv("TORCHKM_REUSE_ENGINES", "0")
    monkeypatch.setattr(_loop, "_use_cuda_graphs", lambda data, k, comm: True)
    monkeypatch.setattr(_loop, "_GRAPH_BLOCK", 2)
    follows = []
    real = ReplayedEngine._run_passes

    def run_passes(self, passes, record, follow=False):
        follows.append(follow)
        return real(self, passes, record, follow)

    monkeypatch.setattr(ReplayedEngine, "_run_passes", run_passes)
    relocations = []  # (the dense and bounds engines relocate on the device, a block launched behind)
    relocate = ReplayedEngine.relocate
    monkeypatch.setattr(ReplayedEngine, "relocate",
                        lambda self, n_empty, follow=False: relocations.append(follow) or relocate(self, n_empty, follow))
    monkeypatch.setenv("TORCHKM_PIPELINE", "0")
    in_turn = torchkm.fit(x, k, **kw)
    assert not any(follows) and not any(relocations)
    relocations.clear()
    monkeypatch.setenv("TORCHKM_PIPELINE", "1")
    ahead = torchkm.fit(x, k, **kw)
    # (Where the relocation meets tol the fit ends after one pass: only the dense engine, whose
    # first pass is a block's, launches one behind it.)
    assert any(follows) or (case == "empty, then tol" and algorithm != "lloyd")
    assert bool(relocations) == (case.startswith("empty") and algorithm != "box")
    # (The bounds engine relocates here after its first pass, run alone: no block to launch behind.)
    assert not relocations or all(relocations) == (algorithm != "pruned")
    assert ahead.n_iter == in_turn.n_iter
    assert [(h.labels_changed, h.empty_clusters, h.kernel) for h in ahead.history] == [
        (h.labels_changed, h.empty_clusters, h.kernel) for h in in_turn.history]
    if case.startswith("empty"):
        assert any(h.empty_clusters for h in in_turn.history)
    if case == "empty, then tol":
        assert ahead.converged and ahead.n_iter == 1
    if case == "max_iter":
        assert ahead.n_iter == 5
    assert torch.equal(ahead.labels, in_turn.labels)
    # The dense engine over at most 8 features sums rows into fp32 by atomics, whose order may vary
    # on a GPU (a centroid 1 ulp apart, H100); the bounds and box engines' sums are float64. The
    # inertia: an fp32 sum of per-program parts, in any order.
    tolerance = 1e-6 if ON_GPU and algorithm == "lloyd" else 0.0
    torch.testing.assert_close(ahead.centroids, in_turn.centroids, rtol=tolerance, atol=tolerance)
    assert ahead.inertia == pytest.approx(in_turn.inertia, rel=1e-6)
    assert ahead.converged == in_turn.converged


def test_fit_launches_kernels_without_the_wrap_triton_dispatch(monkeypatch):
    """The fit loop is never traced: its kernels skip wrap_triton's higher-order-op dispatch (host
    time per launch), which stays on everywhere else (torch.compile traces the ops through it)."""
    wrap_state = pytest.importorskip("torch._library.triton")
    from torchkm import _loop

    seen = []
    real = _loop.new_centroids

    def recording(*args, **kwargs):
        seen.append(wrap_state.is_wrap_triton_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(_loop, "new_centroids", recording)
    torchkm.fit(torch.randn(64, 3), 2, random_state=0, max_iter=2)
    assert seen and not any(seen)
    assert wrap_state.is_wrap_triton_enabled()


def test_eager_entry_points_launch_without_the_wrap_triton_dispatch(monkeypatch):
    """``KMeans.partial_fit``, ``torchkm.update`` and ``torchkm.transform`` call the kernels outside
    any ``triton_op``: they too launch directly (an online step in a training loop would otherwise
    pay the dispatch's host time on every launch)."""
    wrap_state = pytest.importorskip("torch._library.triton")
    from torchkm import _ops

    seen = {}

    def recording(name):
        real = getattr(_ops, name)

        def wrapper(*args, **kwargs):
            seen.setdefault(name, []).append(wrap_state.is_wrap_triton_enabled())
            return real(*args, **kwargs)

        monkeypatch.setattr(_ops, name, wrapper)

    recording("update")
    recording("sq_distances_to")
    x = torch.randn(64, 3)
    km = torchkm.KMeans(4, random_state=0)
    km.partial_fit(x)
    km.partial_fit(x)
    torchkm.update(x, km.predict(x), km.centroids)
    torchkm.transform(x, km.centroids)
    assert len(seen["update"]) == 3 and seen["sq_distances_to"]  # k-means++ of the first batch too
    assert not any(seen["update"] + seen["sq_distances_to"])
    assert wrap_state.is_wrap_triton_enabled()


def test_a_pass_of_a_shape_that_already_ran_is_captured_at_its_first_call():
    from torchkm._kernels.lloyd import ReplayedPass, launch_key

    device = torch.device(DEVICE)
    x = torch.zeros(5, 3, device=device)
    key = launch_key("test-warm", 4, {"x": x, "weight": None}, precision="exact")
    assert key == launch_key("test-warm", 4, {"x": x.clone(), "weight": None}, precision="exact")
    for other in (launch_key("test-warm", 4, {"x": x[:, :2], "weight": None}, precision="exact"),  # shape, strides
                  launch_key("test-warm", 4, {"x": x, "weight": x[:, 0]}, precision="exact"),  # a weight
                  launch_key("test-warm", 5, {"x": x, "weight": None}, precision="exact"),
                  launch_key("test-warm", 4, {"x": x, "weight": None}, precision="fast")):
        assert other != key
    first = ReplayedPass(lambda: x.add_(1), device, graphs=True, warm_key=key)
    assert first() == "first" and key in ReplayedPass._warm_keys
    second = ReplayedPass(lambda: x.add_(1), device, graphs=True, warm_key=key)
    # CPU tensors have no graphs: every call runs eagerly, the first as "first".
    assert second() == ("capture" if ON_GPU else "first")
    assert second() == ("replay" if ON_GPU else "eager")
    assert float(x[0, 0]) == 3.0


def test_graphs_are_warmed_once_before_a_pass_times_its_capture(monkeypatch):
    """A process's first capture pays a one-time cost that ``auto`` must not read as a pass's own
    host time: a ReplayedPass with graphs captures a warm-up graph first, once per device; without
    graphs (CPU) nothing is captured."""
    from torchkm._kernels import _common
    from torchkm._kernels.lloyd import ReplayedPass

    device = torch.device(DEVICE)
    monkeypatch.setattr(_common, "_graphs_warm", set())
    captured = []
    real = _common.capture
    monkeypatch.setattr(_common, "capture", lambda run, dev: captured.append(dev) or real(run, dev))
    x = torch.zeros(3, device=device)
    passes = [ReplayedPass(lambda: x.add_(1), device, graphs=True) for _ in range(2)]
    assert len(captured) == (1 if ON_GPU else 0)  # one warm-up, for both passes
    assert len(_common._graphs_warm) == (1 if ON_GPU else 0)
    for p in passes:
        p()
        p()
    assert float(x[0]) == 4.0


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("stop", ["max_iter", "tol"])
def test_a_fit_stopped_before_labels_settle_labels_its_returned_centroids(monkeypatch, metric, stop):
    # A fit that stops on tol or max_iter labels the rows once more, for the centroids it returns:
    # the dense engine does so with one more (replayed) iteration whose update it drops.
    rng = np.random.default_rng(11)
    x = torch.from_numpy(blobs(rng, 500, 5, 6, offset=20.0)).to(DEVICE)
    w = torch.from_numpy(rng.random(500).astype(np.float32) + 0.5).to(DEVICE)
    kw = {"max_iter": 2, "tol": 0.0} if stop == "max_iter" else {"max_iter": 50, "tol": 0.5}
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")
    r = torchkm.fit(x, 6, init="random", random_state=4, metric=metric, sample_weight=w, algorithm="lloyd", **kw)
    assert r.history[-1].labels_changed > 0  # not a strict stop: the labels came from the final pass
    xs = x.double()
    c = r.centroids.double()
    if metric == "cosine":
        xs = xs / xs.norm(dim=1, keepdim=True)
    sq = f64_sq_distances(xs.cpu().numpy(), c.cpu().numpy())
    assert_labels_match_except_near_ties(xs.cpu().numpy(), c.cpu().numpy(), r.labels.cpu().numpy(), sq.argmin(1))
    dist = sq[np.arange(500), r.labels.cpu().numpy()] * (0.5 if metric == "cosine" else 1.0)
    assert r.inertia == pytest.approx(float((dist * w.double().cpu().numpy()).sum()), rel=1e-5)
    # The same fit through the separate assignment (the engine's extra iteration bypassed).
    monkeypatch.setenv("TORCHKM_ENGINE", "torch")
    ref = torchkm.fit(x, 6, init="random", random_state=4, metric=metric, sample_weight=w, algorithm="lloyd", **kw)
    assert r.n_iter == ref.n_iter
    assert r.inertia == pytest.approx(ref.inertia, rel=1e-5)
