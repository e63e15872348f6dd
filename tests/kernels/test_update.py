"""triton_kernels/update.py (atomic and sorted-deterministic) against a float64 reference."""

import numpy as np
import pytest
import torch
from torchkm._kernels import update as update_module
from torchkm._kernels.assign import assign
from torchkm._kernels.update import (
    RELOCATE_MAX,
    add_sorted_sums,
    farthest_keys_reference,
    float64_sums,
    float64_sums_reference,
    move_rows_to_clusters,
    move_rows_to_clusters_reference,
    relocate_to_farthest,
    relocate_to_farthest_reference,
    update,
    update_reference,
)

from tests.helpers import assert_passes_count_changed_labels
from tests.kernels.conftest import DEVICE, ON_GPU


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_update_matches_reference(deterministic, d, k):
    g = torch.Generator().manual_seed(d * 7 + k)
    n = 301
    x = torch.randn(n, d, generator=g).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    w = torch.rand(n, generator=g).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    sums, counts = update(x, labels, k, sample_weight=w, offset=offset, deterministic=deterministic)
    ref_sums, ref_counts = update_reference(x, labels, k, sample_weight=w, offset=offset)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("replicas", [None, "1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_float64_sums_match_reference(monkeypatch, replicas, dtype, d, k):
    """The float64 scatter (one launch of float64 atomics, into ``configs.float64_replicas``
    copies or, ``TORCHKM_F64_REPLICAS=1``, straight into the sums) against its torch reference,
    with and without weights, offset and row scales, int32 and int64 labels, rows labelled -1 (left
    out), into poisoned ``out`` buffers: equal but for the float64 additions' order. Each row counts
    as its fp32 transform, the value the passes' moves add and take away."""
    if replicas:
        monkeypatch.setenv("TORCHKM_F64_REPLICAS", replicas)
    g = torch.Generator().manual_seed(d * 11 + k)
    n = 301
    x = (torch.randn(n, d, generator=g) * 3 + 1).to(dtype).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g)
    labels[torch.randperm(n, generator=g)[:40]] = -1
    labels = labels.to(DEVICE)
    kept = labels >= 0
    w = torch.rand(n, generator=g).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    scale = (torch.rand(n, generator=g) + 0.5).to(DEVICE)
    for kw in ({}, {"sample_weight": w, "offset": offset, "row_scale": scale}):
        for lab in (labels, labels.int()):
            out = (torch.full((k, d), float("nan"), dtype=torch.float64, device=DEVICE),
                   torch.full((k,), float("nan"), dtype=torch.float64, device=DEVICE))
            sums, counts = float64_sums(x, lab, k, out=out, **kw)
            assert sums is out[0] and counts is out[1]
            ref_sums, ref_counts = float64_sums_reference(x, lab, k, **kw)
            torch.testing.assert_close(sums, ref_sums, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(counts, ref_counts, rtol=1e-12, atol=1e-12)
        rows = x.float()
        if kw:
            rows = (rows - offset) * scale[:, None] * w[:, None]
        want = torch.zeros(k, d, dtype=torch.float64, device=DEVICE).index_add_(0, labels[kept], rows[kept].double())
        torch.testing.assert_close(ref_sums, want, rtol=1e-12, atol=1e-12)
    empty = float64_sums(x[:0], labels[:0], k)
    assert not empty[0].any() and not empty[1].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 3, 17, 129, 300])
