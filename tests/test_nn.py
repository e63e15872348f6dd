"""torchkm.nn: VectorQuantizer and ResidualVQ against float64 oracles and hand-computed updates."""

import copy
import datetime
import faulthandler
import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import torchkm
from torchkm.nn import ResidualVQ, VectorQuantizer, perplexity

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _nearest(x, codebook):
    """float64 nearest code of every row (lowest index on ties)."""
    x64 = x.detach().double().reshape(-1, codebook.shape[1])
    d = torch.cdist(x64, codebook.detach().double()) ** 2
    return d.argmin(1)


def _batch(seed, n, d, device="cpu", scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g) * scale).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(7, 3), (2, 5, 3), (2, 3, 4, 3), (3,)])
def test_any_leading_shape_gives_nearest_codes(device, shape):
    vq = VectorQuantizer(5, 3, kmeans_init=False).to(device).eval()
    x = torch.randn(*shape, device=device)
    quantized, indices, loss = vq(x)
    assert quantized.shape == x.shape and quantized.dtype == x.dtype
    assert indices.shape == x.shape[:-1] and indices.dtype == torch.int64
    assert torch.equal(indices.reshape(-1).cpu(), _nearest(x, vq.codebook).cpu())
    torch.testing.assert_close(quantized, vq.get_codes_from_indices(indices))
    expected = ((x - quantized) ** 2).mean() * vq.commitment_weight
    torch.testing.assert_close(loss, expected)


def test_gradient_passes_straight_through():
    vq = VectorQuantizer(8, 4, kmeans_init=False)
    x = torch.randn(10, 4, requires_grad=True)
    quantized, _, loss = vq(x)
    upstream = torch.randn(10, 4)
    (quantized * upstream).sum().backward()
    torch.testing.assert_close(x.grad, upstream)
    x.grad = None
    quantized, _, loss = vq(x)
    loss.backward()
    # d/dx of beta * mean ||x - sg(q)||^2
    torch.testing.assert_close(x.grad, 2 * vq.commitment_weight * (x - quantized).detach() / x.numel())


@pytest.mark.parametrize("engine", ["torch", "kernels"])
@pytest.mark.parametrize("case", ["ema", "learned", "cosine", "eval", "bfloat16", "empty"])
def test_fused_output_and_commitment_equal_the_plain_formulas(case, engine, request):
    """The layer's one-pass straight-through output and commitment loss against ``x + (q - x).detach()``
    and ``mse_loss``: values, and the gradient of a loss using both."""
    device = "cpu"
    if engine == "kernels":
        request.getfixturevalue("kernels")  # CPU tensors through the interpreter; on a GPU, CUDA tensors
        device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(3)
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    vq = VectorQuantizer(7, 5, kmeans_init=False, learnable_codebook=case == "learned",
                         metric="cosine" if case == "cosine" else "euclidean", dead_code_threshold=0.0)
    vq.train(case != "eval")
    vq.to(device)
    x = torch.randn(0 if case == "empty" else 37, 5, generator=g).to(device, dtype).requires_grad_(True)
    codebook_before = vq.codebook.detach().clone()
    (quantized, indices, loss), losses = vq(x, return_loss_breakdown=True)
    upstream = torch.randn(x.shape, generator=g).to(device, dtype)
    (quantized.float() * upstream.float()).sum().add(losses.commitment * 3.0).add(loss * 2.0).backward()
    got_grad = x.grad.clone()

    x.grad = None
    flat = torch.nn.functional.normalize(x, dim=1) if case == "cosine" else x
    codes = torch.nn.functional.embedding(indices, codebook_before)
    ref_quantized = flat + (codes.to(dtype) - flat).detach()
    ref_commitment = torch.nn.functional.mse_loss(flat.float(), codes) if x.shape[0] else flat.float().sum()
    (ref_quantized.float() * upstream.float()).sum().add(ref_commitment * (3.0 + 2.0 * vq.commitment_weight)).backward()
    assert quantized.dtype == dtype and losses.commitment.dtype == torch.float32
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    # The codes themselves (rounded to bf16 as torch rounds, but by the Triton interpreter, which
    # truncates: a unit in the last place).
    exact = engine == "torch" or device == "cuda" or dtype == torch.float32
    torch.testing.assert_close(quantized, codes.to(dtype), atol=0, rtol=0 if exact else 2.0**-7)
    torch.testing.assert_close(quantized, ref_quantized.detach(), **tol)
    torch.testing.assert_close(losses.commitment, ref_commitment.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_grad, x.grad, **tol)


