"""The same API on CUDA tensors, through the Triton kernels (run on a GPU machine; skipped elsewhere).

Results on the input's device, agreement with the CPU engine and a float64 oracle, bit-identical
reruns with ``deterministic=True``, all input dtypes, peak memory, clear device errors.
"""

import numpy as np
import pytest
import torch

import torchkm
from tests.helpers import assert_labels_match_except_near_ties, blobs, f64_sq_distances

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run through the device tool)")


@pytest.fixture
def x_cpu():
    # Fresh random data every run: results must hold for any valid input.
    return torch.from_numpy(blobs(np.random.default_rng(), 20_011, 33, 40))


@pytest.fixture
def x_and_init():
    """Fresh blobs and one initial centroid in each blob. Runs of one fit that must agree start
    from it: from ``x[:40]`` some blobs start with two centroids, whose boundary then drifts through
    the blob for many iterations, and a row on it within fp32 rounding goes either way under
    atomic sums added in another order, after which the runs part (by 1e-3 to 5e-2)."""
    x, blob = blobs(np.random.default_rng(), 20_011, 33, 40, return_blobs=True)
    first = [int(np.flatnonzero(blob == b)[0]) for b in range(40)]
    x = torch.from_numpy(x)
    return x, x[first].clone()


@pytest.mark.parametrize("algorithm", ["lloyd", "pruned"])
def test_cuda_fit_takes_features_that_require_grad(x_cpu, algorithm):
    """A CUDA fit of features that require grad (through the kernels, their CUDA graphs and the
    moments pass) runs, returns nothing that requires grad, and its labels and inertia are those of
    its own centroids. (Two runs' atomic sums may part them, so it is not compared with a run of
    the detached rows: the CPU test does that.)"""
    x = x_cpu.cuda().requires_grad_()
    rows = x_cpu.numpy()
    for init in ("k-means++", "k-means||"):
        got = torchkm.fit(x, 40, random_state=0, algorithm=algorithm, init=init)
        assert not got.centroids.requires_grad and not got.labels.requires_grad
        c = got.centroids.cpu().numpy()
        dist = f64_sq_distances(rows, c)
        assert_labels_match_except_near_ties(rows, c, got.labels.cpu().numpy(), dist.argmin(1))
        np.testing.assert_allclose(got.inertia, dist.min(1).sum(), rtol=1e-4)
    assert x.grad is None


def test_results_stay_on_the_input_device(x_cpu):
    x = x_cpu.cuda()
    r = torchkm.fit(x, 40, random_state=0)
    assert r.centroids.is_cuda and r.labels.is_cuda
    km = torchkm.KMeans(40, random_state=0).fit(x)
    assert km.cluster_centers_.is_cuda and km.predict(x).is_cuda and km.transform(x[:3]).is_cuda


def test_cuda_assign_matches_float64(x_cpu):
    c = x_cpu[torch.randperm(len(x_cpu))[:1000]] + 0.01
    labels, dist = torchkm.assign(x_cpu.cuda(), c.cuda())
    ref = f64_sq_distances(x_cpu.numpy(), c.numpy())
    assert_labels_match_except_near_ties(x_cpu.numpy(), c.numpy(), labels.cpu().numpy(), ref.argmin(1))
    np.testing.assert_allclose(dist.cpu().numpy(), ref.min(1), rtol=1e-4, atol=1e-3)


def test_cuda_lloyd_matches_cpu_from_the_same_init(x_and_init):
    # One centroid in each blob (x_and_init): from ``x[:40]`` two engines' fits part the same way
    # runs with atomic sums do (one failure in a full run of this file, 2026-11-22).
    x_cpu, init = x_and_init
    cpu = torchkm.fit(x_cpu, 40, init=init, max_iter=10, tol=0)
    gpu = torchkm.fit(x_cpu.cuda(), 40, init=init.cuda(), max_iter=10, tol=0)
    # On fresh data a row can sit on a true tie within fp32 rounding, which the two engines may
    # break differently; after that, only the clusters it moved between may differ.
    gpu_labels = gpu.labels.cpu()
    differ = gpu_labels != cpu.labels
    assert differ.float().mean() < 1e-3
    moved = torch.zeros(40, dtype=torch.bool)
    moved[gpu_labels[differ]] = True
    moved[cpu.labels[differ]] = True
    torch.testing.assert_close(gpu.centroids.cpu()[~moved], cpu.centroids[~moved], rtol=1e-4, atol=1e-4)
    assert gpu.inertia == pytest.approx(cpu.inertia, rel=1e-4)


