"""The pure-torch engine against float64 brute force, on random and odd shapes."""

import numpy as np
import pytest
import torch

from tests.helpers import assert_labels_match_except_near_ties, f64_sq_distances
from torchkm._reference import DataView, assign, update


@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_assign_matches_float64_argmin(rng, d, k):
    n = 1237  # not a multiple of any block or chunk
    x = rng.standard_normal((n, d)).astype(np.float32)
    c = rng.standard_normal((k, d)).astype(np.float32)
    labels, sq = assign(DataView(torch.from_numpy(x), torch.float32), torch.from_numpy(c))
    assert labels.dtype == torch.int64 and labels.shape == (n,)
    assert sq.dtype == torch.float32 and bool((sq >= 0).all())
    assert_labels_match_except_near_ties(x, c, labels.numpy(), f64_sq_distances(x, c).argmin(1))
    exact = f64_sq_distances(x, c)[np.arange(n), labels.numpy()]
    np.testing.assert_allclose(sq.numpy(), exact, rtol=1e-4, atol=1e-4 * d)


def test_assign_float64_is_exact(rng):
    x = rng.standard_normal((501, 13))
    c = rng.standard_normal((37, 13))
    labels, sq = assign(DataView(torch.from_numpy(x), torch.float64), torch.from_numpy(c))
    ref = f64_sq_distances(x, c)
    np.testing.assert_array_equal(labels.numpy(), ref.argmin(1))
    np.testing.assert_allclose(sq.numpy(), ref.min(1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_identical_centroids_tie_to_the_first_copy(rng, dtype):
    """Copies of a centroid tie for every row: each row goes to the lowest index of its winner's
    copies, though the GEMM may round the copies' columns differently (on the CPU, copies of two of
    five centroids left one cluster empty, not two), and only copies count (near-copies do not)."""
    from torchkm._reference import first_copies

    x = torch.from_numpy(rng.standard_normal((1237, 5))).to(dtype)
    base = torch.from_numpy(rng.standard_normal((3, 5))).to(dtype)
    c = torch.cat([base, base[:2], base[2:] + 1e-3])  # 3 and 4 copy 0 and 1; 5 is near 2
    labels, sq = assign(DataView(x, dtype), c)
    assert set(labels.unique().tolist()) <= {0, 1, 2, 5} and not bool(((labels == 3) | (labels == 4)).any())
    single, single_sq = assign(DataView(x, dtype), torch.cat([base, base[2:] + 1e-3]))
    torch.testing.assert_close(labels, torch.where(single == 3, 5, single))
    torch.testing.assert_close(sq, single_sq)
    assert first_copies(base, torch.linalg.vecdot(base, base)) is None
    assert first_copies(c, torch.linalg.vecdot(c, c)).tolist() == [0, 1, 2, 0, 1, 5]


def test_assign_chunking_does_not_change_results(rng):
    x = torch.from_numpy(rng.standard_normal((1000, 9)).astype(np.float32))
    c = torch.from_numpy(rng.standard_normal((50, 9)).astype(np.float32))
    whole = assign(DataView(x, torch.float32), c, chunk_size=10_000)
    for chunk in (1, 7, 333):
        part = assign(DataView(x, torch.float32), c, chunk_size=chunk)
        assert torch.equal(whole[0], part[0])
        torch.testing.assert_close(whole[1], part[1])


def test_ties_go_to_the_lowest_index():
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]])
    labels, _ = assign(DataView(x, torch.float32), c)
    assert labels.tolist() == [0, 1, 0, 0]


def test_offset_and_normalisation_are_applied_per_chunk(rng):
    x = torch.from_numpy(rng.standard_normal((300, 5)))
    offset = torch.from_numpy(rng.standard_normal(5))
    view = DataView(x, torch.float64, offset, normalize=True)
    expected = (x - offset) / (x - offset).norm(dim=1, keepdim=True)
    got = torch.cat([rows for _, _, rows in view.chunks(5, chunk_size=7)])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(view.take(torch.tensor([3, 0, 299])), expected[[3, 0, 299]])