@pytest.mark.parametrize("k", [2, 7, 1000])
def test_move_rows_to_clusters_matches_reference(dtype, d, k):
    """An empty-cluster relocation's sums change (one launch) against its torch reference: rows
    leave their clusters (two of them the same one, so atomics meet) and each becomes a whole empty
    cluster; a padded pair (cluster -1) changes nothing; with and without weights, offset and row
    scales, strided rows, int32 and int64 labels."""
    g = torch.Generator().manual_seed(d * 13 + k)
    n = 301
    x = (torch.randn(n, 2 * d, generator=g) * 3 + 1).to(dtype).to(DEVICE)[:, ::2]  # strided rows
    labels = torch.randint(0, k, (n,), generator=g)
    empty = [k - 1] if k < 7 else [k - 1, 3, 5]
    labels[torch.isin(labels, torch.tensor(empty))] = 0
    rows = torch.tensor([10, 200, 33][: len(empty)])
    labels[rows[:2]] = 0  # two moved rows leave the same cluster
    rows, clusters = torch.cat([rows, torch.tensor([7])]), torch.tensor([*empty, -1])
    w = (torch.rand(n, generator=g) + 0.1).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    scale = (torch.rand(n, generator=g) + 0.5).to(DEVICE)
    for kw in ({}, {"sample_weight": w, "offset": offset, "row_scale": scale}):
        for lab in (labels.to(DEVICE), labels.int().to(DEVICE)):
            sums, counts = update(x, lab, k, **kw)
            want_sums, want_counts = sums.clone(), counts.clone()
            move_rows_to_clusters_reference(x, rows.to(DEVICE), clusters.to(DEVICE), lab, want_sums, want_counts, **kw)
            move_rows_to_clusters(x, rows.to(DEVICE), clusters.to(DEVICE), lab, sums, counts, **kw)
            torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(counts, want_counts, rtol=1e-6, atol=1e-6)
            assert (counts[torch.tensor(empty, device=DEVICE)] > 0).all()
    with pytest.raises(ValueError, match="same length"):
        move_rows_to_clusters(x, rows.to(DEVICE), clusters[:1].to(DEVICE), labels.to(DEVICE), sums, counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [7, 1000])
def test_relocate_to_farthest_matches_reference(dtype, d, k):
    """The two-launch relocation against its torch reference: the empty clusters (index order)
    take the farthest rows (farthest first, ties to the lower row, rows of zero weight last), for
    fewer moves allowed than clusters empty, as many, and more; rows not a multiple of the kernels'
    chunk, with and without weights, offset and row scales, strided rows, int32 and int64 labels."""
    g = torch.Generator().manual_seed(d * 7 + k)
    n = 3001 if k == 1000 else 1501
    x = (torch.randn(n, 2 * d, generator=g) * 3 + 1).to(dtype).to(DEVICE)[:, ::2]  # strided rows
    empty = torch.tensor([k - 1, 3, 5, 0] if k < 100 else [999, 3, 5, 998, 512, 700, 1, 250, 251])
    labels = torch.randint(0, k, (n,), generator=g)
    labels[torch.isin(labels, empty)] = 2
    sq = torch.rand(n, generator=g)
    top = sq.max()
    sq[[40, 1200, 41]] = top + 1  # ties at the top: rows 40, 41, then 1200
    sq[[1500, 7]] = top + 0.5
    w = (torch.rand(n, generator=g) + 0.1).to(DEVICE)
    w[40] = 0.0  # the farthest row has no weight: it goes last
    offset = torch.randn(d, generator=g).to(DEVICE)
    scale = (torch.rand(n, generator=g) + 0.5).to(DEVICE)
    sq = sq.to(DEVICE)
    for kw in ({}, {"sample_weight": w, "offset": offset, "row_scale": scale}):
        for lab in (labels.to(DEVICE), labels.int().to(DEVICE)):
            sums, counts = update(x, lab, k, **kw)
            was_empty = (counts <= 0).nonzero().flatten()  # (at k = 1000 more than those emptied)
            n_empty = was_empty.numel()
            for max_moves in (2, len(empty), n_empty + 3):
                got_sums, got_counts, want_sums, want_counts = sums.clone(), counts.clone(), sums.clone(), counts.clone()
                relocate_to_farthest_reference(x, sq, lab, want_sums, want_counts, max_moves, **kw)
                relocate_to_farthest(x, sq, lab, got_sums, got_counts, max_moves, **kw)
                torch.testing.assert_close(got_sums, want_sums, rtol=1e-5, atol=1e-4)
                torch.testing.assert_close(got_counts, want_counts, rtol=1e-6, atol=1e-6)
                # The first max_moves of them are filled (a moved row may empty its own cluster).
                filled = (got_counts[was_empty] > 0).tolist()
                assert filled == [True] * min(max_moves, n_empty) + [False] * max(0, n_empty - max_moves)
    # The order itself: the first empty cluster takes row 41 where row 40 has no weight.
    sums, counts = update(x, labels.to(DEVICE), k, sample_weight=w)
    first = int((counts <= 0).nonzero()[0])
    relocate_to_farthest(x, sq, labels.to(DEVICE), sums, counts, 1, sample_weight=w)
    torch.testing.assert_close(sums[first], x[41].float() * w[41], rtol=1e-6, atol=1e-6)