def test_cuda_deterministic_reruns_are_bit_identical(x_cpu):
    x = x_cpu.cuda()
    a = torchkm.fit(x, 40, random_state=11, deterministic=True)
    b = torchkm.fit(x, 40, random_state=11, deterministic=True)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.labels, b.labels) and a.inertia == b.inertia


def test_cuda_default_reruns_agree(x_cpu):
    # The fused pass adds with atomics: the last bits of the sums may vary, the clustering not.
    x = x_cpu.cuda()
    a = torchkm.fit(x, 40, random_state=11)
    b = torchkm.fit(x, 40, random_state=11)
    assert a.inertia == pytest.approx(b.inertia, rel=1e-5)
    torch.testing.assert_close(a.centroids, b.centroids, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_cuda_graph_iterations_match_launches_from_python(x_and_init, monkeypatch, metric):
    # Small problems replay the iteration as a CUDA graph; the same fit without it must agree.
    x, init = (t.cuda() for t in x_and_init)
    graphed = torchkm.fit(x, 40, init=init, max_iter=15, tol=0, metric=metric)
    monkeypatch.setenv("TORCHKM_CUDA_GRAPHS", "0")
    plain = torchkm.fit(x, 40, init=init, max_iter=15, tol=0, metric=metric)
    # Atomic sums differ in their last bits between any two runs, so near-ties may flip.
    assert graphed.history[0].labels_changed == plain.history[0].labels_changed
    torch.testing.assert_close(graphed.centroids, plain.centroids, rtol=1e-3, atol=1e-3)
    assert float((graphed.labels == plain.labels).double().mean()) >= 0.999
    assert graphed.inertia == pytest.approx(plain.inertia, rel=1e-4)


def test_cuda_graph_iterations_relocate_empty_clusters(monkeypatch):
    # Copies of one centroid leave clusters empty; relocation runs between the graph's replays.
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(5_000, 16, device="cuda", generator=g)
    init = torch.cat([x[:8], x[:1].expand(8, 16)])
    graphed = torchkm.fit(x, 16, init=init, max_iter=20, tol=0)
    monkeypatch.setenv("TORCHKM_CUDA_GRAPHS", "0")
    plain = torchkm.fit(x, 16, init=init, max_iter=20, tol=0)
    assert sum(h.empty_clusters for h in graphed.history) >= 8
    assert graphed.history[0].empty_clusters == plain.history[0].empty_clusters
    assert torch.bincount(graphed.labels, minlength=16).min() > 0
    assert graphed.inertia == pytest.approx(plain.inertia, rel=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize", [False, True])
def test_cuda_labelled_sq_distances_are_one_launch_of_the_float64_values(dtype, normalize):
    """What a relocating fit ranks rows by, on the kernels: one launch (not chunked torch ops),
    equal to float64 distances of the rows as the fit transforms them, for int32 and int64 labels."""
    from torchkm import _ops
    from torchkm._reference import DataView

    g = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 2**31, (1,))))
    x = (torch.randn(100_003, 129, device="cuda", generator=g) + 3).to(dtype)
    c = torch.randn(1000, 129, device="cuda", generator=g)
    offset = None if normalize else x.double().mean(0).float()
    if normalize:
        c = c / c.norm(dim=1, keepdim=True)
    view = DataView(x, torch.float32, offset, normalize)
    assert _ops.uses_kernels(view)
    labels = torch.randint(0, 1000, (x.shape[0],), device="cuda", generator=g)
    rows = x.double() - offset.double() if offset is not None else x.double()
    if normalize:
        rows = rows / rows.norm(dim=1, keepdim=True)
    want = ((rows - c.double()[labels]) ** 2).sum(1)
    for lab in (labels, labels.int()):
        got = _ops.labelled_sq_distances(view, c, lab)
        assert got.dtype == torch.float32 and got.is_cuda
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=1e-6)