@pytest.mark.parametrize("normalize", [False, True])
def test_resident_rows_give_the_results_of_transforming_each_chunk(rng, monkeypatch, normalize):
    """Small CPU data is transformed once per view and kept (``DataView.resident``): assignment,
    sums, distances to points and taken rows equal those of views that transform every chunk."""
    import torchkm._reference as reference
    from torchkm import _ops

    x = torch.from_numpy(rng.standard_normal((1003, 11)).astype(np.float32) + 5.0)
    offset = x.double().mean(0).float()
    c = torch.from_numpy(rng.standard_normal((23, 11)).astype(np.float32))
    index = torch.tensor([1002, 0, 17, 17])

    def results():
        view = DataView(x, torch.float32, offset, normalize)
        labels, sq = assign(view, c, chunk_size=97)
        sums, counts = update(view, labels, 23, chunk_size=101)
        return view, (labels, sq, sums, counts, _ops.sq_distances_to(view, c[:3]), view.take(index))

    kept_view, kept = results()
    assert kept_view.resident is not None and kept_view.resident_sq_norms is not None
    monkeypatch.setattr(reference, "_RESIDENT_ELEMENTS", 0)
    view, each = results()
    assert view.resident is None
    for a, b in zip(kept, each):
        assert torch.equal(a, b)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_labelled_sq_distances_are_the_assigned_rows_distances(rng, normalize, dtype):
    """``_ops.labelled_sq_distances`` (what a fit relocating empty clusters ranks rows by): each
    row's distance to the centroid it was given, directly as ``assign`` computes its winners' (the
    same values for the same labels), for any labels, in memory and streamed in pieces."""
    from torchkm import _ops
    from torchkm._streaming import StreamedView

    x = torch.from_numpy(rng.standard_normal((1003, 11)).astype(np.float32) + 5.0).to(dtype)
    offset = x.double().mean(0).float()
    c = torch.from_numpy(rng.standard_normal((23, 11)).astype(np.float32))
    if normalize:
        c = c / c.norm(dim=1, keepdim=True)
    view = DataView(x, torch.float32, offset, normalize)
    labels, sq = assign(view, c, chunk_size=97)
    torch.testing.assert_close(_ops.labelled_sq_distances(view, c, labels.to(torch.int32)), sq, rtol=1e-6, atol=1e-6)
    other = torch.from_numpy(rng.integers(0, 23, size=1003))
    rows = view.transform(x)
    want = ((rows.double() - c.double()[other]) ** 2).sum(1).float()
    torch.testing.assert_close(_ops.labelled_sq_distances(view, c, other), want, rtol=1e-5, atol=1e-5)
    streamed = StreamedView(x, torch.float32, offset, normalize, compute_device=torch.device("cpu"), chunk_rows=100)
    torch.testing.assert_close(_ops.labelled_sq_distances(streamed, c, other), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_update_sums_and_counts(rng, k, weighted):
    n, d = 2011, 17
    x = rng.standard_normal((n, d)).astype(np.float32)
    labels = rng.integers(0, k, size=n)
    w = rng.uniform(0, 2, size=n) if weighted else np.ones(n)
    sums, counts = update(
        DataView(torch.from_numpy(x), torch.float32), torch.from_numpy(labels), k,
        torch.from_numpy(w) if weighted else None, chunk_size=97,
    )
    ref_sums = np.zeros((k, d))
    np.add.at(ref_sums, labels, x.astype(np.float64) * w[:, None])
    ref_counts = np.bincount(labels, weights=w, minlength=k)
    np.testing.assert_allclose(sums.numpy(), ref_sums, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(counts.numpy(), ref_counts, rtol=1e-12)


def test_half_precision_inputs_are_computed_in_float32(rng):
    x32 = rng.standard_normal((400, 16)).astype(np.float32)
    c = torch.from_numpy(rng.standard_normal((9, 16)).astype(np.float32))
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.from_numpy(x32).to(dtype)
        labels, sq = assign(DataView(x, torch.float32), c)
        assert sq.dtype == torch.float32
        # The oracle is float64 on the same rounded inputs.
        xr = x.double().numpy()
        assert_labels_match_except_near_ties(xr, c.numpy(), labels.numpy(), f64_sq_distances(xr, c.numpy()).argmin(1))