def test_relocation_order_and_its_torch_paths():
    """``farthest_keys_reference`` ranks rows farthest first, ties to the lower row, zero weights
    last; ``_ops.farthest_rows`` (the torch engines' relocation) takes the same order; more moves
    than ``RELOCATE_MAX`` go through torch.topk; bad arguments are refused."""
    from torchkm import _ops

    sq = torch.tensor([1.0, 3.0, 0.0, 3.0, 2.0, 3.0, -0.0], device=DEVICE)
    w = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0], device=DEVICE)
    order = torch.sort(farthest_keys_reference(sq, w), descending=True).indices.tolist()
    assert order == [1, 5, 4, 0, 2, 6, 3]
    assert _ops.farthest_rows(sq, w, 5)[1].tolist() == [1, 5, 4, 0, 2]
    assert _ops.farthest_rows(sq.double().cpu(), None, 3)[1].tolist() == [1, 3, 5]
    assert _ops.farthest_rows(sq, None, 0)[1].numel() == 0
    g = torch.Generator().manual_seed(5)
    n, d, k = 900, 5, 80
    x = torch.randn(n, d, generator=g).to(DEVICE)
    labels = torch.randint(0, 40, (n,), generator=g).to(DEVICE)  # clusters 40..79 empty
    sq = torch.rand(n, generator=g).to(DEVICE)
    sums, counts = update(x, labels, k)
    want_sums, want_counts = sums.clone(), counts.clone()
    relocate_to_farthest(x, sq, labels, sums, counts, RELOCATE_MAX + 5)
    relocate_to_farthest_reference(x, sq, labels, want_sums, want_counts, RELOCATE_MAX + 5)
    torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, want_counts)
    assert int((counts <= 0).sum()) == 40 - RELOCATE_MAX - 5
    # Empty clusters in different chunks of the counts the merging program reads (4,096 wide).
    k = 9000
    empty = torch.tensor([3, 4100, 4101, 8999])
    labels = torch.cat([torch.arange(k), torch.randint(0, k, (501,), generator=g)])
    labels[torch.isin(labels, empty)] = 7
    x = torch.randn(labels.numel(), d, generator=g).to(DEVICE)
    labels, sq = labels.to(DEVICE), torch.rand(labels.numel(), generator=g).to(DEVICE)
    sums, counts = update(x, labels, k)
    want_sums, want_counts = sums.clone(), counts.clone()
    relocate_to_farthest(x, sq, labels, sums, counts, 4)
    relocate_to_farthest_reference(x, sq, labels, want_sums, want_counts, 4)
    torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, want_counts)
    assert bool((counts[empty.to(DEVICE)] == 1).all())
    with pytest.raises(ValueError, match="sq_distances"):
        relocate_to_farthest(x, sq[:-1], labels, sums, counts, 1)
    with pytest.raises(ValueError, match="float32"):
        relocate_to_farthest(x, sq, labels, sums.double(), counts, 1)
    with pytest.raises(ValueError, match="max_moves"):
        relocate_to_farthest(x, sq, labels, sums, counts, -1)
    assert update_module.RELOCATE_MAX == RELOCATE_MAX


@pytest.mark.parametrize(("dtype", "d", "k"), [*((torch.float32, d, k) for d in (1, 3, 17, 129) for k in (1, 7, 1000)),
                                               (torch.bfloat16, 129, 1000)])