def test_cuda_graphs_dropped_during_a_callers_capture_wait_for_it(x_cpu):
    """A fit's engines hold their CUDA graphs in reference cycles, so the garbage collector may free
    them inside the caller's own capture (here: a fit's rows, with the workspace kept for them, and
    a graph of ours in a cycle, dropped and collected mid-capture). Destroying a graph there would
    end that capture; they wait instead, and go at the next release."""
    import gc

    from torchkm._kernels import _common

    x = x_cpu.cuda()
    value = torch.zeros(1, device="cuda")
    ours = {"graph": _common.capture(lambda: value.add_(1.0), value.device)}
    ours["itself"] = ours
    torchkm.fit(x, 40, random_state=0, max_iter=5)
    out = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.add_(1.0)
        del ours, x
        gc.collect()
        assert _common._graphs_to_release
        out.add_(1.0)
    graph.replay()
    assert float(out) == 2.0
    _common.release_graphs()
    assert not _common._graphs_to_release


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_peak_memory_is_x_plus_linear_terms(dtype):
    n, d, k = 4_000_000, 64, 256
    x = torch.randn(n, d, device="cuda").to(dtype)
    init = x[:k].float().clone()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torchkm.fit(x, k, init=init, max_iter=3)
    extra = torch.cuda.max_memory_allocated() - base
    # O(n + k d): labels (2 x int64), norms, re-check list, distances; on Hopper the search's two
    # records cover one chunk of rows each (hopper_search.chunk_rows: 2.7 MB each on an H200);
    # never O(n d) or O(n k). (H200, 2026-11-22, against 200.1 MiB: 121 fp32 / 119 bf16 with
    # algorithm="lloyd", 167 / 98 "pruned", 121 / 96 "auto".)
    assert extra <= 48 * n + 64 * k * d + (16 << 20), f"{extra / 2**20:.1f} MiB above the input"


