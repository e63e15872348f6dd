"""triton_kernels/prune.py: seed 000's scan and the bounds engine against float64 references
(Triton interpreter on CPU, or a GPU)."""

import numpy as np
import pytest
import torch
import triton
from torchkm._kernels.assign import assign
from torchkm._kernels.configs import assign_config
from torchkm._kernels.prune import (
    BoundsEngine,
    TriangleEngine,
    inter_centroid,
    scan,
    scan_reference,
    settle_reference,
    top_moves_reference,
    workload_stats,
)

from tests.helpers import assert_labels_match_except_near_ties, f64_sq_distances, fp32_tie_rows
from tests.kernels.conftest import DEVICE


def _clustered(n, d, k, seed, sigma=0.05):
    """Seed 000's generator: k centres uniform in the unit cube, rows Gaussian around them."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(k, d, generator=g)
    x = centres[torch.randint(0, k, (n,), generator=g)] + sigma * torch.randn(n, d, generator=g)
    c = x[torch.randperm(n, generator=g)[:k]] + 0.01 * torch.randn(k, d, generator=g)
    return x.to(DEVICE), c.to(DEVICE)


def _check(x, c, labels):
    xs, cs = x.double().cpu().numpy(), c.double().cpu().numpy()
    assert_labels_match_except_near_ties(xs, cs, labels.cpu().numpy(), f64_sq_distances(xs, cs).argmin(1))


def test_inter_centroid_puts_own_centroid_first_even_with_duplicates():
    c = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [3.0, 4.0]], device=DEVICE)
    icd, rid = inter_centroid(c)
    assert rid[:, 0].tolist() == [0, 1, 2, 3]
    assert torch.equal(icd, icd.T) and float(icd.diagonal().abs().max()) == 0.0
    assert float(icd[0, 3]) == pytest.approx(5.0)
    assert rid[0].tolist() == [0, 2, 1, 3]


@pytest.mark.parametrize("has_prev", [False, True])
@pytest.mark.parametrize("d", [1, 3, 17])
@pytest.mark.parametrize("k", [1, 7, 40])
def test_scan_matches_reference_and_dense_labels(d, k, has_prev):
    n = 301  # not a multiple of the 32-row warp
    x, c = _clustered(n, d, k, seed=d * 100 + k, sigma=0.1)
    prev = None
    if has_prev:
        prev = torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    labels = (torch.zeros(n, dtype=torch.int32, device=DEVICE) if prev is None else prev.to(torch.int32).clone())
    icd, rid = inter_centroid(c)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    got, sq, work = scan(x, c, icd, rid, labels, has_prev=has_prev, sums=sums, counts=counts)
    ref_labels, ref_sq, ref_work = scan_reference(x.cpu(), c.cpu(), None if prev is None else prev.cpu())
    _check(x, c, got)
    assert torch.equal(got.long().cpu(), ref_labels)  # random data: no fp32 ties
    torch.testing.assert_close(sq.double().cpu(), ref_sq, rtol=1e-5, atol=1e-5)
    # The kernel's margin can only make it scan further; on these data it never needs to.
    assert bool((work.cpu() >= ref_work).all()) and float((work.cpu() == ref_work).float().mean()) > 0.98
    expected_sums = torch.zeros(k, d, dtype=torch.float64).index_add_(0, ref_labels, x.double().cpu())
    torch.testing.assert_close(sums.double().cpu(), expected_sums, rtol=1e-5, atol=1e-4)
    assert torch.equal(counts.cpu(), torch.bincount(ref_labels, minlength=k).float())


def test_scan_ties_go_to_the_lowest_index():
    # Two identical centroids and rows at equal distance from 1 and 3: the dense rule picks the lower.
    c = torch.tensor([[5.0, 5.0], [1.0, 0.0], [5.0, 5.0], [-1.0, 0.0]], device=DEVICE)
    x = torch.tensor([[0.0, 0.0], [5.0, 5.0], [0.0, 3.0]], device=DEVICE)
    for start in range(4):
        labels = torch.full((3,), start, dtype=torch.int32, device=DEVICE)
        icd, rid = inter_centroid(c)
        got, _, _ = scan(x, c, icd, rid, labels, has_prev=True)
        assert got.tolist() == [1, 0, 1]


@pytest.mark.parametrize("d, k", [(3, 40), (17, 7), (33, 40)])
def test_scan_settles_fp32_ties_by_float64_distances(d, k):
    """Rows on the bisectors of close pairs (``fp32_tie_rows``: fp32 cannot order their two
    distances) get the float64 scan's labels from any start: the kernel settles such pairs in
    float64, as the dense pass does."""
    n = 203
    x, c = fp32_tie_rows(n, d, k, seed=d + k, device=DEVICE)
    icd, rid = inter_centroid(c)
    for start in range(3):
        prev = torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(start))
        labels = prev.to(torch.int32).to(DEVICE)
        got, _, _ = scan(x, c, icd, rid, labels, has_prev=True)
        ref_labels, _, _ = scan_reference(x.cpu(), c.cpu(), prev)
        assert torch.equal(got.long().cpu(), ref_labels)


def test_workload_stats_and_theorem_1():
    g = torch.Generator().manual_seed(0)
    work = torch.randint(1, 50, (1000,), generator=g)
    total, spent = workload_stats(work)
    assert float(total) == float(work.sum())
    sorted_total, sorted_spent = workload_stats(work.sort(descending=True).values)
    assert float(sorted_total) == float(total)
    # Decreasing workload minimises the imbalance ratio (seed 000, Theorem 1).
    assert float(sorted_spent) <= float(spent)
    for _ in range(5):
        _, other = workload_stats(work[torch.randperm(1000, generator=g)])
        assert float(sorted_spent) <= float(other)


def _run(engine, x, passes):
    """Each pass's labels against the float64 argmin for the centroids that pass saw."""
    for it in range(passes):
        c_before = engine.c.clone()
        engine.iterate(has_prev=it > 0)
        engine.read(1)
        _check(x, c_before, engine.labels.long())
        dense = assign(x, c_before, precision="exact", raw_norms=torch.linalg.vector_norm(x, dim=1))
        np.testing.assert_array_equal(engine.labels.long().cpu().numpy(), dense.labels.cpu().numpy())
        expected = torch.zeros_like(engine.sums, dtype=torch.float64).index_add_(0, dense.labels, x.double())
        torch.testing.assert_close(engine.sums.double(), expected, rtol=1e-4, atol=1e-3)
    return engine


