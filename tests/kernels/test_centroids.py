"""prepare_centroids / finish_update against their pure-torch references, on odd shapes."""

import pytest
import torch
from torchkm._kernels.centroids import (
    AMAX_C_BLOCK,
    HALF_TOP_EXPONENT,
    amax_parts,
    centre_rows,
    centre_rows_reference,
    centroid_neighbours,
    centroid_neighbours_reference,
    centroid_parts,
    finish_update,
    finish_update_reference,
    half_scale_reference,
    moves_reference,
    prepare_centroids,
    prepare_centroids_reference,
    row_norms,
    row_norms_reference,
    shift_top_reference,
    unpack_shift_top,
)

from tests.kernels.conftest import DEVICE, ON_GPU

HALF = [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16]


@pytest.mark.parametrize("k,d", [(1, 1), (7, 3), (33, 17), (5, 129)])
@pytest.mark.parametrize("x_dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("mode", ["exact", "fast", "reference"])
def test_prepare_matches_reference(k, d, x_dtype, mode):
    g = torch.Generator().manual_seed(k * 100 + d)
    c = (torch.randn(k, d, generator=g) * 3).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    fast, exact = mode != "reference", mode != "fast"
    split = mode == "exact" and x_dtype == torch.bfloat16
    zero_f32 = torch.full((2500,), 7.0, device=DEVICE)
    zero_i32 = torch.full((3,), 7, dtype=torch.int32, device=DEVICE)
    zero_f64 = torch.full((4,), 7.0, dtype=torch.float64, device=DEVICE)
    got = prepare_centroids(c, offset, x_dtype, fast=fast, split=split, exact=exact, zero=(zero_f32, zero_i32, zero_f64))
    want = prepare_centroids_reference(c, offset, x_dtype, fast=fast, split=split, exact=exact)
    _assert_prepared_equal(got, want)
    assert not zero_f32.any() and not zero_i32.any() and not zero_f64.any()


def _assert_prepared_equal(got, want):
    for name, g_, w_ in zip(got._fields, got, want):
        if w_ is None:
            assert g_ is None, name
            continue
        assert g_.dtype == w_.dtype, name
        # Bias sums run in float64 either way; only their last fp32 rounding may differ.
        torch.testing.assert_close(g_.float(), w_.float(), rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("k,d", [(1, 1), (7, 3), (33, 17), (5, 129), (300, 40)])
@pytest.mark.parametrize("magnitude", [1.0, 3e-9, 7e4, 1e15, 1e-25])
@pytest.mark.parametrize("exact", [True, False])
def test_prepare_fp16_operands_match_reference(k, d, magnitude, exact):
    """fp16 operands for fp32 rows: the scale from the partial maxima of |x| and 2 |c| (the rows'
    maximum either side of the centroids'), centroids scaled into fp16's range, the bias in the
    products' unit; data far outside fp16's range included (for 1e-25 the scale is clamped at 2^60:
    the operands then sit low in fp16's range, many of them subnormal, as the reference's)."""
    g = torch.Generator().manual_seed(k * 100 + d)
    c = (torch.randn(k, d, generator=g) * magnitude).to(DEVICE)
    offset = (torch.randn(d, generator=g) * magnitude).to(DEVICE)
    for x_scale in (0.1, 10.0):  # below and above the centroids' maximum
        x = (torch.randn(2 * k + 5, d, generator=g) * magnitude * x_scale).to(DEVICE)
        parts = torch.full((7,), float("nan"), device=DEVICE)
        amax_parts(x, c, parts, 4)
        zero_f32 = torch.full((5,), 7.0, device=DEVICE)
        got = prepare_centroids(c, offset, torch.float32, fast=True, split=False, exact=exact, zero=(zero_f32,),
                                half_parts=parts)
        scale = half_scale_reference(x, c)
        top = scale * max(x.abs().max().item(), 2 * c.abs().max().item())
        assert 2.0**HALF_TOP_EXPONENT <= top < 2.0**(HALF_TOP_EXPONENT + 1) or (magnitude < 1e-20 and scale == 2.0**60)
        want = prepare_centroids_reference(c, offset, torch.float32, fast=True, split=False, exact=exact,
                                           half_scale=scale)
        assert got.c_mma.dtype == torch.float16 and torch.isfinite(got.c_mma.float()).all()
        _assert_prepared_equal(got, want)
        assert not zero_f32.any()


def test_amax_parts_of_the_centroids_alone_keep_the_rows_maxima():
    """``rows=False`` (a fit's engine, whose rows do not change): only the centroids' slots are
    rewritten; the rows' maxima stay those of the earlier call."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 5, generator=g) * 3).to(DEVICE)
    c = torch.randn(6, 5, generator=g).to(DEVICE)
    parts = torch.full((7,), float("nan"), device=DEVICE)
    amax_parts(x, c, parts, 4)
    rows_max = parts[:4].clone()
    assert rows_max.max() == x.abs().max()
    amax_parts(x * 0, c * 100, parts, 4, rows=False)
    assert torch.equal(parts[:4], rows_max)
    assert parts[4:].max() == 200 * c.abs().max()


def test_half_scale_reduces_more_parts_than_one_step():
    """More partial maxima than ``_half_scale`` reads in one step (1,024): the largest may sit in any
    step, the centroids' too. ``centroid_parts`` gives up to four programs an SM, each two steps."""
    assert centroid_parts(1, 132) == 1 and centroid_parts(8192 * 256, 132) == 512 and centroid_parts(8192 * 768, 132) == 4 * 132
    assert centroid_parts(2 * AMAX_C_BLOCK * 7 + 1, 132) == 8
    g = torch.Generator().manual_seed(11)
    x = torch.randn(40, 6, generator=g).to(DEVICE)
    c = torch.randn(5, 6, generator=g).to(DEVICE)
    for where in (3, 1030, 2049):
        parts = torch.full((2100,), 0.5, device=DEVICE)
        amax_parts(x, c, parts[:10], 4)  # the real maxima among the first slots
        parts[where] = 1e3  # far above them: the scale must come from this slot
        got = prepare_centroids(c, None, torch.float32, fast=True, split=False, exact=True, half_parts=parts)
        torch.testing.assert_close(got.half_scale[0].item(), 2.0**(HALF_TOP_EXPONENT - 9), rtol=0, atol=0)


def test_amax_parts_keep_known_reads_only_the_unknown_rows_slots():
    """``keep_known``: slots holding -1 get the rows' maxima, slots holding a maximum keep it; the
    centroids' slots are always written."""
    g = torch.Generator().manual_seed(13)
    x = (torch.randn(301, 9, generator=g) * 3).to(DEVICE)
    c = torch.randn(6, 9, generator=g).to(DEVICE)
    want = torch.full((7,), float("nan"), device=DEVICE)
    amax_parts(x, c, want, 4)
    parts = torch.tensor([-1.0, 5e3, -1.0, 0.0, -1.0, -1.0, -1.0], device=DEVICE)
    amax_parts(x, c, parts, 4, keep_known=True)
    assert parts[0] == want[0] and parts[2] == want[2]
    assert parts[1] == 5e3 and parts[3] == 0.0
    assert torch.equal(parts[4:], want[4:])
    with pytest.raises(ValueError, match="keep_known"):
        amax_parts(x, c, parts, 4, rows=False, keep_known=True)
    with pytest.raises(ValueError, match="rows=True"):
        amax_parts(x, c, parts, 4, keep_known=True, norms=torch.empty(301, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("n, d", [(1, 1), (7, 3), (33, 17), (301, 129), (65, 300)])
def test_row_norms_match_reference(n, d, dtype):
    g = torch.Generator().manual_seed(n * 1000 + d)
    wide = (torch.randn(n, 2 * d, generator=g) * 3).to(DEVICE, dtype)
    for x in (wide[:, :d].contiguous(), wide[:, ::2]):  # contiguous and strided rows
        out = torch.full((n,), float("nan"), device=DEVICE)
        row_norms(x, out)
        torch.testing.assert_close(out, row_norms_reference(x), rtol=2e-6, atol=0)


def test_amax_parts_with_norms_give_the_rows_norms_and_the_same_maxima():
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(301, 129, generator=g) * 7).to(DEVICE)
    c = torch.randn(9, 129, generator=g).to(DEVICE)
    parts, with_norms = (torch.full((7,), float("nan"), device=DEVICE) for _ in range(2))
    norms = torch.full((301,), float("nan"), device=DEVICE)
    amax_parts(x, c, parts, 4)
    amax_parts(x, c, with_norms, 4, norms=norms)
    assert torch.equal(parts, with_norms)
    torch.testing.assert_close(norms, row_norms_reference(x), rtol=2e-6, atol=0)
    with pytest.raises(ValueError, match="rows=True"):
        amax_parts(x, c, parts, 4, rows=False, norms=norms)


def test_prepare_fp16_operands_rejects_other_rows():
    c = torch.randn(3, 4, device=DEVICE)
    parts = torch.zeros(2, device=DEVICE)
    with pytest.raises(ValueError, match="fp16 operands"):
        prepare_centroids(c, None, torch.bfloat16, fast=True, split=False, exact=True, half_parts=parts)
    with pytest.raises(ValueError, match="fp16 operands"):
        prepare_centroids(c, None, torch.float32, fast=False, split=False, exact=True, half_parts=parts)


@pytest.mark.parametrize("k,d,replicas", [(1, 1, 1), (7, 3, 4), (40, 17, 1), (5, 129, 2)])
@pytest.mark.parametrize("normalize", [False, True])
def test_finish_matches_reference(k, d, replicas, normalize):
    g = torch.Generator().manual_seed(k + d)
    acc_sums = torch.randn(replicas, k, d, generator=g).to(DEVICE)
    acc_counts = torch.randint(0, 3, (replicas, k), generator=g).float().to(DEVICE)
    acc_counts[:, 0] = 0  # an empty cluster keeps its centroid
    c = torch.randn(k, d, generator=g).to(DEVICE)
    if normalize:
        c = c / c.norm(dim=1, keepdim=True)
    # Partials over several of the programs that sum them (4,096 each).
    part_inertia = torch.rand(9000, generator=g).to(DEVICE)
    part_changed = torch.randint(0, 50, (9000,), generator=g).to(DEVICE)
    new_want, sums_want, counts_want, stats_want = finish_update_reference(
        acc_sums, acc_counts, c, part_inertia, part_changed, normalize=normalize)
    centroids = c.clone()
    old = torch.empty_like(c)
    sums, counts = torch.empty(k, d, device=DEVICE), torch.empty(k, device=DEVICE)
    stats = torch.zeros(4, dtype=torch.float64, device=DEVICE)
    finish_update(acc_sums, acc_counts, centroids, part_inertia, part_changed, stats, normalize=normalize,
                  old_centroids=old, sums=sums, counts=counts)
    torch.testing.assert_close(centroids, new_want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(old, c)
    torch.testing.assert_close(sums, sums_want, rtol=1e-6, atol=1e-6)
    assert torch.equal(counts, counts_want)
    torch.testing.assert_close(stats, stats_want, rtol=1e-5, atol=1e-6)


def test_finish_does_nothing_while_frozen():
    c = torch.randn(4, 3, device=DEVICE)
    centroids = c.clone()
    stats = torch.zeros(4, dtype=torch.float64, device=DEVICE)
    control = torch.tensor([1, 8], dtype=torch.int32, device=DEVICE)
    finish_update(torch.ones(1, 4, 3, device=DEVICE), torch.ones(1, 4, device=DEVICE), centroids,
                  torch.ones(2, device=DEVICE), torch.ones(2, dtype=torch.int64, device=DEVICE), stats, normalize=False,
                  old_centroids=torch.empty_like(c), sums=torch.empty(4, 3, device=DEVICE),
                  counts=torch.empty(4, device=DEVICE), control=control)
    assert torch.equal(centroids, c) and not stats.any()


@pytest.mark.parametrize("k,d", [(1, 3), (7, 1), (40, 17), (1000, 129)])
@pytest.mark.parametrize("normalize", [False, True])
def test_finish_records_the_two_largest_moves_and_the_tallies(k, d, normalize):
    g = torch.Generator().manual_seed(k + 7 * d)
    c = torch.randn(k, d, generator=g)
    if normalize:
        c = c / c.norm(dim=1, keepdim=True)
    counts = torch.randint(1, 4, (1, k), generator=g).float()
    if k > 1:
        counts[0, k // 2] = 0  # an empty cluster does not move
    acc_sums = (c + torch.randn(k, d, generator=g) * torch.rand(k, 1, generator=g)) * counts[0, :, None]
    centroids = c.clone().to(DEVICE)
    old = torch.empty_like(centroids)
    # Statistics, tallies, and keys in one record, as the bounds engine keeps them.
    record = torch.zeros(8, dtype=torch.float64, device=DEVICE)
    shift_top = record[6:].view(torch.int64)
    tallies = (torch.tensor([123], dtype=torch.int32, device=DEVICE), torch.tensor([45], dtype=torch.int32, device=DEVICE))
    finish_update(acc_sums[None].to(DEVICE), counts.to(DEVICE), centroids, torch.zeros(3, device=DEVICE),
                  torch.zeros(3, dtype=torch.int64, device=DEVICE), record, normalize=normalize, old_centroids=old,
                  sums=torch.empty(k, d, device=DEVICE), counts=torch.empty(k, device=DEVICE),
                  shift_top=shift_top, shift_margin=2.0**-20, tallies=tallies,
                  moves=(each_move := torch.full((k,), float("nan"), device=DEVICE)))
    moves = torch.linalg.vector_norm((centroids - old).double(), dim=1).cpu()
    # Every centroid's move, rounded up alike (``moves_reference``); an empty cluster's is 0.
    assert bool((moves <= each_move.double().cpu()).all()) and bool((each_move.cpu() <= moves * (1 + 2.0**-18)).all())
    torch.testing.assert_close(each_move, moves_reference(centroids, old, 2.0**-20), rtol=1e-6, atol=0.0)
    first, second, index = (v.cpu() for v in unpack_shift_top(shift_top))
    assert int(index) == int(moves.argmax())
    # Rounded up by the margin, never below the float64 move.
    assert float(moves.max()) <= float(first) <= float(moves.max()) * (1 + 2.0**-18)
    second_want = float(moves.topk(2).values[1]) if k > 1 else 0.0
    assert second_want <= float(second) <= second_want * (1 + 2.0**-18)
    want_first, want_second, want_index = unpack_shift_top(shift_top_reference(centroids, old, 2.0**-20))
    assert int(want_index) == int(index)
    torch.testing.assert_close(torch.stack([first, second]), torch.stack([want_first, want_second]).cpu(), rtol=1e-6,
                               atol=0.0)
    assert record[4:6].tolist() == [123.0, 45.0]


@pytest.mark.parametrize("k,d,width", [(1, 3, 4), (1000, 17, 8), (40, 129, 6)])
def test_finish_writes_its_record_into_the_log_and_stats_prev(k, d, width):
    """A replayed block's record (``finish_update(record=...)``): the last of many programs copies
    the statistics, tallies and keys bit for bit into the next log row and ``stats_prev``; a frozen
    iteration repeats the row; rows past the log are not written; the ticket ends at 0."""
    g = torch.Generator().manual_seed(k + d + width)
    c = torch.randn(k, d, generator=g).to(DEVICE)
    counts = torch.randint(1, 4, (1, k), generator=g).float().to(DEVICE)
    acc_sums = (torch.randn(1, k, d, generator=g).to(DEVICE) + c) * counts[..., None]
    part_inertia = torch.rand(9000, generator=g).to(DEVICE)
    part_changed = torch.randint(0, 50, (9000,), generator=g).to(DEVICE)
    record = torch.zeros(8, dtype=torch.float64, device=DEVICE)
    shift_top = record[6:].view(torch.int64)
    tallies = (torch.tensor([123], dtype=torch.int32, device=DEVICE), torch.tensor([45], dtype=torch.int32, device=DEVICE))
    log = torch.full((3, width), float("nan"), dtype=torch.float64, device=DEVICE)
    stats_prev = torch.full((4,), float("nan"), dtype=torch.float64, device=DEVICE)
    control = torch.tensor([0, 1, 0, 0], dtype=torch.int32, device=DEVICE)
    centroids = c.clone()
    common = {"normalize": False, "old_centroids": torch.empty_like(c), "sums": torch.empty(k, d, device=DEVICE),
              "counts": torch.empty(k, device=DEVICE), "control": control, "shift_top": shift_top,
              "shift_margin": 2.0**-20, "tallies": tallies, "record": (log, stats_prev)}
    rows = []
    for step in range(2):
        record.zero_()
        finish_update(acc_sums, counts, centroids, part_inertia, part_changed, record, **common)
        rows.append(record.clone())
        assert torch.equal(log[step].view(torch.int64), record[:width].view(torch.int64))
        assert torch.equal(stats_prev, record[:4])
        assert control.tolist() == [0, 1, step + 1, 0]
    assert rows[0][1] > 0 and rows[1][1] == 0  # the second update found the means in place
    assert torch.isnan(log[2]).all()
    control[0] = 1  # frozen: nothing moves, the row repeats the record
    finish_update(acc_sums, counts, centroids, part_inertia, part_changed, record, **common)
    assert torch.equal(log[2].view(torch.int64), rows[1][:width].view(torch.int64))
    assert torch.equal(log[:2].view(torch.int64), torch.stack(rows)[:, :width].view(torch.int64))
    control[0] = 0
    before = log.clone()
    finish_update(acc_sums, counts, centroids, part_inertia, part_changed, record, **common)  # past the log
    assert torch.equal(log.view(torch.int64), before.view(torch.int64)) and control.tolist() == [0, 1, 4, 0]


def test_finish_rejects_a_record_without_its_control():
    c = torch.randn(4, 3, device=DEVICE)
    args = (torch.ones(1, 4, 3, device=DEVICE), torch.ones(1, 4, device=DEVICE), c.clone(),
            torch.ones(2, device=DEVICE), torch.ones(2, dtype=torch.int64, device=DEVICE),
            torch.zeros(4, dtype=torch.float64, device=DEVICE))
    common = {"normalize": False, "old_centroids": torch.empty_like(c), "sums": torch.empty(4, 3, device=DEVICE),
              "counts": torch.empty(4, device=DEVICE)}
    log, prev = torch.zeros(2, 4, dtype=torch.float64, device=DEVICE), torch.zeros(4, dtype=torch.float64, device=DEVICE)
    four = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    for control, record in [(None, (log, prev)), (four[:2], (log, prev)),
                            (four, (torch.zeros(2, 6, dtype=torch.float64, device=DEVICE), prev)),
                            (four, (log, prev[:3]))]:
        with pytest.raises(ValueError, match="record needs"):
            finish_update(*args, control=control, record=record, **common)


def test_finish_rejects_bad_shift_top_and_short_stats():
    c = torch.randn(4, 3, device=DEVICE)
    common = {"normalize": False, "old_centroids": torch.empty_like(c), "sums": torch.empty(4, 3, device=DEVICE),
              "counts": torch.empty(4, device=DEVICE)}
    args = (torch.ones(1, 4, 3, device=DEVICE), torch.ones(1, 4, device=DEVICE), c.clone(),
            torch.ones(2, device=DEVICE), torch.ones(2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="int64 tensor of 2"):
        finish_update(*args, torch.zeros(4, dtype=torch.float64, device=DEVICE),
                      shift_top=torch.zeros(2, device=DEVICE), **common)
    one = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="6 elements"):
        finish_update(*args, torch.zeros(4, dtype=torch.float64, device=DEVICE), tallies=(one, one), **common)


@pytest.mark.parametrize("k,d", [(1, 1), (7, 3), (1000, 17), (33, 129), (4100, 5)])
def test_centre_rows_matches_reference(k, d):
    g = torch.Generator().manual_seed(k * 1000 + d)
    c = (torch.randn(k, d, generator=g) * 3 + 5).to(DEVICE)
    centred, mean = centre_rows(c)
    want_centred, want_mean = centre_rows_reference(c.double())
    torch.testing.assert_close(mean.double(), want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(centred.double(), want_centred, rtol=1e-5, atol=1e-5)
    # The same sums in the same order every time: bit-identical reruns.
    again = centre_rows(c)
    assert torch.equal(again[0], centred) and torch.equal(again[1], mean)
    with pytest.raises(ValueError, match="contiguous float32"):
        centre_rows(c.double())


@pytest.mark.parametrize("k, d", [(1, 3), (7, 17), (16, 1), (17, 129), (1000, 3), (300, 17)])
def test_centroid_neighbours_list_every_centroid_within_reach(k, d):
    """Each centroid with a need (the largest distance of a deferred row it wins) lists every other
    centroid within its reach ``2 sqrt(D)`` (float64 distances), and only those within it up to the
    tf32 distances' error; its radius is that reach, or -1 where more than COUNT lie within it, or
    it has no need. Centroids of a tight group far from the origin, needs small and large; the need
    is cleared."""
    count = 15
    g = torch.Generator().manual_seed(k + d)
    c = torch.randn(k, d, generator=g)
    c[: k // 2] = c[: k // 2] * 1e-2 + 5.0  # a tight group far from the origin
    need_sq = torch.rand(k, generator=g) ** 4 * (4.0 * d)
    need_sq[torch.rand(k, generator=g) < 0.3] = float("nan")  # no deferred row
    need = torch.where(torch.isnan(need_sq), 0, need_sq.view(torch.int32) + 1).to(torch.int32)
    ids = torch.full((k, count), -7, dtype=torch.int32)
    counts = torch.full((k,), -7, dtype=torch.int32)
    radius = torch.full((k,), float("nan"))
    need_dev, ids_dev, counts_dev, radius_dev = (t.to(DEVICE) for t in (need, ids, counts, radius))
    tally = torch.zeros(k, dtype=torch.int32, device=DEVICE)
    centroid_neighbours(c.to(DEVICE), need_dev, tally, ids_dev, counts_dev, radius_dev)
    assert (need_dev == 0).all() and (tally == 0).all()
    ids, counts, radius = ids_dev.cpu().long(), counts_dev.cpu(), radius_dev.cpu().double()
    within, ref_radius = centroid_neighbours_reference(c, need_sq, count)
    c64 = c.double()
    dist = torch.cdist(c64, c64)
    norm = (c64 - c64.mean(0)).norm(dim=1)
    for w in range(k):
        if torch.isnan(need_sq[w]):
            assert radius[w] == -1 and counts[w] == 0
            continue
        reach = ref_radius[w] if ref_radius[w] >= 0 else 2.0 * need_sq[w].double().sqrt()
        error = 1.25 * (2 * norm[w] * norm * (2.0**-9 + d * 2.0**-22) + (norm[w] ** 2 + norm**2) * d * 2.0**-23)
        loose = {j for j in range(k) if j != w and dist[w, j] ** 2 <= (reach * (1 + 1e-5)) ** 2 + 1.01 * error[j]}
        if radius[w] < 0:
            assert len(loose) > count  # more than the list within the reach, up to the error
            continue
        torch.testing.assert_close(radius[w], reach, rtol=1e-5, atol=0)
        listed = set(ids[w, : counts[w]].tolist())
        assert 0 <= counts[w] <= count and len(listed) == counts[w]
        assert within[w] <= listed <= loose