def test_cuda_assign_compiles_without_graph_breaks(x_cpu):
    x = x_cpu.cuda()
    c = x[:50].clone()
    compiled = torch.compile(lambda a, b: torchkm.assign(a, b), fullgraph=True)
    labels, dist = compiled(x, c)
    eager = torchkm.assign(x, c)
    # Inductor computes the centring offset (a mean) in its own order: last-bit differences may
    # settle fp32 near-ties the other way, nothing more.
    differ = assert_labels_match_except_near_ties(x_cpu.numpy(), c.cpu().numpy(), labels.cpu().numpy(),
                                                  eager[0].cpu().numpy())
    assert differ <= 5
    same = labels == eager[0]
    torch.testing.assert_close(dist[same], eager[1][same])


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_cuda_compiled_tensor_core_pass_with_deferred_rows(precision):
    """torch.compile(fullgraph=True) of ``torchkm.assign``, of the fused assign-and-sum op and of a VQ
    training step at d > 8: the tensor-core pass, the exact mode's deferred-row list and its
    re-search, and the fused sums, under Inductor's functionalisation. Rows near three identical
    codes force re-searches (three equal scores), rows halfway between two codes the settling of
    pairs; the allocator's free memory is poisoned first, so a read of memory that no kernel wrote
    shows. Sums and the EMA update are checked against the compiled labels' own one-hot sums.
    (Inductor once cloned the counts, a view at a storage offset, from past the end of a copy of the
    view: wrong counts and, at large sizes, an illegal memory access.)"""
    from torchkm import _ops
    from torchkm.nn import VectorQuantizer

    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 31)))
    k, d, n = 512, 64, 6000
    vq = VectorQuantizer(k, d, kmeans_init=False, precision=precision).cuda()
    twin = VectorQuantizer(k, d, kmeans_init=False, precision=precision).cuda()
    with torch.no_grad():
        vq.codebook[1:96:3] = vq.codebook[0:96:3]
        vq.codebook[2:96:3] = vq.codebook[0:96:3]
        vq.embed_sum.copy_(vq.codebook)
    codebook = vq.codebook.detach().clone()
    x = torch.randn(n, d, device="cuda", generator=g)
    x[:512] = (codebook[96::2][:128].repeat(4, 1) + codebook[97::2][:128].repeat(4, 1)) / 2
    x[512:1024] = codebook[0:96:3].repeat(16, 1) + 1e-3 * torch.randn(512, d, device="cuda", generator=g)
    poison = [torch.full((size,), 0x7F, dtype=torch.uint8, device="cuda") for size in [64 << 20] * 4 + [1 << 16] * 200]
    del poison  # the blocks go back to the caching allocator, still holding 0x7F7F7F7F

    def check_labels(labels: torch.Tensor, c: torch.Tensor) -> None:
        assert int(labels.min()) >= 0 and int(labels.max()) < k
        ref = f64_sq_distances(x.cpu().numpy(), c.cpu().numpy()).argmin(1)
        if precision == "exact":
            assert_labels_match_except_near_ties(x.cpu().numpy(), c.cpu().numpy(), labels.cpu().numpy(), ref)
        else:
            assert (labels.cpu().numpy() == ref).mean() > 0.9

    def one_hot_sums(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sums = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, labels, x.double())
        return sums.float(), torch.bincount(labels, minlength=k).float()

    labels, dist = torch.compile(lambda a, b: torchkm.assign(a, b, precision=precision), fullgraph=True)(x, codebook)
    torch.cuda.synchronize()
    check_labels(labels, codebook)
    assert torch.isfinite(dist).all()

    fused = torch.compile(lambda a, b: _ops.query_assign_and_sum(a, b, precision), fullgraph=True)(x, codebook)
    check_labels(fused[0], codebook)
    sums, counts = one_hot_sums(fused[0])
    assert torch.equal(fused[3], counts)
    torch.testing.assert_close(fused[2], sums, rtol=1e-5, atol=1e-4)

    step = torch.compile(vq, fullgraph=True)
    for _ in range(3):
        twin.load_state_dict(vq.state_dict())
        rows = x.clone().requires_grad_(True)
        before = vq.codebook.detach().clone()
        out = step(rows)
        (out.quantized.sum() + out.loss).backward()
        torch.cuda.synchronize()
        check_labels(out.indices, before)
        assert torch.equal(out.quantized.detach(), before[out.indices])
        assert torch.isfinite(rows.grad).all()
        # The eager layer's update from the compiled labels' one-hot sums gives the same state.
        twin._update(x, out.indices, *one_hot_sums(out.indices))
        for name in ("cluster_size", "embed_sum", "codebook"):
            torch.testing.assert_close(getattr(vq, name), getattr(twin, name), rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_cuda_compiled_layer_replays_as_a_cuda_graph(precision):
    """``torch.compile(vq, mode="reduce-overhead")``: the training step runs as CUDA graphs, which
    Inductor skips when a graph mutates an input that is not static (the exact pass's launches
    once counted the rows as written, tests/kernels/test_mutations.py), and its steps agree with
    the eager layer's."""
    from torch._dynamo.utils import counters

    from torchkm.nn import VectorQuantizer

    torch._dynamo.reset()
    counters.clear()
    k, d, n = 512, 64, 4096
    vq = VectorQuantizer(k, d, kmeans_init=False, precision=precision).cuda()
    step = torch.compile(vq, fullgraph=True, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(n, d, device="cuda", requires_grad=True)
        codebook, sizes = vq.codebook.clone(), vq.cluster_size.clone()
        out = step(x)
        (out.quantized.square().mean() + out.loss).backward()
        torch.cuda.synchronize()
        rows, codes, labels = x.detach().cpu().numpy(), codebook.cpu().numpy(), out.indices.cpu().numpy()
        want = f64_sq_distances(rows, codes).argmin(1)
        if precision == "exact":
            assert_labels_match_except_near_ties(rows, codes, labels, want)
        else:
            assert (labels == want).mean() > 0.99
        counts = torch.bincount(out.indices, minlength=k).float()
        torch.testing.assert_close(vq.cluster_size, sizes.lerp(counts, 1 - vq.decay), rtol=1e-5, atol=1e-5)
        assert torch.isfinite(x.grad).all()
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_cuda_compiled_fp32_pass_at_the_vq_benchmark_size(precision, monkeypatch, tmp_path):
    """A traced fp32 pass (torch.compile of ``torchkm.assign`` and of the fused op) at the VQ
    benchmark's size (32,768 x 256, 8192 codes), which multiplies fp16 operands (an fp16 copy of
    the rows, made in the graph): exact labels equal a float64 argmin but for near-ties, fast ones
    stay within the fast mode's bound, distances and sums agree with the rows', and tf32 products
    (``TORCHKM_HALF_OPERANDS=0``) give the same exact labels. Fresh rows (magnitude 1e4) and
    poisoned memory."""
    from torchkm._kernels.assign import gap_bound_coefficient

    from torchkm import _ops

    n, d, k = 32_768, 256, 8192
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 31)))
    c = 1e4 * torch.randn(k, d, device="cuda", generator=g)
    x = c[torch.randint(0, k, (n,), device="cuda", generator=g)] + 3e3 * torch.randn(n, d, device="cuda", generator=g)
    results = {}
    for half in ("1", "0"):
        torch._dynamo.reset()
        monkeypatch.setenv("TORCHKM_HALF_OPERANDS", half)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / half))
        poison = [torch.full((64 << 20,), 0x7F, dtype=torch.uint8, device="cuda") for _ in range(4)]
        del poison
        labels, dist = torch.compile(lambda a, b: torchkm.assign(a, b, precision=precision), fullgraph=True)(x, c)
        fused = torch.compile(lambda a, b: _ops.query_assign_and_sum(a, b, precision), fullgraph=True)(x, c)
        results[half] = labels
        assert torch.equal(fused[0], labels)
        direct = (x.double() - c.double()[labels]).square().sum(1)
        torch.testing.assert_close(dist.double(), direct, rtol=1e-4, atol=1e-2)
        sums = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, labels, x.double())
        assert torch.equal(fused[3], torch.bincount(labels, minlength=k).float())
        torch.testing.assert_close(fused[2].double(), sums, rtol=1e-4, atol=1.0)
        c64 = c.double()
        want = torch.cat([(c64.square().sum(1) - 2.0 * part.double() @ c64.T).argmin(1) for part in x.split(4096)])
        if precision == "exact":
            assert_labels_match_except_near_ties(x.double().cpu().numpy(), c64.cpu().numpy(), labels.cpu().numpy(),
                                                 want.cpu().numpy())
        else:
            gap = direct - (x.double() - c64[want]).square().sum(1)
            bound = gap_bound_coefficient(torch.float32, d) * x.double().norm(dim=1) * c64.norm(dim=1).max()
            assert bool((gap <= bound).all())
    if precision == "exact":
        assert torch.equal(results["1"], results["0"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cuda_input_dtypes(x_cpu, dtype):
    x = x_cpu.cuda().to(dtype)
    r = torchkm.fit(x, 40, random_state=0)
    assert torch.isfinite(r.centroids).all()
    assert r.centroids.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("k", [32, 128])
@pytest.mark.parametrize("algorithm", ["lloyd", "pruned"])
def test_cuda_bf16_centroids_of_many_rows_are_their_float64_means(k, algorithm):
    """At 3.9M bf16 rows the dense passes' centroids were 3e-5 to 7e-5 off the float64 means of
    their clusters (rows centred on a float32 mean round alike, ``_loop.coarse_offset``)."""
    gen = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 31)))
    centres = torch.rand(k, 32, device="cuda", generator=gen)
    which = torch.randint(0, k, (3_932_160,), device="cuda", generator=gen)
    x = (centres[which] + 0.05 * torch.randn(3_932_160, 32, device="cuda", generator=gen)).to(torch.bfloat16)
    r = torchkm.fit(x, k, init=centres, max_iter=30, tol=0, algorithm=algorithm)
    assert r.converged  # no label changed in the last iteration: the centroids are its clusters' means
    counts = torch.bincount(r.labels, minlength=k).double()
    means = torch.zeros(k, 32, dtype=torch.float64, device="cuda").index_add_(0, r.labels, x.double())
    means /= counts[:, None]
    err = float((r.centroids.double() - means).abs().max() / means.abs().max())
    assert err < 2e-6, err