@pytest.mark.parametrize("d,k", [(17, 1), (17, 7), (17, 48), (17, 70), (33, 70), (129, 7)])
def test_bounds_engine_labels_equal_dense_pass_each_iteration(d, k, monkeypatch):
    monkeypatch.setenv("TORCHKM_DENSE_PASSES", "1,1")  # (17, 70): one pass over every row, then settle passes
    n = 301
    x, c = _clustered(n, d, k, seed=d + k, sigma=0.05)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    engine = BoundsEngine(x, c, labels, offset=None, row_scale=None, raw_norms=torch.linalg.vector_norm(x, dim=1),
                          sample_weight=None, normalize=False, tol=0.0)
    # The full pass adds no sums (never read) in a launch of its own: on the dense engine's tiles
    # where short rows take more than one tile of centroids, on the row-list tiles over at most 64
    # clusters; over more clusters on the row-list tiles it is the settle passes' own launch.
    full, listed = engine.full_search, engine.assign_pass
    dense_tiles = d <= 32 and k > 32
    assert (full is not listed) == (dense_tiles or k <= 64)
    if full is not listed:
        assert full.acc_sums is None
        assert full.cfg == (assign_config(n, k, d, x.dtype, "exact", transposed=False) if dense_tiles else listed.cfg)
    _run(engine, x, 5)
    assert engine.info is not None and engine.info.kernel == "pruned"
    if k > 1:
        assert engine.info.skipped_bound > 0.5  # converging blobs: most rows settle


