"""triton_kernels/seeding.py (greedy k-means++ on the device) against its pure-torch reference."""

import math

import pytest
import torch
from torchkm._kernels.seeding import PlusPlus, _margin, kmeans_plusplus, kmeans_plusplus_reference

from tests.kernels.conftest import DEVICE, ON_GPU


def _problem(n, d, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * 3 + 1
    uniforms = torch.rand(k, 2 + int(math.log(k)), generator=g, dtype=torch.float64)
    first = torch.randint(0, n, (1,), generator=g)
    return g, x.to(DEVICE), uniforms, first.to(DEVICE)


@pytest.mark.parametrize("d", [1, 3, 17, 129, 300])  # 300: wider than a tile, read by chunks
@pytest.mark.parametrize("k", [1, 7])
def test_kmeans_plusplus_picks_the_references_rows(d, k):
    # 331 rows in blocks of 64 (the last one short), tiles of 16 rows.
    g, x, uniforms, first = _problem(331, d, k, seed=d * 1000 + k)
    want = kmeans_plusplus_reference(x, k, first, uniforms)
    got = kmeans_plusplus(x, k, first, uniforms, block_rows=64, block_n=16)
    assert got.tolist() == want.tolist()
    assert len(set(got.tolist())) == k  # distinct random rows: never a chosen one again


# Under the interpreter a step costs about 0.1 s, so the long runs take larger tiles, and the
# thousand centroids run on GPUs only.
@pytest.mark.parametrize("k", [40, pytest.param(1000, marks=pytest.mark.skipif(not ON_GPU, reason="slow interpreted"))])
def test_kmeans_plusplus_picks_the_references_rows_over_many_steps(k):
    g, x, uniforms, first = _problem(1003, 17, k, seed=k)
    want = kmeans_plusplus_reference(x, k, first, uniforms)
    assert kmeans_plusplus(x, k, first, uniforms, block_rows=512, block_n=128).tolist() == want.tolist()
    assert kmeans_plusplus(x, k, first, uniforms, graphs=ON_GPU).tolist() == want.tolist()  # default tiles


@pytest.mark.parametrize("transform", ["offset", "row_scale", "weights"])
def test_kmeans_plusplus_with_offset_row_scale_and_weights(transform):
    g, x, uniforms, first = _problem(301, 5, 12, seed=7)
    kw = {
        "offset": {"offset": torch.full((5,), 1.0).to(DEVICE)},
        "row_scale": {"row_scale": (torch.rand(301, generator=g) + 0.5).to(DEVICE)},
        # A third of the rows weigh nothing: never drawn.
        "weights": {"sample_weight": (torch.rand(301, generator=g) * (torch.arange(301) % 3 != 0)).to(DEVICE)},
    }[transform]
    want = kmeans_plusplus_reference(x, 12, first, uniforms, **kw)
    got = kmeans_plusplus(x, 12, first, uniforms, block_rows=128, block_n=32, **kw)
    assert got.tolist() == want.tolist()
    if transform == "weights":
        assert all(r % 3 != 0 for r in got[1:].tolist())


def test_kmeans_plusplus_takes_each_distinct_row_before_repeating_one():
    # 6 distinct points, each stored 50 times: D^2 is exactly 0 at a chosen point's copies, so the
    # first 6 centroids are the 6 points; then every potential is 0 and the draws land on row 0.
    g = torch.Generator().manual_seed(3)
    points = torch.randn(6, 4, generator=g) * 5
    x = points.repeat(50, 1).to(DEVICE)
    uniforms = torch.rand(9, 4, generator=g, dtype=torch.float64)
    first = torch.tensor([7], device=DEVICE)
    got = kmeans_plusplus(x, 9, first, uniforms, block_rows=64, block_n=16)
    assert got.tolist() == kmeans_plusplus_reference(x, 9, first, uniforms).tolist()
    assert len({r % 6 for r in got[:6].tolist()}) == 6
    assert got[6:].tolist() == [0, 0, 0]


def _run(x, k, first, uniforms, **kw):
    state = PlusPlus(x, k, uniforms, block_rows=256, block_n=32, **kw)
    state.start(first)
    state.steps(k - 1)
    return state


# screen: the tensor-core lower bounds before the exact distances (by default from 32 features).
@pytest.mark.parametrize(("d", "screen"), [(1, False), (3, False), (17, False), (17, True), (40, True)])
def test_kmeans_plusplus_settles_rows_by_the_triangle_inequality(d, screen):
    # 12 tight blobs, 30 centroids: once a blob holds a centroid, a trial in another blob cannot come
    # nearer to its rows, which the steps then leave unread. The rows must still be the reference's.
    g = torch.Generator().manual_seed(d)
    centres = torch.rand(12, d, generator=g) * 10
    x = (centres[torch.randint(0, 12, (600,), generator=g)] + 0.05 * torch.randn(600, d, generator=g)).to(DEVICE)
    uniforms = torch.rand(30, 5, generator=g, dtype=torch.float64)
    first = torch.tensor([11], device=DEVICE)
    state = _run(x, 30, first, uniforms, screen=screen)
    assert state.rows.tolist() == kmeans_plusplus_reference(x, 30, first, uniforms).tolist()
    listed, recomputed = state.rows_read(), state.rows_recomputed()
    assert 0 < listed < 0.5 * 600 * 29
    assert recomputed < listed if screen else recomputed == listed


def test_kmeans_plusplus_settles_rows_exactly_on_a_grid_with_weights_offset_and_scale():
    # Integer points: exact ties between distances, trials at exactly twice a row's distance from its
    # centroid (where the triangle inequality is an equality), and repeated points.
    g = torch.Generator().manual_seed(4)
    grid = torch.stack(torch.meshgrid(torch.arange(6.0), torch.arange(6.0), indexing="ij"), -1).reshape(-1, 2)
    x = grid[torch.randint(0, 36, (500,), generator=g)].to(DEVICE)
    uniforms = torch.rand(30, 5, generator=g, dtype=torch.float64)
    first = torch.tensor([3], device=DEVICE)
    kw = {"offset": torch.tensor([0.5, -2.0], device=DEVICE),
          "row_scale": (torch.randint(1, 3, (500,), generator=g) * 0.5).to(DEVICE),
          "sample_weight": (torch.randint(0, 3, (500,), generator=g)).float().to(DEVICE)}
    for keys in ([], ["offset", "row_scale", "sample_weight"]):
        chosen = {key: kw[key] for key in keys}
        state = _run(x, 30, first, uniforms, screen=True, **chosen)
        assert state.rows.tolist() == kmeans_plusplus_reference(x, 30, first, uniforms, **chosen).tolist()
        assert state.rows_read() < 500 * 29


def test_margin_covers_fp32_rounding():
    # The factor grows with the features (rounding of longer sums) and stays far below what would
    # change which rows are read.
    assert 4.0 < _margin(1) < _margin(768) < _margin(4096) < 4.01


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs")
def test_kmeans_plusplus_replayed_as_graphs_equals_eager_steps():
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(100_003, 32, device="cuda", generator=g).to(torch.bfloat16)
    uniforms = torch.rand(300, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    first = torch.tensor([17], device="cuda")
    offset = x.float().mean(0)
    eager = kmeans_plusplus(x, 300, first, uniforms, offset=offset)
    replayed = kmeans_plusplus(x, 300, first, uniforms, offset=offset, graphs=True)
    assert torch.equal(eager, replayed)
    assert eager.unique().numel() == 300
    small = x[:2000]
    assert kmeans_plusplus(small, 200, first, uniforms[:200], offset=offset, graphs=True).tolist() == \
        kmeans_plusplus_reference(small, 200, first, uniforms[:200], offset=offset).tolist()


@pytest.mark.skipif(not ON_GPU, reason="the screen's rounding bound, on real tensor cores")
@pytest.mark.parametrize(("data", "dtype"), [("blobs", torch.bfloat16), ("noise", torch.float32)])
def test_screened_kmeans_plusplus_on_wide_rows_picks_the_references_rows(data, dtype):
    g = torch.Generator(device="cuda").manual_seed(9)
    n, d, k = 20_000, 768, 300
    if data == "blobs":
        centres = torch.rand(k, d, device="cuda", generator=g)
        x = centres[torch.randint(0, k, (n,), device="cuda", generator=g)] + 0.05 * torch.randn(
            n, d, device="cuda", generator=g)
    else:
        x = torch.randn(n, d, device="cuda", generator=g) * 2 + 1
    x = x.to(dtype)
    offset = x.float().mean(0)
    uniforms = torch.rand(k, 2 + int(math.log(k)), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    first = torch.tensor([3], device="cuda")
    assert not PlusPlus(x, k, uniforms, offset=offset).screen  # wide rows, too few of them for the default
    state = PlusPlus(x, k, uniforms, offset=offset, screen=True)
    state.start(first)
    state.steps(k - 1)
    assert state.rows.tolist() == kmeans_plusplus_reference(x, k, first, uniforms, offset=offset).tolist()
    assert state.rows_recomputed() < state.rows_read()