def test_cuda_fit_checks_rows_in_its_moments_pass(x_cpu):
    # Unweighted GPU rows are checked by the pass that gives their mean and variance (one sync):
    # the same errors as the separate scan, and the same data statistics as the weighted path.
    from torchkm import _loop
    from torchkm._distributed import Comm
    from torchkm._reference import DataView

    x = x_cpu.cuda()
    mean, variance = _loop._moments(DataView(x, torch.float32))
    expected_mean = _loop._data_mean(DataView(x, torch.float32), None, Comm())[0]
    torch.testing.assert_close(mean, expected_mean, rtol=0, atol=1e-5)
    expected = _loop._feature_variance_mean(DataView(x, torch.float32, expected_mean), None, Comm())
    assert variance == pytest.approx(expected, rel=1e-5)
    bad = x.clone()
    bad[7_001, 3] = float("inf")
    for metric in ("euclidean", "cosine"):
        with pytest.raises(ValueError, match=r"x contains non-finite values.*1 Inf.*first bad row 7001"):
            torchkm.fit(bad, 5, metric=metric)
    with pytest.raises(ValueError, match="overflow"):
        torchkm.fit(x * 1e30, 5)


def test_cuda_device_mismatch_is_a_clear_error(x_cpu):
    km = torchkm.KMeans(5, random_state=0).fit(x_cpu.cuda())
    with pytest.raises(ValueError, match="x is on cpu but the centroids are on cuda"):
        km.predict(x_cpu)
    km.to("cpu")
    assert torch.equal(km.predict(x_cpu), km.labels_.cpu())