# Carried one-hot sums, a full pass on its own tiles, and per-row atomics. (301 rows in 70 blobs of
# 17 features settle too few; 501 leave no cluster empty, which this loop does not relocate.)
@pytest.mark.parametrize("d,k,n", [(17, 7, 301), (17, 70, 501), (33, 70, 301)])
def test_bounds_engine_blocks_follow_the_dense_engine_and_freeze_where_it_stops(d, k, n, monkeypatch):
    """Settle passes run in blocks of 3 under the device's control (eagerly here; replayed as a
    CUDA graph on a GPU): every pass's statistics equal the dense engine's, and a block stops where
    a pass changed no label, leaving the state of that pass. (At 17 x 70 the first two passes after
    the first search every row: the first alone, the second first in a block.)"""
    from torchkm._kernels.lloyd import LloydEngine

    monkeypatch.setenv("TORCHKM_DENSE_PASSES", "2,1")

    x, c = _clustered(n, d, k, seed=d + k, sigma=0.05)
    norms = torch.linalg.vector_norm(x, dim=1)
    common = {"offset": None, "row_scale": None, "raw_norms": norms, "sample_weight": None, "normalize": False,
              "tol": 0.0}
    engine = BoundsEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), block=3, **common)
    dense = LloydEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), precision="exact", **common)
    rows, dense_rows = [], []
    for it in range(2):  # the full pass and the first settle pass run one by one
        engine.iterate(has_prev=it > 0)
        rows += engine.read(1)
    assert engine.block == 3
    while len(rows) < 40 and rows[-1][2] > 0:
        engine.run_block(3)
        block = engine.read(3)
        assert len(engine.infos) == 3
        for row, info in zip(block, engine.infos):
            rows.append(row)
            last_info = info
            if row[2] == 0:  # the device froze the rest of the block
                break
    assert rows[-1][2] == 0, "the fit should converge"
    for it in range(len(rows)):
        dense.iterate(has_prev=it > 0)
        dense_rows += dense.read(1)
    assert [r[2] for r in rows] == [r[2] for r in dense_rows]  # labels changed, pass by pass
    np.testing.assert_allclose([r[0] for r in rows], [r[0] for r in dense_rows], rtol=1e-5)
    np.testing.assert_array_equal(engine.labels.cpu().numpy(), dense.labels.cpu().numpy())
    torch.testing.assert_close(engine.c, dense.c, rtol=1e-5, atol=1e-6)
    assert last_info.skipped_bound > 0.2  # converged blobs: rows settle


