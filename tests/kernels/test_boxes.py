"""triton_kernels/boxes.py: curve keys, candidate lists and the box pass against pure-torch
references and the dense small-d pass (Triton interpreter on CPU, or a GPU)."""

import pytest
import torch
from torchkm._kernels import boxes
from torchkm._kernels.assign import assign

from tests.kernels.conftest import DEVICE


def _rows(n, d, k, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(n, d, generator=g)
    c = x[torch.randint(0, n, (k,), generator=g)] + 0.1 * torch.randn(k, d, generator=g)
    return x.to(DEVICE), c.to(DEVICE)


def _sorted_tiles(x, c, block_n):
    order = torch.argsort(boxes.curve_keys(x))
    xs = x[order].contiguous()
    lo, hi = boxes.tile_boxes(xs, block_n)
    tiles = lo.shape[0]
    cand = torch.full((tiles, boxes.MAX_CANDIDATES), -1, dtype=torch.int32, device=x.device)
    count = torch.zeros(tiles, dtype=torch.int32, device=x.device)
    tallies = (torch.zeros(1, dtype=torch.int32, device=x.device), torch.zeros(1, dtype=torch.int32, device=x.device))
    boxes.candidates(lo, hi, c, cand, count, tallies)
    return xs, lo, hi, cand, count, tallies


@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
def test_curve_keys_match_reference_and_group_near_rows(d):
    x, _ = _rows(517, d, 1, d)
    offset = torch.linspace(-1, 1, d, device=DEVICE)
    lo, inv = boxes._key_grid(x, offset, None)
    keys = boxes.curve_keys(x, offset)
    assert keys.dtype == torch.int32 and int(keys.min()) >= 0
    assert torch.equal(keys, boxes.curve_keys_reference(x - offset, lo, inv))
    # Sorted along the curve, consecutive rows are far closer than rows in the given order.
    xs = x[torch.argsort(keys)]
    assert float((xs[1:] - xs[:-1]).norm(dim=1).mean()) < 0.75 * float((x[1:] - x[:-1]).norm(dim=1).mean())


def test_curve_keys_reject_wide_rows():
    with pytest.raises(ValueError, match="1 to 8 features"):
        boxes.curve_keys(torch.zeros(4, 9, device=DEVICE))


@pytest.mark.parametrize("n,d,k", [(1000, 2, 7), (777, 1, 5), (501, 3, 33), (300, 8, 4), (650, 5, 1), (390, 4, 1000)])
def test_candidate_lists_match_reference_and_hold_every_true_nearest(n, d, k):
    x, c = _rows(n, d, k, n + d)
    xs, lo, hi, cand, count, tallies = _sorted_tiles(x, c, 16)
    mask = boxes.candidates_reference(lo, hi, c)
    assert torch.equal(count.long(), mask.sum(1))
    listed = count <= boxes.MAX_CANDIDATES
    for t in torch.nonzero(listed).flatten().tolist():
        m = int(count[t])
        assert cand[t, :m].tolist() == mask[t].nonzero().flatten().tolist()  # increasing order
    assert int(tallies[0]) == int(torch.where(listed, count, k).sum())
    assert int(tallies[1]) == int((~listed).sum())
    # Every row's float64 nearest centroid is a candidate of its tile.
    nearest = torch.cdist(xs.double(), c.double()).argmin(1)
    tile = torch.arange(n, device=DEVICE) // 16
    assert bool(mask[tile, nearest].all())


@pytest.mark.parametrize("n,d,k", [(1000, 2, 7), (777, 1, 5), (501, 3, 33), (300, 8, 4), (650, 5, 1), (390, 4, 100)])
@pytest.mark.parametrize("weighted", [False, True])
def test_box_pass_equals_dense_small_d_pass(n, d, k, weighted):
    x, c = _rows(n, d, k, 2 * n + d)
    xs, lo, hi, cand, count, _ = _sorted_tiles(x, c, 16)
    w = torch.rand(n, generator=torch.Generator().manual_seed(n)).to(DEVICE) if weighted else None
    tiles = lo.shape[0]
    tiles_per_program = -(-tiles // 3)  # several tiles per program, the last program short
    programs = -(-tiles // tiles_per_program)
    # Previous labels: half the rows already on their label, the rest elsewhere.
    dense = assign(xs, c, sample_weight=w)
    prev = dense.labels.to(torch.int32).clone()
    prev[::2] = (prev[::2] + 1) % k
    labels = prev.clone()
    acc = torch.zeros(k * d + k, device=DEVICE)
    part_inertia = torch.full((programs,), float("nan"), device=DEVICE)
    part_changed = torch.full((programs,), -1, dtype=torch.int64, device=DEVICE)
    boxes.box_pass(xs, c, cand, count, labels, acc, part_inertia, part_changed, block_n=16,
                   tiles_per_program=tiles_per_program, sample_weight=w)
    assert torch.equal(labels.long(), dense.labels.long())
    weight = torch.ones(n, device=DEVICE) if w is None else w
    sums = torch.zeros(k, d, dtype=torch.float64, device=DEVICE).index_add_(0, labels.long(), (xs * weight[:, None]).double())
    counts = torch.zeros(k, dtype=torch.float64, device=DEVICE).index_add_(0, labels.long(), weight.double())
    torch.testing.assert_close(acc[: k * d].view(k, d).double(), sums, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(acc[k * d:].double(), counts, rtol=1e-5, atol=1e-4)
    assert float(part_inertia.sum()) == pytest.approx(float((dense.sq_dist * weight).sum()), rel=1e-4)
    assert int(part_changed.sum()) == int((prev != labels).sum())


def test_box_pass_settles_ties_to_the_lowest_index():
    # Rows exactly halfway between two centroids, and duplicated centroids: the lower index wins.
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, 0.0], [0.5, 1.0], [2.0, 2.0]] * 7, device=DEVICE)
    c = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 2.0], [0.0, 0.0], [2.0, 2.0]], device=DEVICE)
    xs, lo, hi, cand, count, _ = _sorted_tiles(x, c, 4)
    labels = torch.zeros(xs.shape[0], dtype=torch.int32, device=DEVICE)
    acc = torch.zeros(5 * 2 + 5, device=DEVICE)
    programs = lo.shape[0]
    boxes.box_pass(xs, c, cand, count, labels, acc, torch.zeros(programs, device=DEVICE),
                   torch.zeros(programs, dtype=torch.int64, device=DEVICE), block_n=4, tiles_per_program=1,
                   has_prev=False)
    assert torch.equal(labels.long(), assign(xs, c).labels.long())
    assert set(labels.tolist()) == {0, 1, 2}