def test_cuda_module_moves_with_to(x_cpu):
    km = torchkm.KMeans(5, random_state=0).fit(x_cpu)
    fresh = torchkm.KMeans(5).cuda()
    fresh.load_state_dict(km.state_dict())
    assert fresh.cluster_centers_.is_cuda
    assert torch.equal(fresh.predict(x_cpu.cuda()).cpu(), km.labels_)


def test_cuda_sklearn_estimator(x_cpu):
    from torchkm.sklearn import KMeans

    km = KMeans(10, random_state=0, device="cuda").fit(x_cpu.numpy())
    assert isinstance(km.cluster_centers_, np.ndarray) and km.labels_.shape == (len(x_cpu),)


@pytest.mark.parametrize("source", ["pinned", "pageable", "memmap", "bf16"])
def test_cuda_streamed_fit_equals_in_memory(x_and_init, source, tmp_path):
    x_cpu, init = x_and_init
    x = x_cpu.bfloat16() if source == "bf16" else x_cpu
    ref = torchkm.fit(x.cuda(), 40, init=init, max_iter=20, tol=0)
    if source == "pinned":
        x = x.pin_memory()
    elif source == "memmap":
        np.save(tmp_path / "x.npy", x.numpy())
        x = np.load(tmp_path / "x.npy", mmap_mode="r")
    got = torchkm.fit(x, 40, init=init, max_iter=20, tol=0, device="cuda", streaming=True, chunk_rows=4099)
    assert got.centroids.is_cuda and got.labels.device.type == "cpu"
    assert got.n_iter == ref.n_iter
    # Chunks sum in another order than the whole pass (fp32 atomics): near-ties may flip late on.
    assert (got.labels == ref.labels.cpu()).float().mean() > 0.999
    torch.testing.assert_close(got.centroids, ref.centroids, rtol=1e-4, atol=1e-3)