def _duplicates_case(n, d, k):
    """Rows with many duplicates, two identical centroids (4 and 5: exact ties, the lower index
    wins), the rows' mean as offset and random weights."""
    x, c = _clustered(n, d, k, seed=7, sigma=0.02)
    x[100:140] = x[0]
    c[5] = c[4]
    weights = torch.rand(n, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    return x, c, x.mean(0), weights


def _duplicates_engine(n, d, k):
    """``_duplicates_case``'s rows, offset and weights, and a bounds engine started on them."""
    x, c, offset, weights = _duplicates_case(n, d, k)
    engine = BoundsEngine(x, c - offset, torch.empty(n, dtype=torch.int32, device=DEVICE), offset=offset,
                          row_scale=None, raw_norms=torch.linalg.vector_norm(x, dim=1), sample_weight=weights,
                          normalize=False, tol=0.0)
    return x, offset, weights, engine


def test_bounds_engine_with_duplicates_ties_offset_and_weights():
    n, d, k = 257, 17, 9
    x, offset, weights, engine = _duplicates_engine(n, d, k)
    for it in range(4):
        c_before = engine.c.clone()
        engine.iterate(has_prev=it > 0)
        engine.read(1)
        dense = assign(x, c_before, precision="exact", offset=offset, raw_norms=torch.linalg.vector_norm(x, dim=1))
        np.testing.assert_array_equal(engine.labels.long().cpu().numpy(), dense.labels.cpu().numpy())
        assert not bool((engine.labels == 5).any()) or it > 0
        w_expected = torch.zeros(k, dtype=torch.float64).index_add_(0, dense.labels.cpu(), weights.double().cpu())
        torch.testing.assert_close(engine.counts.double().cpu(), w_expected, rtol=1e-5, atol=1e-5)


def test_bounds_engine_sums_stay_float64_from_its_first_pass():
    """Later passes change the engine's float64 sums only by the rows that move, so its first
    pass's sums stay in every later centroid: they are the float64 sums of the transformed, weighted
    rows (not that pass's fp32 atomic sums, whose rounding over large clusters stayed, up to 7e-5
    relative on an H200). Each row counts as its fp32 transform, in the base and in the moves
    alike, so after more passes they still are (to the float64 additions' rounding)."""
    n, d, k = 257, 17, 9
    x, offset, weights, engine = _duplicates_engine(n, d, k)
    rows = ((x - offset) * weights[:, None]).double()
    for it in range(3):
        engine.iterate(has_prev=it > 0)
        engine.read(1)
        own = engine.labels.long()
        sums = torch.zeros(k, d, dtype=torch.float64, device=DEVICE).index_add_(0, own, rows)
        counts = torch.zeros(k, dtype=torch.float64, device=DEVICE).index_add_(0, own, weights.double())
        p = engine.assign_pass
        torch.testing.assert_close(p.move_sums[0], sums, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(p.move_counts[0], counts, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("after", ["2,1", "0,0", "1,2"])
def test_bounds_engine_searches_every_row_right_after_a_start_and_a_relocation(after, monkeypatch):
    """Where the dense tiles differ from the row-list ones, the passes right after the first and
    after a relocation (``TORCHKM_DENSE_PASSES``) search every row there: each pass's labels are
    the dense exact pass's, the float64 sums those of the rows by their labels, every stored bound
    holds, and the passes after them settle rows again."""
    monkeypatch.setenv("TORCHKM_DENSE_PASSES", after)
    after_start, after_relocation = (int(v) for v in after.split(","))
    n, d, k = 501, 17, 70
    x, c = _clustered(n, d, k, seed=5, sigma=0.05)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    norms = torch.linalg.vector_norm(x, dim=1)
    engine = BoundsEngine(x, c, labels, offset=None, row_scale=None, raw_norms=norms, sample_weight=None,
                          normalize=False, tol=0.0, block=2)
    assert (engine.dense_search is not None) == (after != "0,0")
    xd = x.double()
    kinds = []

    def one_pass(it):
        c_pass = engine.c.clone()
        if it == 0:
            engine.iterate(has_prev=False)
            engine.read(1)
        else:
            engine.run_block(1)
            engine.read(1)
            kinds.append("dense" if engine._order[0] is engine._dense_passes else "settle")
        want = assign(x, c_pass, precision="exact", raw_norms=norms).labels
        np.testing.assert_array_equal(labels.long().cpu().numpy(), want.cpu().numpy())
        own = labels.long()
        p = engine.assign_pass
        sums = torch.zeros(k, d, dtype=torch.float64, device=DEVICE).index_add_(0, own, xd)
        torch.testing.assert_close(p.move_sums[0], sums, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(p.move_counts[0], torch.bincount(own, minlength=k).double(), rtol=0, atol=0)
        sq = torch.cdist(xd, c_pass.double()) ** 2
        others = sq.scatter(1, own[:, None], float("inf")).min(1).values
        assert not bool((engine.lower.double() > others * (1 + 1e-6) + 1e-9).any()), f"pass {it}"
        return engine.info

    for it in range(5):
        info = one_pass(it)
    assert kinds == ["dense"] * after_start + ["settle"] * (4 - after_start)
    assert info.skipped_bound > 0.2  # settle passes settle rows again
    # A relocation (here cluster 3 made to look empty: it takes the farthest row): the next passes
    # search every row again.
    engine.counts[3] = 0.0
    engine.relocate(1)
    kinds.clear()
    for it in range(5, 8):
        one_pass(it)
    assert kinds == ["dense"] * after_relocation + ["settle"] * (3 - after_relocation)


def test_bounds_engine_reads_both_kinds_of_pass_in_the_order_they_ran(monkeypatch):
    """A block that runs passes over every row, then settle passes: ``read`` reports how each ran
    and its time (timed engines: the hybrid's trial) in that order."""
    monkeypatch.setenv("TORCHKM_DENSE_PASSES", "2,1")
    n, d, k = 501, 17, 70
    x, c = _clustered(n, d, k, seed=5, sigma=0.05)
    engine = BoundsEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), offset=None, row_scale=None,
                          raw_norms=None, sample_weight=None, normalize=False, tol=-1.0, block=4, timed=True)
    engine.iterate(has_prev=False)
    engine.read(1)
    engine.run_block(4)
    assert len(engine.read(4)) == 4
    assert [run is engine._dense_passes for run in engine._order] == [True, True, False, False]
    # (Without graphs: each kind's first call compiles and is not timed, later ones run eagerly.)
    assert engine.pass_kinds == ["first", "eager", "first", "eager"]
    assert [s is None for s in engine.pass_seconds] == [True, False, True, False]
    assert len(engine.pass_host_seconds) == 4
    # An eager pass's launches are its host time; a first call's (it compiles) are not counted.
    assert engine.pass_launch_seconds == [None, engine.pass_host_seconds[1], None, engine.pass_host_seconds[3]]
    engine.timed = False
    assert not any(run.timed for run in engine._replayed_passes())


def test_bounds_engine_counts_the_passes_a_handed_over_run_would_not_replay():
    """The hybrid's trial estimate (``unreplayed_passes``): a new engine's full pass, first settle
    pass and capture; a pass kind called once before with graphs costs its capture; a captured
    one nothing."""
    n, d, k = 301, 17, 20
    x, c = _clustered(n, d, k, seed=6, sigma=0.05)
    engine = BoundsEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), offset=None, row_scale=None,
                          raw_norms=None, sample_weight=None, normalize=False, tol=-1.0, block=4)
    assert engine.unreplayed_passes() == 3
    full, settle = engine._full_passes[True], engine._passes
    full.use_graphs = settle.use_graphs = True  # (as on CUDA)
    full.calls = settle.calls = 1
    assert engine.unreplayed_passes() == 2
    full.graph = object()
    assert engine.unreplayed_passes() == 1
    settle.graph = object()
    assert engine.unreplayed_passes() == 0
    full.graph = settle.graph = None  # (no graph to replay on the CPU)


