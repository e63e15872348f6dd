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
    """Rows in curve order, their tiles' boxes, candidate lists and work list (every tile)."""
    order = torch.argsort(boxes.curve_keys(x))
    xs = x[order].contiguous()
    lo, hi = boxes.tile_boxes(xs, block_n)
    tiles = lo.shape[0]
    cand = torch.full((tiles, boxes.MAX_CANDIDATES), -1, dtype=torch.int32, device=x.device)
    count = torch.zeros(tiles, dtype=torch.int32, device=x.device)
    work = torch.full((tiles,), -1, dtype=torch.int32, device=x.device)
    work_count = torch.zeros(1, dtype=torch.int32, device=x.device)
    boxes.candidates(lo, hi, c, cand, count, work, work_count)
    return xs, lo, hi, cand, count, work, work_count


def _tallies():
    return torch.zeros(1, dtype=torch.int32, device=DEVICE), torch.zeros(1, dtype=torch.int32, device=DEVICE)


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
    xs, lo, hi, cand, count, work, work_count = _sorted_tiles(x, c, 16)
    mask = boxes.candidates_reference(lo, hi, c)
    assert torch.equal(count.long(), mask.sum(1))
    listed = count <= boxes.MAX_CANDIDATES
    for t in torch.nonzero(listed).flatten().tolist():
        m = int(count[t])
        assert cand[t, :m].tolist() == mask[t].nonzero().flatten().tolist()  # increasing order
    # Without settled tiles every tile is on the work list, once.
    assert int(work_count) == lo.shape[0]
    assert sorted(work.tolist()) == list(range(lo.shape[0]))
    # Every row's float64 nearest centroid is a candidate of its tile.
    nearest = torch.cdist(xs.double(), c.double()).argmin(1)
    tile = torch.arange(n, device=DEVICE) // 16
    assert bool(mask[tile, nearest].all())