def test_ema_step_matches_hand_computation():
    torch.manual_seed(0)
    vq = VectorQuantizer(6, 3, kmeans_init=False, decay=0.9, eps=1e-5)
    before = {name: buf.clone() for name, buf in vq.named_buffers()}
    x = torch.randn(50, 3)
    _, indices, _ = vq(x)
    onehot = torch.nn.functional.one_hot(indices, 6).float()
    counts, sums = onehot.sum(0), onehot.T @ x
    size = before["cluster_size"] * 0.9 + counts * 0.1
    embed_sum = before["embed_sum"] * 0.9 + sums * 0.1
    total = size.sum()
    smoothed = (size + 1e-5) / (total + 6e-5) * total
    torch.testing.assert_close(vq.cluster_size, size)
    torch.testing.assert_close(vq.embed_sum, embed_sum)
    torch.testing.assert_close(vq.codebook, embed_sum / smoothed[:, None])
    assert torch.equal(indices, _nearest(x, before["codebook"]))  # assigned against the old codebook


@pytest.mark.parametrize("device", DEVICES)
def test_kmeans_init_is_torchkm_fit_of_the_first_batch(device):
    x = _batch(1, 200, 4, device)
    vq = VectorQuantizer(10, 4, seed=3, kmeans_iters=7).to(device)
    assert not bool(vq.initialized)
    before = copy.deepcopy(vq)
    before.initialize(x)
    fitted = torchkm.fit(x, 10, max_iter=7, random_state=3)
    torch.testing.assert_close(before.codebook, fitted.centroids)
    counts = torch.bincount(fitted.labels, minlength=10).float()
    torch.testing.assert_close(before.cluster_size, counts)
    vq(x)
    assert bool(vq.initialized) and vq._initialized


def test_kmeans_init_pools_small_batches():
    vq = VectorQuantizer(30, 2, seed=0)
    batches = [_batch(i, 12, 2) for i in range(3)]
    vq(batches[0])
    vq(batches[1])
    assert not vq._initialized  # 24 < 30 vectors so far: no update yet
    assert torch.equal(vq.cluster_size, torch.ones(30))
    vq(batches[2])
    assert vq._initialized
    # each pooled batch counts as one step: sizes are per-step averages
    assert vq.cluster_size.sum().item() == pytest.approx(36 / 3 * 0.99 + 12 * 0.01, rel=1e-5)


def test_dead_codes_move_onto_batch_vectors():
    torch.manual_seed(0)
    vq = VectorQuantizer(8, 2, kmeans_init=False, dead_code_threshold=0.5, decay=0.5)
    with torch.no_grad():
        vq.codebook[4:] += 100.0  # four codes far from every input: never chosen
        vq.embed_sum.copy_(vq.codebook)
    x = torch.randn(64, 2)
    for _ in range(3):
        vq(x)
    assert vq.dead_codes.item() == 0
    rows = {tuple(r) for r in x.tolist()}
    moved = [tuple(c) for c in vq.codebook[4:].tolist()]
    assert all(c in rows for c in moved) or vq.codebook[4:].abs().max() < 10