def test_cuda_host_rows_that_fit_are_copied_once(x_cpu):
    # Host rows that fit in GPU memory are fitted as the device copy would be: with deterministic
    # sums (no atomics), the two fits are bit-identical. (k-means||'s quality against k-means++ is
    # a property of the data, tested on fixed data in test_kmeans.py; on fresh blobs the median
    # ratio over 5 seeds ranged 0.93-1.04 and could not hold a bound.)
    host = torchkm.fit(x_cpu, 40, random_state=0, device="cuda", init="k-means||", deterministic=True)
    assert host.centroids.is_cuda and host.labels.is_cuda
    device = torchkm.fit(x_cpu.cuda(), 40, random_state=0, init="k-means||", deterministic=True)
    assert torch.equal(host.labels, device.labels)
    assert torch.equal(host.centroids, device.centroids)
    assert host.n_iter == device.n_iter


def test_cuda_module_with_a_device_labels_host_rows_on_it(x_cpu, tmp_path):
    km = torchkm.KMeans(40, random_state=0, device="cuda").fit(x_cpu)
    assert km.cluster_centers_.is_cuda
    np.save(tmp_path / "x.npy", x_cpu.numpy())
    rows = np.load(tmp_path / "x.npy", mmap_mode="r")
    labels = km.predict(rows)
    assert labels.device.type == "cpu"
    assert torch.equal(labels, km.predict(x_cpu.cuda()).cpu())
    assert km.score(rows) == pytest.approx(km.score(x_cpu.cuda()), rel=1e-5)


def test_float64_moves_make_dense_fits_repeat_and_follow_pruned_fits(monkeypatch):
    """Dense Lloyd with float64 moves (``TORCHKM_DENSE_MOVES=1``): fits of one start repeat to the
    last bit, at a size where the fp32 sums' atomics part repeated fits (seed 000's group B at 16x
    the rows: 633-946 labels and up to 13 iterations apart, H200, 2026-12-05), and take the bounds
    engine's steps: its sums are the same float64 sums, and a row whose best two direct fp32
    distances tie within their rounding is settled in float64 by both engines, whose fp32 sums run
    in other orders (before that, such rows went either way: at 3.9M rows the fits ended 65 and
    3,266 labels apart, H100, 2026-12-05). Random rows as the start, so that some clusters start
    empty and are relocated."""
    monkeypatch.setenv("TORCHKM_DENSE_MOVES", "1")
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 30)))
    n, d, k = 491_520, 32, 1024
    centres = torch.rand(k, d, device="cuda", generator=g)
    x = centres[torch.arange(n, device="cuda") % k] + 0.0125**0.5 * torch.randn(n, d, device="cuda", generator=g)
    start = x[torch.randint(0, n, (k,), device="cuda", generator=g)]
    kw = {"init": start, "max_iter": 60, "tol": 0.0}
    first, again = torchkm.fit(x, k, **kw), torchkm.fit(x, k, **kw)
    assert torch.equal(first.centroids, again.centroids) and torch.equal(first.labels, again.labels)
    assert [h.center_shift for h in first.history] == [h.center_shift for h in again.history]
    pruned = torchkm.fit(x, k, algorithm="pruned", **kw)
    assert {h.kernel for h in pruned.history} == {"pruned"}
    off = int((first.labels != pruned.labels).sum())
    assert off == 0 and first.n_iter == pruned.n_iter, (off, first.n_iter, pruned.n_iter)
    assert torch.equal(first.centroids, pruned.centroids)
