"""Streamed fits: host rows read chunk by chunk, each pass, give the in-memory fit's result.

Without a GPU the chunks "stream" to the CPU, which runs the same piecewise code (the CUDA copy
pipeline itself is tested in test_cuda.py through the device tool).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

import torchkm
from torchkm import _loop
from torchkm._reference import DataView
from torchkm._streaming import StreamedView
from torchkm._validation import as_data_tensor


def _blobs(n=301, d=17, k=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 3 + 5
    x = centres[torch.randint(0, k, (n,), generator=g)] + torch.randn(n, d, generator=g)
    return x, x[torch.randperm(n, generator=g)[:k]].clone()


def _stream_on_cpu(monkeypatch):
    """Make ``fit`` stream host rows to the CPU (there is no GPU to stream to here)."""
    monkeypatch.setattr(_loop, "_streams", lambda x, target, streaming: True)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize(("engine", "chunk"), [
    ("torch", 1), ("torch", 37), ("torch", 10_000),
    # The kernels on CPU tensors need Triton's interpreter; GPU machines stream in test_cuda.py.
    pytest.param("triton", 64, marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1")),
])
def test_streamed_lloyd_equals_in_memory(engine, chunk, monkeypatch):
    monkeypatch.setenv("TORCHKM_ENGINE", engine)
    x, c0 = _blobs()
    offset = x.mean(0)
    memory = DataView(x, torch.float32, offset)
    streamed = StreamedView(x, torch.float32, offset, compute_device=torch.device("cpu"), chunk_rows=chunk)
    assert [stop - start for start, stop, _ in streamed.pieces()][:2] == [min(chunk, 301)] * min(2, -(-301 // chunk))
    a = _loop.lloyd(memory, c0 - offset, sample_weight=None, max_iter=50, tol=0.0)
    b = _loop.lloyd(streamed, c0 - offset, sample_weight=None, max_iter=50, tol=0.0)
    assert a.n_iter == b.n_iter
    assert [h.labels_changed for h in a.history] == [h.labels_changed for h in b.history]
    assert torch.equal(a.labels, b.labels)
    torch.testing.assert_close(a.centroids, b.centroids, rtol=1e-5, atol=1e-5)
    assert b.inertia == pytest.approx(a.inertia, rel=1e-6)


def test_fit_streams_a_memory_mapped_npy_without_copying_it(tmp_path, monkeypatch):
    x, c0 = _blobs(n=500)
    path = tmp_path / "x.npy"
    np.save(path, x.numpy())
    mm = np.load(path, mmap_mode="r")
    assert as_data_tensor(mm, copy_readonly=False).data_ptr() == mm.ctypes.data  # a view of the map
    w = torch.rand(500) + 0.5
    expected = torchkm.fit(x, 7, init=c0, sample_weight=w)
    _stream_on_cpu(monkeypatch)
    got = torchkm.fit(mm, 7, init=c0, sample_weight=w.numpy(), chunk_rows=64)
    assert got.n_iter == expected.n_iter
    assert torch.equal(got.labels, expected.labels)
    torch.testing.assert_close(got.centroids, expected.centroids, rtol=1e-5, atol=1e-4)


def test_streamed_kmeans_plusplus_runs_on_a_logged_sample(monkeypatch, caplog):
    x, _ = _blobs(n=400)
    _stream_on_cpu(monkeypatch)
    with caplog.at_level(logging.INFO, logger="torchkm"):
        out = torchkm.fit(x, 7, random_state=0, chunk_rows=50)
    assert "k-means++ on a uniform sample of 400 of 400 rows" in caplog.text
    assert out.labels.device.type == "cpu" and out.labels.shape == (400,)
    # k-means|| reads every row through the stream instead.
    par = torchkm.fit(x, 7, random_state=0, chunk_rows=50, init="k-means||")
    assert par.inertia <= 1.05 * torchkm.fit(x, 7, random_state=0).inertia


def test_streamed_non_finite_rows_are_named(monkeypatch):
    x, _ = _blobs(n=200)
    x[123, 4] = float("inf")
    _stream_on_cpu(monkeypatch)
    with pytest.raises(ValueError, match="first bad row 123"):
        torchkm.fit(x, 3, chunk_rows=64)


def test_streaming_choice(monkeypatch, caplog):
    x = torch.zeros(10, 3)
    cuda = torch.device("cuda")
    monkeypatch.setattr(_loop, "fits_on_device", lambda x, device: True)
    assert not _loop._streams(x, cuda, None)
    monkeypatch.setattr(_loop, "fits_on_device", lambda x, device: False)
    with caplog.at_level(logging.INFO, logger="torchkm"):
        assert _loop._streams(x, cuda, None)
    assert "does not fit" in caplog.text
    assert not _loop._streams(x, cuda, False)
    assert _loop._streams(x, cuda, True)
    with pytest.raises(ValueError, match="streaming=True needs rows in host memory and a GPU"):
        _loop._streams(x, torch.device("cpu"), True)
    with pytest.raises(TypeError, match="streaming must be None, True or False"):
        _loop._streams(x, cuda, "yes")
    with pytest.raises(ValueError, match="chunk_rows must be >= 1"):
        torchkm.fit(x, 2, chunk_rows=0)


def test_one_streamed_pass_gives_the_mean_and_variance_far_from_the_origin():
    from torchkm._distributed import Comm

    g = torch.Generator().manual_seed(3)
    x = torch.randn(777, 9, generator=g) * 0.05 + 3e3
    w = torch.rand(777, generator=g)
    streamed = StreamedView(x, torch.float32, compute_device=torch.device("cpu"), chunk_rows=100)
    for weights in (None, w):
        mean, variance = _loop._data_mean(streamed, weights, Comm(), with_variance=True)
        expected_mean = _loop._data_mean(DataView(x, torch.float32), weights, Comm())[0]
        expected = _loop._feature_variance_mean(DataView(x, torch.float32, expected_mean), weights, Comm())
        torch.testing.assert_close(mean, expected_mean, rtol=0, atol=1e-3)
        assert variance == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_moments_in_one_pass_match_float64(dtype):
    # What fit uses for unweighted rows in GPU memory (runs on any device): bf16 rows take several
    # converted chunks (merged by Chan's formula), fp32 and fp64 rows one reduction.
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(9_001, 1024, generator=g, dtype=torch.float64) * 0.5 + 2e3).to(dtype)
    data = DataView(x, torch.float64 if dtype == torch.float64 else torch.float32)
    assert dtype != torch.bfloat16 or sum(1 for _ in data.chunks(1024)) > 2
    mean, variance = _loop._moments(data)
    ref = x.double()
    assert mean.dtype == data.dtype
    torch.testing.assert_close(mean.double(), ref.mean(0), rtol=0, atol=2e3 * 2e-6)
    assert variance == pytest.approx(float(ref.var(0, correction=0).mean()), rel=1e-4)
    # Normalised rows: the variance of the unit rows (the mean is unused there).
    unit = DataView(x, data.dtype, normalize=True)
    expected = float((ref / ref.norm(dim=1, keepdim=True)).var(0, correction=0).mean())
    assert _loop._moments(unit)[1] == pytest.approx(expected, rel=1e-3, abs=1e-12)


def test_moments_name_non_finite_rows_and_overflow():
    x = torch.randn(300, 7)
    x[123, 4] = float("nan")
    with pytest.raises(ValueError, match=r"x contains non-finite values.*first bad row 123"):
        _loop._moments(DataView(x, torch.float32))
    big = torch.randn(300, 7) * 3e30
    with pytest.raises(ValueError, match="overflow"):
        _loop._moments(DataView(big, torch.float32))