def test_sorted_sums_add_to_the_reference(dtype, d, k):
    """``add_sorted_sums`` (runs of one label per block of 128 rows in label order, one atomic a
    run): weighted, scaled, offset rows added onto what the sums already hold, against float64;
    one label takes half the rows (its run crosses several blocks), 333 rows not a multiple of the
    block; int32 and int64 labels; a frozen control word adds nothing."""
    g = torch.Generator().manual_seed(d * 11 + k)
    n = 333
    x = torch.randn(n, d, generator=g).to(dtype).to(DEVICE)
    labels = torch.where(torch.rand(n, generator=g) < 0.5, k // 2, torch.randint(0, k, (n,), generator=g)).to(DEVICE)
    w = torch.rand(n, generator=g).to(DEVICE)
    scale = torch.rand(n, generator=g).to(DEVICE) + 0.5
    offset = torch.randn(d, generator=g).to(DEVICE)
    base_sums, base_counts = torch.randn(k, d, generator=g).to(DEVICE), torch.rand(k, generator=g).to(DEVICE)
    ref_sums, ref_counts = update_reference(x, labels, k, sample_weight=w, offset=offset, row_scale=scale)
    for label_dtype in (torch.int64, torch.int32):
        sums, counts = base_sums.clone(), base_counts.clone()
        add_sorted_sums(x, labels.to(label_dtype), sums, counts, sample_weight=w, offset=offset, row_scale=scale)
        torch.testing.assert_close(sums, base_sums + ref_sums, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(counts, base_counts + ref_counts, rtol=1e-5, atol=1e-4)
    sums, counts = base_sums.clone(), base_counts.clone()
    add_sorted_sums(x, labels, sums, counts, control=torch.ones(1, dtype=torch.int32, device=DEVICE))
    assert torch.equal(sums, base_sums) and torch.equal(counts, base_counts)
    add_sorted_sums(x, labels, sums, counts, control=torch.zeros(1, dtype=torch.int32, device=DEVICE))
    plain_sums, plain_counts = update_reference(x, labels, k)
    torch.testing.assert_close(sums, base_sums + plain_sums, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(counts, base_counts + plain_counts, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="sums"):
        add_sorted_sums(x, labels, sums[:, :-1] if d > 1 else sums[:-1], counts)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_sorted_sums_replay_in_a_cuda_graph():
    """The sort and the launch of ``add_sorted_sums`` are captured and replayed (a fit's blocks of
    Lloyd iterations are CUDA graphs) and add what the eager call adds, for new labels too:
    100,003 bf16 rows of 768 features, clusters of very unequal size."""
    n, d, k = 100_003, 768, 1000
    x = torch.randn(n, d, device="cuda").to(torch.bfloat16)
    offset = torch.randn(d, device="cuda")
    labels = (torch.rand(n, device="cuda") ** 4 * k).long()
    sums, counts = torch.zeros(k, d, device="cuda"), torch.zeros(k, device="cuda")
    add_sorted_sums(x, labels, sums, counts, offset=offset)  # (warm-up before capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sums.zero_()
        counts.zero_()
        add_sorted_sums(x, labels, sums, counts, offset=offset)
    for _ in range(2):
        labels.copy_((torch.rand(n, device="cuda") ** 4 * k).long())
        graph.replay()
        ref_sums, ref_counts = update_reference(x, labels, k, offset=offset)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(counts, ref_counts)


def test_row_scale_half_input_and_int32_labels():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 10, generator=g).half().to(DEVICE)
    labels = torch.randint(0, 4, (200,), generator=g).int().to(DEVICE)
    scale = torch.rand(200, generator=g).to(DEVICE) + 0.5
    for deterministic in (False, True):
        sums, counts = update(x, labels, 4, row_scale=scale, deterministic=deterministic)
        ref_sums, ref_counts = update_reference(x, labels, 4, row_scale=scale)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(counts, ref_counts)


def test_sorted_update_is_bit_identical_across_runs():
    n, d, k = (2_000_000, 64, 16) if ON_GPU else (500, 8, 3)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, d, generator=g).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    first = update(x, labels, k, deterministic=True)
    for _ in range(3):
        again = update(x, labels, k, deterministic=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_bad_arguments():
    x = torch.randn(10, 3, device=DEVICE)
    with pytest.raises(ValueError, match="labels"):
        update(x, torch.zeros(9, dtype=torch.int64, device=DEVICE), 2)
    with pytest.raises(ValueError, match="labels"):
        update(x, torch.zeros(10, device=DEVICE), 2, deterministic=True)
    with pytest.raises(ValueError, match="n_clusters"):
        update(x, torch.zeros(10, dtype=torch.int64, device=DEVICE), 0)


@pytest.mark.parametrize("fused", [False, True])
def test_onehot_sums_keep_every_bit_of_fp32_rows(fused):
    """The one-hot sums (few clusters) multiply rows split into three bf16 parts: together exact for
    these rows, whose 22 significant bits need all three (1 + 3 2^-12 + 5 2^-21 splits into 1,
    3 2^-12 + 2^-18 and -3 2^-21). Four rows a cluster keep every fp32 sum exact, so the sums must
    equal float64's bit for bit: two parts alone would be 2^-19 off."""
    k, d = 3, 17  # d > 8: the tensor-core pass (the small-d kernel sums in registers)
    value = 1 + 3 * 2.0**-12 + 5 * 2.0**-21
    g = torch.Generator().manual_seed(7)
    labels = torch.arange(4 * k) % k
    # Per cluster a sign and a power of two, per feature a power of two: sums stay exact.
    cluster = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)[labels, None]
    scale = 2.0 ** torch.randint(-40, 40, (1, d), generator=g).double()
    x = (cluster * value * scale).contiguous()
    assert torch.equal(x.float().double(), x)
    ref = torch.zeros(k, d, dtype=torch.float64).index_add_(0, labels, x)
    x = x.float().to(DEVICE)
    if fused:
        # The assignment pass's own sums: centroids at the rows' values, each row its cluster's.
        c = torch.stack([x[labels == j][0] for j in range(k)])
        sums = torch.zeros(k, d, device=DEVICE)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, precision="exact", sums=sums, counts=counts)
        assert torch.equal(out.labels.cpu(), labels)
    else:
        sums, counts = update(x, labels.to(DEVICE), k)
    assert torch.equal(sums.double().cpu(), ref)
    assert torch.equal(counts.cpu(), torch.full((k,), 4.0))


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("d,k", [(2, 32), (5, 70), (33, 40), (33, 70), (32, 200), (128, 70)])
def test_lloyd_passes_count_the_labels_they_change_in_place(precision, d, k):
    """A fit's passes write the labels over the previous ones while adding the rows into the sums:
    each pass's changed count is the number of labels it changed. On an H200 these counts were up
    to a third short (a row's label stored by one thread before another read the previous one)."""
    from torchkm._kernels.lloyd import LloydEngine

    n = 100_003 if ON_GPU else 301
    g = torch.Generator().manual_seed(n + d + k)
    centres = torch.rand(k, d, generator=g)
    x = (centres[torch.randint(0, k, (n,), generator=g)] + 0.05 * torch.randn(n, d, generator=g)).to(DEVICE)
    c = x[torch.randperm(n, generator=g)[:k].to(DEVICE)] + 0.01 * torch.randn(k, d, generator=g).to(DEVICE)
    engine = LloydEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), precision=precision, offset=None,
                         row_scale=None, raw_norms=torch.linalg.vector_norm(x, dim=1), sample_weight=None,
                         normalize=False, tol=0.0)
    assert_passes_count_changed_labels(engine, 4)