@pytest.mark.parametrize("top_m", [0, 16])
@pytest.mark.parametrize("announce", [True, False])
def test_bounds_engine_lowers_its_bounds_after_centroids_change_outside_its_passes(announce, top_m, monkeypatch):
    """A centroid moved between passes (as empty-cluster relocation does) counts as a move once
    ``centroids_changed`` is called; without the call the stale bounds keep the row in its cluster,
    which is why the fit loop calls it. (With ``top_m`` the settle pass measures the rows against
    the centroids that moved most: the one moved here is not among those until announced.)"""
    monkeypatch.setenv("TORCHKM_TOP_MOVES", str(top_m))
    n, d, k = 300, 17, 20
    x, c = _clustered(n, d, k, seed=21, sigma=0.01)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    engine = BoundsEngine(x, c, labels, offset=None, row_scale=None, raw_norms=torch.linalg.vector_norm(x, dim=1),
                          sample_weight=None, normalize=False, tol=0.0)
    assert engine.top_m == top_m
    for it in range(8):  # converged blobs: centroids barely move, rows settle
        engine.iterate(has_prev=it > 0)
        engine.read(1)
    # Teleport a centroid the next settle pass would not measure onto a row of another cluster:
    # that row now belongs to it.
    listed = set(top_moves_reference(engine.moves, top_m)[0].tolist()) if top_m else set()
    moved = next(j for j in range(k) if j not in listed)
    # A row the last settle pass settled (two centroids in one blob leave rows searched every pass).
    settled = torch.ones(n, dtype=torch.bool, device=DEVICE)
    settled[engine.active_rows[: int(engine.active_count)].long()] = False
    row = int((settled & (labels != moved)).nonzero()[0])
    engine.c[moved] = x[row]
    if announce:
        engine.centroids_changed()
    c_before = engine.c.clone()
    engine.iterate(has_prev=True)
    engine.read(1)
    want = assign(x, c_before, precision="exact", raw_norms=torch.linalg.vector_norm(x, dim=1)).labels
    if announce:
        np.testing.assert_array_equal(labels.long().cpu().numpy(), want.cpu().numpy())
    else:
        assert int(want[row]) == moved and int(labels[row]) != moved