def test_cosine_codebook_and_outputs_are_unit():
    vq = VectorQuantizer(12, 5, metric="cosine", seed=0)
    x = _batch(0, 100, 5, scale=3.0)
    for _ in range(3):
        quantized, indices, _ = vq(x)
    torch.testing.assert_close(vq.codebook.norm(dim=1), torch.ones(12))
    torch.testing.assert_close(quantized.norm(dim=1), torch.ones(100))
    vq.eval()
    _, indices = vq(x)[:2]
    unit = torch.nn.functional.normalize(x, dim=1)
    assert torch.equal(indices, (unit @ vq.codebook.T).argmax(1))


def test_learnable_codebook_trains_by_gradient_not_ema():
    torch.manual_seed(0)
    vq = VectorQuantizer(6, 3, learnable_codebook=True, kmeans_init=False)
    assert isinstance(vq.codebook, nn.Parameter) and "codebook" in dict(vq.named_parameters())
    x = torch.randn(40, 3)
    start = vq.codebook.detach().clone()
    out, parts = vq(x, return_loss_breakdown=True)
    assert torch.equal(vq.codebook.detach(), start)  # no EMA
    torch.testing.assert_close(parts.codebook, ((vq.codebook[out.indices] - x) ** 2).mean())
    out.loss.backward()
    assert vq.codebook.grad is not None and vq.codebook.grad.abs().sum() > 0
    optimizer = torch.optim.SGD(vq.parameters(), lr=1.0)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        out, parts = vq(x, return_loss_breakdown=True)
        out.loss.backward()
        optimizer.step()
        losses.append(parts.codebook.item())
    assert losses[-1] < 0.8 * losses[0]


def test_residual_vq_sums_codes_and_shrinks_error():
    torch.manual_seed(0)
    x = torch.randn(4, 60, 6)
    errors = []
    for layers in (1, 2, 4):
        rvq = ResidualVQ(layers, 16, 6, seed=0)
        for _ in range(3):
            out = rvq(x)
        rvq.eval()
        out = rvq(x)
        assert out.indices.shape == (4, 60, layers)
        torch.testing.assert_close(out.quantized, rvq.get_output_from_indices(out.indices), atol=1e-5, rtol=1e-5)
        assert rvq.get_codes_from_indices(out.indices).shape == (4, 60, layers, 6)
        errors.append(((out.quantized - x) ** 2).mean().item())
    assert errors[0] > errors[1] > errors[2]
    x.requires_grad_(True)
    out = ResidualVQ(3, 8, 6, seed=0)(x)
    out.quantized.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))  # one straight-through path, not three