@pytest.mark.parametrize("d,k", [(17, 100), (33, 70)])
def test_dense_engine_float64_moves_keep_the_sums_of_rows_by_label(d, k):
    """``LloydEngine(moves=True)``: after every pass the float64 sums the passes move rows between
    are the sums of the rows (fp32 transforms, weighted) by their labels, and the passes' labels
    and counts are the fp32 sums engine's. A new fit's rows are labelled -1 (its first pass adds
    them all), ``iterate(has_prev=False)`` does the same, and a restart over labelled rows (the
    hybrid handing a run back) starts from the sums of those labels."""
    from torchkm._kernels.assign import AssignPass
    from torchkm._kernels.lloyd import LloydEngine

    n = 2_003 if ON_GPU else 301
    g = torch.Generator().manual_seed(d * k)
    centres = torch.rand(k, d, generator=g)
    x = (centres[torch.randint(0, k, (n,), generator=g)] + 0.05 * torch.randn(n, d, generator=g)).to(DEVICE)
    c = x[torch.randperm(n, generator=g)[:k].to(DEVICE)] + 0.01 * torch.randn(k, d, generator=g).to(DEVICE)
    w = (torch.rand(n, generator=g) + 0.1).to(DEVICE)
    offset = x.mean(0)
    inputs = {"offset": offset, "row_scale": None, "raw_norms": None, "sample_weight": w}
    common = {**inputs, "normalize": False, "tol": 0.0, "precision": "exact", "block": 2}

    def engine(moves, start=c):
        labels = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
        return LloydEngine(x, start - offset, labels, moves=moves, **common)

    def run(e, passes, first=True):
        """A fit's passes: the first in a block of its own (as ``_loop.lloyd`` runs it), then blocks
        of two; with ``moves``, the sums and centroids checked after each."""
        rows = []
        while len(rows) < passes:
            e.run_block(1 if first and not rows else 2)
            rows += e.read(1 if first and len(rows) == 0 else 2)
            if e.moves:
                sums, counts = float64_sums_reference(x, e.labels, k, sample_weight=w, offset=offset)
                p = e.assign_pass
                torch.testing.assert_close(p.move_sums[0], sums, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(p.move_counts[0], counts, rtol=1e-12, atol=1e-12)
                filled = counts > 0  # (a pass that leaves a cluster empty stops the block: no relocation here)
                torch.testing.assert_close(e.c[filled], (sums / counts[:, None]).float()[filled], rtol=1e-6, atol=1e-7)
        return rows

    moving, plain = engine(True), engine(False)
    assert moving.moves and not plain.moves
    rows, plain_rows = run(moving, 7), run(plain, 7)
    assert [r[2] for r in rows] == [r[2] for r in plain_rows]  # labels changed, pass by pass
    np.testing.assert_allclose([r[0] for r in rows], [r[0] for r in plain_rows], rtol=1e-5)
    assert torch.equal(moving.labels, plain.labels)
    # A restart over labelled rows (the hybrid handing a run back): the base is their sums.
    moving.restart(moving.c + 1e-3)
    run(moving, 2, first=False)
    # A new fit's restart: labels -1, as from a new engine; and a first pass without previous labels.
    start = c + 0.02 * torch.randn(k, d, generator=g).to(DEVICE)
    moving.restart(start - offset)
    moving.labels.fill_(-1)
    fresh, initial = engine(True, start), engine(True, start)
    rows, fresh_rows = run(moving, 5), run(fresh, 5)
    initial.iterate(has_prev=False)
    initial_rows = initial.read(1) + run(initial, 4, first=False)
    # Changed counts, shifts and empties to the bit; the inertia is an fp32 sum of per-program parts,
    # whose order may vary on a GPU.
    assert [r[1:] for r in rows] == [r[1:] for r in fresh_rows] == [r[1:] for r in initial_rows]
    np.testing.assert_allclose([r[0] for r in rows], [r[0] for r in fresh_rows], rtol=1e-6)
    np.testing.assert_allclose([r[0] for r in rows], [r[0] for r in initial_rows], rtol=1e-6)
    assert torch.equal(moving.c, fresh.c) and torch.equal(fresh.c, initial.c)
    with pytest.raises(ValueError, match="float64 moves"):
        LloydEngine(x, c, torch.empty(n, dtype=torch.int32, device=DEVICE), moves=True, all_reduce=lambda t: None,
                    **common)
    with pytest.raises(ValueError, match="float64 moves"):
        LloydEngine(x, c[:64], torch.empty(n, dtype=torch.int32, device=DEVICE), moves=True, **common)
    few = AssignPass(x, 7, "exact", update=True, moves=True)
    if few.update == 3:  # carried sums: persistent programs, which walk every tile only with a row list
        with pytest.raises(ValueError, match="carried sums"):
            few(x, c[:7], **inputs, prev_labels=moving.labels, labels=moving.labels, moves=True)