@pytest.mark.parametrize("n,d,k", [(1000, 2, 7), (777, 1, 5), (501, 3, 33), (300, 8, 4), (650, 5, 1), (390, 4, 100)])
@pytest.mark.parametrize("weighted", [False, True])
def test_box_pass_equals_dense_small_d_pass(n, d, k, weighted):
    x, c = _rows(n, d, k, 2 * n + d)
    xs, lo, hi, cand, count, work, work_count = _sorted_tiles(x, c, 16)
    w = torch.rand(n, generator=torch.Generator().manual_seed(n)).to(DEVICE) if weighted else None
    programs = 3  # several tiles per program, the last program short
    # Previous labels: half the rows already on their label, the rest elsewhere.
    dense = assign(xs, c, sample_weight=w)
    prev = dense.labels.to(torch.int32).clone()
    prev[::2] = (prev[::2] + 1) % k
    labels = prev.clone()
    acc = torch.zeros(k * d + k, device=DEVICE)
    part_inertia = torch.full((programs,), float("nan"), device=DEVICE)
    part_changed = torch.full((programs,), -1, dtype=torch.int64, device=DEVICE)
    tallies = _tallies()
    boxes.box_pass(xs, c, cand, count, work, work_count, labels, acc, part_inertia, part_changed, tallies, block_n=16,
                   sample_weight=w)
    assert torch.equal(labels.long(), dense.labels.long())
    listed = count <= boxes.MAX_CANDIDATES
    assert int(tallies[0]) == int(torch.where(listed, count, k).sum())
    assert int(tallies[1]) == int((~listed).sum())
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
    xs, lo, hi, cand, count, work, work_count = _sorted_tiles(x, c, 4)
    labels = torch.zeros(xs.shape[0], dtype=torch.int32, device=DEVICE)
    acc = torch.zeros(5 * 2 + 5, device=DEVICE)
    programs = lo.shape[0]
    boxes.box_pass(xs, c, cand, count, work, work_count, labels, acc, torch.zeros(programs, device=DEVICE),
                   torch.zeros(programs, dtype=torch.int64, device=DEVICE), _tallies(), block_n=4, has_prev=False)
    assert torch.equal(labels.long(), assign(xs, c).labels.long())
    assert set(labels.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("n,d,k,block_n", [(1000, 2, 7, 16), (777, 1, 5, 8), (501, 3, 33, 16), (650, 2, 1, 32),
                                           (300, 2, 70, 4)])
@pytest.mark.parametrize("weighted", [False, True])
def test_settled_tiles_add_their_moments_and_leave_the_work_list(n, d, k, block_n, weighted):
    # Clustered rows, so that many tiles have one candidate; the labels of the dense pass, with
    # each single-candidate tile's known label set for every other such tile (those are settled,
    # the rest stay on the work list and must be searched).
    g = torch.Generator().manual_seed(n + k)
    centres = 10 * torch.randn(k, d, generator=g)
    x = (centres[torch.randint(0, k, (n,), generator=g)] + 0.3 * torch.randn(n, d, generator=g)).to(DEVICE)
    c = centres.to(DEVICE)
    xs, lo, hi, cand, count, _, _ = _sorted_tiles(x, c, block_n)
    w = torch.rand(n, generator=torch.Generator().manual_seed(n)).to(DEVICE) if weighted else None
    weight = torch.ones(n, device=DEVICE) if w is None else w
    tiles = lo.shape[0]
    dense = assign(xs, c, sample_weight=w)
    single = count == 1
    tile_label = torch.where(single, cand[:, 0], -1)
    tile_label[1::2] = -1
    settled = tile_label >= 0
    assert bool(settled.any()) and not bool(settled.all())
    moments = boxes.tile_moments(xs, block_n, w)
    acc = torch.zeros(k * d + k, device=DEVICE)
    part = torch.full((boxes.candidate_programs(tiles),), float("nan"), device=DEVICE)
    work = torch.full((tiles,), -1, dtype=torch.int32, device=DEVICE)
    work_count = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    new_label = tile_label.clone()
    boxes.candidates(lo, hi, c, cand, count, work, work_count, settle=(new_label, moments, acc, part))
    assert sorted(work[: int(work_count)].tolist()) == torch.nonzero(~settled).flatten().tolist()
    # The tiles searched this pass now say what they will hold: their one candidate, or -1.
    assert torch.equal(new_label, torch.where(single, cand[:, 0], -1))
    # The settled tiles' rows keep their labels and are never read: poison them.
    rows_settled = settled.repeat_interleave(block_n)[:n]
    x_poisoned = torch.where(rows_settled[:, None], float("nan"), xs)
    labels = torch.where(rows_settled, dense.labels.to(torch.int32), -7)
    programs = 3
    part_inertia = torch.zeros(programs, device=DEVICE)
    part_changed = torch.zeros(programs, dtype=torch.int64, device=DEVICE)
    boxes.box_pass(x_poisoned, c, cand, count, work, work_count, labels, acc, part_inertia, part_changed, _tallies(),
                   block_n=block_n, sample_weight=w)
    assert torch.equal(labels.long(), dense.labels.long())
    sums = torch.zeros(k, d, dtype=torch.float64, device=DEVICE).index_add_(0, labels.long(), (xs * weight[:, None]).double())
    counts = torch.zeros(k, dtype=torch.float64, device=DEVICE).index_add_(0, labels.long(), weight.double())
    torch.testing.assert_close(acc[: k * d].view(k, d).double(), sums, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(acc[k * d:].double(), counts, rtol=1e-5, atol=1e-4)
    inertia = float(part.double().sum() + part_inertia.double().sum())
    assert inertia == pytest.approx(float((dense.sq_dist.double() * weight).sum()), rel=1e-5)
    assert int(part_changed.sum()) == int((~rows_settled).sum())


def test_tile_moments_match_direct_sums():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 3, generator=g).to(DEVICE)
    w = torch.rand(37, generator=g).to(DEVICE)
    w[8:16] = 0.0  # a tile of no weight: mean and scatter 0
    got = boxes.tile_moments(x, 8, w, chunk_tiles=2)
    for t in range(5):
        xt, wt = x[8 * t: 8 * t + 8].double(), w[8 * t: 8 * t + 8].double()
        total = wt.sum()
        mean = (xt * wt[:, None]).sum(0) / total if total > 0 else torch.zeros(3, dtype=torch.float64, device=DEVICE)
        scatter = (wt * ((xt - mean) ** 2).sum(1)).sum() if total > 0 else 0.0
        torch.testing.assert_close(got[t], torch.cat([mean, total.reshape(1), torch.as_tensor(scatter).reshape(1).to(got)]))


@pytest.mark.parametrize("n,d,block_n,extras", [(517, 1, 16, False), (517, 3, 16, True), (300, 8, 128, True),
                                                (64, 2, 32, True), (129, 2, 128, False)])
def test_sorted_tiles_match_gathers_and_the_torch_tile_reductions(n, d, block_n, extras):
    """The set-up's one pass over the curve order against index_select, the transform, and the
    pure-torch ``tile_boxes`` / ``tile_moments`` (odd n, a short last tile, weights with a tile of
    none, per-row scale, labels)."""
    g = torch.Generator().manual_seed(n + d)
    x = (3.0 * torch.randn(n, d, generator=g)).to(DEVICE)
    order = torch.randperm(n, generator=g).to(DEVICE)
    offset = torch.linspace(-1, 1, d).to(DEVICE) if extras else None
    scale = (0.5 + torch.rand(n, generator=g)).to(DEVICE) if extras else None
    weight = torch.rand(n, generator=g).to(DEVICE) if extras else None
    if weight is not None:
        weight[order[:block_n]] = 0.0  # the first tile weighs nothing
    labels = torch.randint(0, 1000, (n,), generator=g, dtype=torch.int32).to(DEVICE) if extras else None
    got = boxes.sorted_tiles(x, order.to(torch.int32), block_n, offset=offset, row_scale=scale,
                             sample_weight=weight, labels=labels)
    rows = x[order].float()
    if offset is not None:
        rows = rows - offset
    if scale is not None:
        rows = rows * scale[order][:, None]
    torch.testing.assert_close(got["rows"], rows, rtol=0, atol=0)
    lo, hi = boxes.tile_boxes(rows, block_n)
    torch.testing.assert_close(got["lo"], lo, rtol=0, atol=0)
    torch.testing.assert_close(got["hi"], hi, rtol=0, atol=0)
    w_sorted = None if weight is None else weight[order]
    torch.testing.assert_close(got["moments"], boxes.tile_moments(rows, block_n, w_sorted), rtol=1e-12, atol=1e-12)
    if weight is None:
        assert got["weight"] is None and got["labels"] is None
    else:
        torch.testing.assert_close(got["weight"], w_sorted, rtol=0, atol=0)
        torch.testing.assert_close(got["labels"], labels[order], rtol=0, atol=0)
        assert float(got["moments"][0, d]) == 0.0 and float(got["moments"][0, d + 1]) == 0.0


@pytest.mark.parametrize("n,d,k", [(1000, 2, 7), (501, 3, 33), (390, 1, 100)])
def test_tiles_of_known_labels_list_supersets_and_settle_exactly(n, d, k):
    # Every tile has a label (the one its single candidate gives, else an arbitrary centroid): the
    # candidates launch bounds each tile's reach by that label's box distance instead of a sweep.
    # Lists may grow (never losing a true candidate); settled tiles are exactly the single ones
    # whose label is right, and the pass over the rest gives the dense labels.
    x, c = _rows(n, d, k, 7 * n + d)
    xs, lo, hi, cand, count, _, _ = _sorted_tiles(x, c, 16)
    exact = boxes.candidates_reference(lo, hi, c)
    tiles = lo.shape[0]
    single = count == 1
    tile_label = torch.where(single, cand[:, 0], torch.arange(tiles, device=DEVICE).to(torch.int32) % k)
    moments = boxes.tile_moments(xs, 16)
    acc = torch.zeros(k * d + k, device=DEVICE)
    part = torch.zeros(boxes.candidate_programs(tiles), device=DEVICE)
    work = torch.full((tiles,), -1, dtype=torch.int32, device=DEVICE)
    work_count = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    cand2, count2 = torch.full_like(cand, -1), torch.zeros_like(count)
    boxes.candidates(lo, hi, c, cand2, count2, work, work_count, settle=(tile_label.clone(), moments, acc, part))
    assert bool((count2 >= count).all())
    settled = single & (count2 == 1)
    assert sorted(work[: int(work_count)].tolist()) == torch.nonzero(~settled).flatten().tolist()
    for t in torch.nonzero(~settled).flatten().tolist():  # lists are written for the tiles searched
        if int(count2[t]) <= boxes.MAX_CANDIDATES:
            assert set(exact[t].nonzero().flatten().tolist()) <= set(cand2[t, : int(count2[t])].tolist())
    dense = assign(xs, c)
    labels = dense.labels.to(torch.int32).clone()
    labels[~settled.repeat_interleave(16)[:n]] = -1
    boxes.box_pass(xs, c, cand2, count2, work, work_count, labels, acc, torch.zeros(2, device=DEVICE),
                   torch.zeros(2, dtype=torch.int64, device=DEVICE), _tallies(), block_n=16)
    assert torch.equal(labels.long(), dense.labels.long())
    counts = torch.bincount(dense.labels.long(), minlength=k).double()
    torch.testing.assert_close(acc[k * d:].double(), counts)


def test_setup_seconds_is_measured_once_on_cuda_and_zero_elsewhere():
    """The set-up estimate the hybrid adds to a box trial: off CUDA nothing to measure (0); on
    CUDA a line measured once per device and width, positive and growing with the rows."""
    assert boxes.setup_seconds(10**8, 2, torch.device("cpu")) == 0.0
    if DEVICE != "cuda":
        return
    device = torch.device(DEVICE)
    small, large = boxes.setup_seconds(10**4, 2, device), boxes.setup_seconds(10**8, 2, device)
    assert 0.0 < small < large
    assert boxes._setup_line.cache_info().currsize >= 1
    assert boxes.setup_seconds(10**8, 2, device) == large  # the line is not measured again