def test_state_dict_resumes_training_exactly():
    torch.manual_seed(0)
    vq = VectorQuantizer(16, 4, seed=0)
    batches = [_batch(i, 64, 4) for i in range(6)]
    for b in batches[:3]:
        vq(b)
    state = copy.deepcopy(vq.state_dict())
    resumed = VectorQuantizer(16, 4, seed=0)
    assert not resumed._initialized
    resumed.load_state_dict(state)
    assert resumed._initialized
    for b in batches[3:]:
        vq(b)
        resumed(b)
    for (name, a), (_, b) in zip(vq.named_buffers(), resumed.named_buffers()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_fullgraph_and_matches_eager(device):
    torch._dynamo.reset()
    torch.manual_seed(0)
    backend = "inductor" if device == "cuda" else "aot_eager"
    vq = VectorQuantizer(16, 8, seed=0).to(device)
    vq(_batch(0, 64, 8, device))  # initialise eagerly
    eager = copy.deepcopy(vq)
    compiled = torch.compile(vq, fullgraph=True, backend=backend)
    for i in range(1, 4):
        x = _batch(i, 64, 8, device).requires_grad_(True)
        got, want = compiled(x), eager(x)
        assert torch.equal(got.indices, want.indices)
        torch.testing.assert_close(got.loss, want.loss)
        (got.quantized.sum() + got.loss).backward()
    torch.testing.assert_close(vq.codebook, eager.codebook)
    # dead-code replacement and eval mode trace too
    revive = VectorQuantizer(16, 8, seed=0, dead_code_threshold=0.5).to(device)
    revive(_batch(0, 64, 8, device))
    torch.compile(revive, fullgraph=True, backend=backend)(_batch(5, 64, 8, device))
    revive.eval()
    torch.compile(revive, fullgraph=True, backend=backend)(_batch(5, 64, 8, device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_keeps_codebook_statistics_in_fp32(device, dtype):
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("CPU autocast is bf16")
    torch.manual_seed(0)
    encoder = nn.Linear(8, 8).to(device)
    vq = VectorQuantizer(16, 8, seed=0).to(device)
    x = torch.randn(128, 8, device=device)
    with torch.autocast(device, dtype=dtype):
        vq(encoder(x))
        codebook = vq.codebook.clone()
        z = encoder(x)
        quantized, indices, loss = vq(z)
    assert z.dtype == dtype and quantized.dtype == dtype and loss.dtype == torch.float32
    for name, buf in vq.named_buffers():
        if buf.is_floating_point():
            assert buf.dtype == torch.float32, name
    assert torch.equal(indices.cpu(), _nearest(z.float(), codebook).cpu())
    loss.backward()
    assert encoder.weight.grad is not None


@pytest.mark.parametrize("engine", ["torch", "kernels"])
@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("metric,threshold", [("euclidean", 0.0), ("euclidean", 3.0), ("cosine", 3.0)])
def test_a_batch_with_a_non_finite_row_leaves_the_codebook_as_it_was(engine, bad, metric, threshold, request):
    """One NaN had made a code NaN for good (its EMA sum), silently; now that batch updates nothing
    (an AMP step with Inf activations, which the scaler skips, must not poison the codebook), its
    loss is not finite, and the next finite batch trains on as from the last finite one."""
    device = "cpu"
    if engine == "kernels":
        request.getfixturevalue("kernels")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    vq = VectorQuantizer(6, 5, seed=0, metric=metric, decay=0.7, dead_code_threshold=threshold).to(device)
    clean = VectorQuantizer(6, 5, seed=0, metric=metric, decay=0.7, dead_code_threshold=threshold).to(device)
    first, later = _batch(1, 41, 5, device), _batch(2, 41, 5, device)
    torch.manual_seed(5)
    vq(first)
    torch.manual_seed(5)
    clean(first)
    state = {name: t.clone() for name, t in vq.named_buffers()}
    poisoned = later.clone()
    poisoned[7, 2] = float(bad)
    out = vq(poisoned)
    assert not torch.isfinite(out.loss)
    for name, t in vq.named_buffers():
        assert torch.equal(t, state[name]), name
    torch.manual_seed(6)
    vq(later)
    torch.manual_seed(6)
    clean(later)
    for (name, t), ref in zip(vq.named_buffers(), clean.buffers()):
        assert torch.isfinite(t.float()).all(), name
        torch.testing.assert_close(t, ref, rtol=1e-5, atol=1e-6)


def test_bad_input_and_parameters_are_rejected():
    vq = VectorQuantizer(4, 3)
    with pytest.raises(ValueError, match=r"\(\.\.\., 3\)"):
        vq(torch.randn(5, 4))
    with pytest.raises(TypeError, match="floating-point"):
        vq(torch.ones(5, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="num_codes"):
        VectorQuantizer(0, 3)
    with pytest.raises(ValueError, match="decay"):
        VectorQuantizer(4, 3, decay=1.0)
    with pytest.raises(ValueError, match="metric"):
        VectorQuantizer(4, 3, metric="manhattan")
    with pytest.raises(ValueError, match="precision"):
        VectorQuantizer(4, 3, precision="tf32")
    with pytest.raises(TypeError, match="integer"):
        vq.get_codes_from_indices(torch.zeros(3))
    with pytest.raises(ValueError, match="quantizers"):
        ResidualVQ(2, 4, 3).get_codes_from_indices(torch.zeros(5, 3, dtype=torch.int64))


def test_perplexity():
    assert perplexity(torch.ones(8)).item() == pytest.approx(8.0)
    assert perplexity(torch.tensor([5.0, 0.0, 0.0])).item() == pytest.approx(1.0)
    assert perplexity(torch.tensor([0, 1, 2, 3]), 4).item() == pytest.approx(4.0)
    with pytest.raises(ValueError):
        perplexity(torch.tensor([0, 1]))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("precision,metric,threshold", [("exact", "euclidean", 0.0), ("fast", "euclidean", 0.0),
                                                        ("exact", "euclidean", 4.0), ("exact", "cosine", 4.0)])
def test_training_steps_through_kernels_match_torch_engine(monkeypatch, precision, metric, threshold):
    """The kernels' training step (assignment, then the fused EMA update with dead-code revival)
    gives the torch engine's codes, losses and codebook statistics, step after step."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = [_batch(i, 77, 17, device) + 5.0 for i in range(3)]
    runs = {}
    for engine in ("torch", "triton"):
        monkeypatch.setenv("TORCHKM_ENGINE", engine)
        vq = VectorQuantizer(7, 17, seed=0, precision=precision, metric=metric, decay=0.6,
                             dead_code_threshold=threshold).to(device)
        torch.manual_seed(1)  # the same replacement rows for both engines
        outs = [vq(b) for b in batches]
        runs[engine] = (vq, outs)
    (ref, ref_outs), (got, got_outs) = runs["torch"], runs["triton"]
    for a, b in zip(got_outs, ref_outs):
        if precision == "exact" or device == "cpu":
            assert torch.equal(a.indices, b.indices)
        # Codebooks after a step agree to rounding (sums added in another order).
        torch.testing.assert_close(a.quantized, b.quantized, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-4, atol=1e-6)
    for name in ("codebook", "embed_sum", "cluster_size"):
        torch.testing.assert_close(getattr(got, name), getattr(ref, name), rtol=1e-4, atol=1e-4)
    if threshold:
        assert 0 < int((ref.cluster_size == threshold).sum()) == int((got.cluster_size == threshold).sum())


# -- torch.distributed (gloo, two CPU processes) ----------------------------------------------------


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str, threshold: float) -> None:
    faulthandler.dump_traceback_later(90, exit=True)  # a hung rank shows where it hangs, then ends
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(100 + rank)  # ranks draw different replacement rows: the collective must agree
        encoder = nn.Linear(4, 4)
        torch.nn.init.eye_(encoder.weight)
        torch.nn.init.zeros_(encoder.bias)
        vq = VectorQuantizer(12, 4, seed=0, dead_code_threshold=threshold, decay=0.8)
        # No buffer broadcast: the quantizer's own collective must keep the codebooks equal.
        model = nn.parallel.DistributedDataParallel(nn.Sequential(encoder, vq), broadcast_buffers=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(4):
            x = _batch(10 * step + rank, 40, 4)
            quantized, _, loss = model(x)
            optimizer.zero_grad()
            (loss + quantized.square().mean()).backward()
            optimizer.step()
        torch.save({k: v.clone() for k, v in vq.state_dict().items()} | {"weight": encoder.weight.detach().clone()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
        # DDP's reducer must go before its process group: torn down the other way round, with the
        # frame's locals, it can block the process forever (seen once in a full-suite run).
        del model, optimizer
    finally:
        dist.destroy_process_group()
    os._exit(0)  # nothing left to tear down that matters; never hang on exit


@pytest.mark.parametrize("threshold", [0.0, 2.0])
def test_ddp_ranks_hold_one_codebook(tmp_path, threshold):
    context = mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path), threshold), nprocs=2,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + 180  # a hung rendezvous must fail the test, never stall CI
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two gloo ranks did not finish within 180 s")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for key in ("codebook", "cluster_size", "embed_sum", "initialized", "weight"):
        assert torch.equal(r0[key], r1[key]), key
    if threshold:
        return
    # Without random replacements, two ranks equal one process that sees both halves of each batch.
    torch.manual_seed(0)
    encoder = nn.Linear(4, 4)
    torch.nn.init.eye_(encoder.weight)
    torch.nn.init.zeros_(encoder.bias)
    vq = VectorQuantizer(12, 4, seed=0, decay=0.8)
    model = nn.Sequential(encoder, vq)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        x = torch.cat([_batch(10 * step + r, 40, 4) for r in range(2)])
        quantized, _, loss = model(x)
        optimizer.zero_grad()
        (loss + quantized.square().mean()).backward()
        optimizer.step()
    torch.testing.assert_close(r0["codebook"], vq.codebook, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r0["cluster_size"], vq.cluster_size * 1.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r0["weight"], encoder.weight.detach(), rtol=1e-5, atol=1e-5)


# -- KMeans.partial_fit -----------------------------------------------------------------------------


def test_partial_fit_matches_scikit_learn_minibatch():
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 5)).astype(np.float32)
    w = rng.random(3000).astype(np.float32)
    init = x[:8].copy()
    ref = sklearn_cluster.MiniBatchKMeans(8, init=init, n_init=1, reassignment_ratio=0.0)
    km = torchkm.KMeans(8, init=torch.from_numpy(init))
    for i in range(10):
        rows = slice(300 * i, 300 * (i + 1))
        ref.partial_fit(x[rows], sample_weight=w[rows])
        assert km.partial_fit(x[rows], sample_weight=w[rows]) is km
    np.testing.assert_allclose(km.cluster_centers_.numpy(), ref.cluster_centers_, rtol=1e-5, atol=1e-5)
    assert np.array_equal(km.labels_.numpy(), ref.labels_)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-5)
    assert km.n_steps_ == ref.n_steps_ == 10


def test_partial_fit_initialises_refines_and_resumes():
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(2000, 3)).astype(np.float32))
    km = torchkm.KMeans(5, random_state=0)
    with pytest.raises(ValueError):
        km.partial_fit(x[:3])  # fewer rows than clusters for the initialisation
    km.partial_fit(x[:400])
    first = km.cluster_centers_.clone()
    state = copy.deepcopy(km.state_dict())
    km.partial_fit(x[400:800])
    resumed = torchkm.KMeans(5)
    resumed.load_state_dict(state)
    resumed.partial_fit(x[400:800])
    assert torch.equal(resumed.cluster_centers_, km.cluster_centers_)
    assert resumed.n_steps_ == km.n_steps_ == 2
    assert not torch.equal(first, km.cluster_centers_)
    # After fit, batches refine the fitted centroids instead of replacing them.
    fitted = torchkm.KMeans(5, random_state=0).fit(x)
    before = fitted.cluster_centers_.clone()
    fitted.partial_fit(x[:200])
    assert (fitted.cluster_centers_ - before).abs().max() < 0.1
    with pytest.raises(ValueError, match="features"):
        fitted.partial_fit(torch.randn(10, 4))


def test_partial_fit_cosine_keeps_unit_centroids():
    x = torch.randn(500, 4)
    km = torchkm.KMeans(3, metric="cosine", random_state=0)
    for i in range(5):
        km.partial_fit(x[100 * i : 100 * (i + 1)])
    torch.testing.assert_close(km.cluster_centers_.norm(dim=1), torch.ones(3))


def test_replayed_steps_survive_deepcopy_and_pickle_and_empty_cache():
    import pickle

    vq = VectorQuantizer(6, 3, kmeans_init=False)
    vq._replayed.entries[("a key",)] = None
    assert not copy.deepcopy(vq)._replayed.entries
    assert not pickle.loads(pickle.dumps(vq))._replayed.entries
    torchkm._ops._replay_holders.add(vq._replayed)
    torchkm.empty_cache()
    assert not vq._replayed.entries


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize(("n", "dim", "codes", "dtype", "threshold"), [
    (4099, 64, 512, torch.float32, 0.0), (4099, 64, 512, torch.float32, 2.0),
    (3001, 3, 40, torch.float32, 0.0), (2048, 256, 1000, torch.bfloat16, 0.5)])
@pytest.mark.parametrize("addresses", ["same", "moving"])
def test_training_steps_replay_as_cuda_graphs(monkeypatch, precision, n, dim, codes, dtype, threshold, addresses):
    """From a shape's second training step on, the EMA step is a replayed CUDA graph: one reading
    the batch in place while batches come at the address it was captured with (``"same"``),
    another copying it in for batches elsewhere (``"moving"``). Each step (fresh values, both
    layers starting from the same state and CUDA seed) gives what an eager twin
    (``TORCHKM_REPLAY_QUERIES=0``) gives: codes, quantized output, loss, input gradient, codebook
    statistics (sums through atomics: to 1e-5), dead codes revived on the same rows; the graphs'
    outputs are poisoned before a replay, and what a step hands out is not the graph's."""
    rng = np.random.default_rng()
    replayed = VectorQuantizer(codes, dim, kmeans_init=False, precision=precision,
                               dead_code_threshold=threshold).cuda().train()
    eager = copy.deepcopy(replayed)
    handed_out, batches = [], []
    storage = torch.empty(n, dim, device="cuda", dtype=dtype)
    for step in range(5):
        eager.load_state_dict(replayed.state_dict())  # (in place: the buffers keep their addresses)
        values = torch.from_numpy(rng.standard_normal((n, dim), dtype=np.float32)).cuda().to(dtype)
        if addresses == "same":  # a new leaf on the same memory each step
            x = storage.detach().copy_(values).requires_grad_()
        else:  # earlier batches stay alive: every batch lies elsewhere
            x = values.requires_grad_()
            batches.append(x)
        x_eager = x.detach().clone().requires_grad_()
        seed = int(rng.integers(1 << 31))
        for entry in replayed._replayed.entries.values():
            for call in entry or ():
                if call.graph is not None:
                    labels, codebook, sq_total = call.outputs
                    labels.fill_(-1)
                    codebook.fill_(float("nan"))
                    sq_total.fill_(float("nan"))
        torch.cuda.manual_seed(seed)
        out, parts = replayed(x, return_loss_breakdown=True)
        monkeypatch.setenv("TORCHKM_REPLAY_QUERIES", "0")
        torch.cuda.manual_seed(seed)
        want, want_parts = eager(x_eager, return_loss_breakdown=True)
        monkeypatch.delenv("TORCHKM_REPLAY_QUERIES")
        (out.quantized.float().square().mean() + out.loss).backward()
        (want.quantized.float().square().mean() + want.loss).backward()
        (entry,) = replayed._replayed.entries.values()
        assert (entry is not None) == (step >= 1)
        served = None
        if entry is not None:
            in_place, copying = entry
            assert not in_place.failed and not copying.failed and in_place.graph is not None
            # Step 1 captures the in-place graph; moving batches then take the copying one.
            assert (copying.graph is not None) == (addresses == "moving" and step >= 2)
            served = copying if addresses == "moving" and step >= 2 else in_place
        assert torch.equal(out.indices, want.indices)
        assert torch.equal(out.quantized, want.quantized)
        torch.testing.assert_close(parts.commitment, want_parts.commitment, rtol=1e-5, atol=0)
        torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=0)
        torch.testing.assert_close(x.grad, x_eager.grad, rtol=1e-5, atol=1e-7)
        for name in ("cluster_size", "embed_sum", "codebook"):
            torch.testing.assert_close(getattr(replayed, name), getattr(eager, name), rtol=1e-5, atol=1e-5)
        if served is not None:
            assert out.indices.data_ptr() != served.outputs[0].data_ptr()
            assert out.quantized.data_ptr() != served.outputs[1].data_ptr()
        handed_out.append(out.quantized)
    assert len({t.data_ptr() for t in handed_out}) == len(handed_out)
    if threshold:
        assert replayed.dead_codes == eager.dead_codes