@pytest.mark.parametrize("k", [1, 7, 40, 1000])
@pytest.mark.parametrize("top_m", [2, 16])
def test_top_moves_kernel_matches_reference(k, top_m):
    """The settle pass's list of the centroids that moved most, with equal moves (the larger index
    first), unmoved centroids, and fewer centroids than the list holds (-1 past them, rest 0)."""
    from torchkm._kernels.prune import _top_moves_kernel

    g = torch.Generator().manual_seed(k + top_m)
    moves = torch.rand(k, generator=g)
    moves[torch.randperm(k, generator=g)[: k // 3]] = 0.0
    moves[: k // 4] = moves[k // 2] if k > 1 else moves[0]  # ties
    moves = moves.to(DEVICE)
    out = torch.full((top_m + 1,), 12345, dtype=torch.int32, device=DEVICE)
    _top_moves_kernel[(1,)](moves, out, k, TOP_M=top_m, BLOCK_K=max(16, triton.next_power_of_2(k)))
    ids, rest = top_moves_reference(moves, top_m)
    assert out[:top_m].long().cpu().tolist() == ids.cpu().tolist()
    assert float(out[top_m:].view(torch.float32)) == float(rest)


@pytest.mark.parametrize("top_m", [0, 16])
def test_bounds_engine_lower_bounds_hold(top_m, monkeypatch):
    """After every pass, each row's stored bound is at most its float64 squared distance to every
    centroid but its own (of the centroids that pass assigned to), with the top-moves rule and
    without; the rule settles at least as many rows as Hamerly's alone would."""
    monkeypatch.setenv("TORCHKM_TOP_MOVES", str(top_m))
    n, d, k = 501, 17, 70
    x, c = _clustered(n, d, k, seed=d + k, sigma=0.05)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    engine = BoundsEngine(x, c, labels, offset=None, row_scale=None, raw_norms=torch.linalg.vector_norm(x, dim=1),
                          sample_weight=None, normalize=False, tol=0.0)
    assert engine.top_m == top_m
    xd = x.double()
    for it in range(5):
        c_pass = engine.c.clone()
        if it > 0 and top_m:
            # What the settle pass will decide, by the reference rule on the same state.
            moves = engine.moves.clone()
            ref_settled = settle_reference(x, c_pass, labels, engine.lower.clone(), moves, top_m)[0]
            hamerly = settle_reference(x, c_pass, labels, engine.lower.clone(), moves, 0)[0]
            assert bool((ref_settled | ~hamerly).all())  # never fewer settled rows
        engine.iterate(has_prev=it > 0)
        engine.read(1)
        sq = torch.cdist(xd, c_pass.double()) ** 2
        others = sq.scatter(1, labels.long()[:, None], float("inf")).min(1).values
        bad = engine.lower.double() > others * (1 + 1e-6) + 1e-9
        assert not bool(bad.any()), f"pass {it}: {int(bad.sum())} bounds above the distance they bound"


def test_settle_reference_matches_bound_rule():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(50, 5, generator=g)
    c = torch.randn(4, 5, generator=g)
    labels = ((x[:, None] - c[None]) ** 2).sum(-1).argmin(1)
    sq_all = ((x[:, None] - c[None]) ** 2).sum(-1)
    second = sq_all.scatter(1, labels[:, None], float("inf")).min(1).values
    settled, sq, lower = settle_reference(x, c, labels, second, torch.zeros(4))
    # Unmoved centroids: every row with a clear gap settles, and the bound is the second distance.
    assert bool(settled[(second - sq) > 1e-3 * second].all())
    torch.testing.assert_close(lower, second, rtol=1e-4, atol=1e-6)
    settled, _, lower = settle_reference(x, c, labels, second, torch.full((4,), 100.0))
    assert not bool(settled.any()) and float(lower.max()) == 0.0


def test_triangle_engine_reorders_and_keeps_caller_order():
    n, d, k = 301, 3, 7
    x, c = _clustered(n, d, k, seed=11, sigma=0.05)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    engine = TriangleEngine(x, c, labels, offset=None, row_scale=None, sample_weight=None, normalize=False, tol=0.0,
                            workload_tol=10.0)  # reorder as soon as two passes are in
    for it in range(5):
        c_before = engine.c.clone()
        engine.iterate(has_prev=it > 0)
        engine.read(1)
        _check(x, c_before, engine.labels.long())
    assert engine.epoch == 2 and engine.perm is not None
    assert bool((engine.work[:-1] >= engine.work[1:]).float().mean() > 0.5)
    assert engine.info is not None and engine.info.skipped <= engine.info.skipped_bound + 1e-12


def test_triangle_engine_refuses_huge_k(monkeypatch):
    from torchkm._kernels import prune

    monkeypatch.setattr(prune, "MAX_TRIANGLE_K", 4)
    x, c = _clustered(20, 3, 5, seed=0)
    with pytest.raises(ValueError, match="k x k tables"):
        TriangleEngine(x, c, torch.empty(20, dtype=torch.int32, device=DEVICE), offset=None, row_scale=None,
                       sample_weight=None, normalize=False, tol=0.0)


# ----------------------------------------------------------------------------------------------
# Group bounds (triton_kernels/groups.py): the same labels with one bound per group of centroids.


def _group_engine(x, c, labels, group_size=16, **kwargs):
    from torchkm._kernels.groups import GroupBoundsEngine

    common = {"offset": None, "row_scale": None, "raw_norms": torch.linalg.vector_norm(x, dim=1),
              "sample_weight": None, "normalize": False, "tol": 0.0}
    common.update(kwargs)
    return GroupBoundsEngine(x, c, labels, group_size=group_size, **common)


def test_centroid_groups_partition_the_centroids_into_near_groups():
    from torchkm._kernels.groups import centroid_groups

    g = torch.Generator().manual_seed(5)
    c = torch.cat([torch.randn(32, 3, generator=g), torch.randn(32, 3, generator=g) + 100.0])
    members, group_of = centroid_groups(c, size=16)
    assert members.shape == (4, 16)
    listed = members[members >= 0]
    assert sorted(listed.tolist()) == list(range(64))  # every centroid once
    for gi, row in enumerate(members.tolist()):
        valid = [m for m in row if m >= 0]
        assert valid == sorted(valid) and all(int(group_of[m]) == gi for m in valid)
        # The first split separates the two far blobs: no group mixes them.
        assert len({m < 32 for m in valid}) == 1
    uneven, _ = centroid_groups(c[:37], size=16)  # parts of whole groups: 32 and 5
    assert sorted(int((row >= 0).sum()) for row in uneven) == [5, 16, 16]
    one, of_one = centroid_groups(c[:3], size=16)
    assert one.tolist()[0][:4] == [0, 1, 2, -1] and of_one.tolist() == [0, 0, 0]


@pytest.mark.parametrize("d,k", [(17, 70), (33, 7), (64, 40)])
def test_group_bounds_engine_labels_equal_dense_pass_each_iteration(d, k):
    n = 301
    x, c = _clustered(n, d, k, seed=d + k, sigma=0.05)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    engine = _group_engine(x, c, labels)
    assert engine.n_groups == -(-k // 16)
    _run(engine, x, 5)
    assert engine.info is not None and engine.info.kernel == "pruned"
    if k > 7:
        assert engine.info.skipped_bound > 0.5  # converging blobs: most groups are skipped


def test_group_bounds_engine_blocks_follow_the_dense_engine():
    """Blocks of 3 replayed under the device's control: every pass's statistics equal the dense
    engine's, and a block stops where a pass changed no label."""
    from torchkm._kernels.lloyd import LloydEngine

    n, d, k = 301, 17, 32  # no cluster empties (a block would freeze there for the host's relocation)
    x, c = _clustered(n, d, k, seed=3, sigma=0.05)
    engine = _group_engine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), block=3)
    dense = LloydEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), precision="exact", offset=None,
                        row_scale=None, raw_norms=torch.linalg.vector_norm(x, dim=1), sample_weight=None,
                        normalize=False, tol=0.0)
    rows = []
    for it in range(2):
        engine.iterate(has_prev=it > 0)
        rows += engine.read(1)
    while len(rows) < 40 and rows[-1][2] > 0:
        engine.run_block(3)
        for row in engine.read(3):
            rows.append(row)
            if row[2] == 0:
                break
    assert rows[-1][2] == 0, "the fit should converge"
    dense_rows = []
    for it in range(len(rows)):
        dense.iterate(has_prev=it > 0)
        dense_rows += dense.read(1)
    assert [r[2] for r in rows] == [r[2] for r in dense_rows]
    np.testing.assert_allclose([r[0] for r in rows], [r[0] for r in dense_rows], rtol=1e-5)
    np.testing.assert_array_equal(engine.labels.cpu().numpy(), dense.labels.cpu().numpy())
    torch.testing.assert_close(engine.c, dense.c, rtol=1e-5, atol=1e-6)


def test_group_bounds_engine_with_duplicates_ties_offset_weights_and_moved_centroids():
    n, d, k = 257, 17, 40
    x, c, offset, weights = _duplicates_case(n, d, k)
    labels = torch.empty(n, dtype=torch.int32, device=DEVICE)
    norms = torch.linalg.vector_norm(x, dim=1)
    engine = _group_engine(x, c - offset, labels, offset=offset, sample_weight=weights)
    for it in range(5):
        if it == 3:  # a centroid teleported between passes, as a relocation does
            engine.c[0] = x[int((labels != 0).nonzero()[0])] - offset
        c_before = engine.c.clone()
        engine.iterate(has_prev=it > 0)
        engine.read(1)
        dense = assign(x, c_before, precision="exact", offset=offset, raw_norms=norms)
        np.testing.assert_array_equal(engine.labels.long().cpu().numpy(), dense.labels.cpu().numpy())
        assert it > 0 or not bool((engine.labels == 5).any())  # the tie went to centroid 4
        w_expected = torch.zeros(k, dtype=torch.float64).index_add_(0, dense.labels.cpu(), weights.double().cpu())
        torch.testing.assert_close(engine.counts.double().cpu(), w_expected, rtol=1e-5, atol=1e-5)
