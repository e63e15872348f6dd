"""triton_kernels/hopper_search.py: which rows it takes, the pass's epilogue over its record (any
device, through ``search_reference``), and the Gluon kernel against that reference (Hopper GPUs)."""

import pytest
import torch
from torchkm._kernels import hopper_search
from torchkm._kernels.assign import HALF_FAST_MIN_K, AssignPass, assign
from torchkm._kernels.update import update_reference

from tests.kernels.conftest import DEVICE, ON_GPU
from tests.kernels.test_assign import (
    _check_fp16_against_tf32,
    _check_fused_pass,
    _check_labels,
    _data,
    _fp16_operand_rows,
    _over_split_rows,
)

ON_HOPPER = ON_GPU and hopper_search.available()


@pytest.fixture(autouse=True)
def streamed_on(monkeypatch):
    """The streamed search taken where it applies (``hopper_search.streamed``), whatever its default."""
    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "1")


@pytest.fixture
def searched(monkeypatch):
    """Passes take the search record from ``search_reference``; returns the list of its calls."""
    monkeypatch.setenv("TORCHKM_HOPPER_SEARCH", "reference")
    calls = []
    reference = hopper_search.search_reference

    def spy(*args, **kwargs):
        calls.append((tuple(args[0].shape), kwargs.get("half_scale") is not None))
        return reference(*args, **kwargs)

    monkeypatch.setattr(hopper_search, "search_reference", spy)
    return calls


def test_exact_programs_by_row_width(monkeypatch):
    """The exact search's program shapes (what the launch would run, no GPU needed): two programs
    of two warpgroups an SM over 16-bit operands of 128 padded features, with four stages and 128
    registers each; three one-warpgroup programs at 64; two at 256. The centroid tile is the fast
    mode's in each case (the packed keys' tile bits assume it)."""
    monkeypatch.delenv("TORCHKM_HOPPER_CONFIG", raising=False)
    monkeypatch.delenv("TORCHKM_HOPPER_PROGRAMS", raising=False)
    extra = hopper_search.extra_k(torch.bfloat16)
    for d_pad, block_n, warps, occupancy in ((128, 128, 8, (4, 2)), (64, 64, 4, (3, 3)), (256, 64, 4, (2, 2))):
        config = hopper_search._config(2, d_pad, check=True)
        assert (config[0], config[3]) == (block_n, warps)
        assert config[1] == hopper_search._config(2, d_pad)[1]
        stages, programs = hopper_search._occupancy(2, d_pad, extra, config)
        assert (stages, programs) == occupancy
        assert stages * config[1] * (d_pad + extra) * 2 + block_n * (d_pad + extra) * 2 <= hopper_search._SHARED_BYTES // programs
    # fp32 rows multiplied as tf32 keep the one-warpgroup programs.
    assert hopper_search._config(4, 128, check=True) == hopper_search._ONE_WARPGROUP_CONFIG


def test_supported_takes_only_rows_the_kernel_handles():
    x32 = torch.zeros(10, 128)
    assert hopper_search.supported(x32, 129, scaled=False, split=False, row_list=False)
    assert not hopper_search.supported(x32, 64, scaled=False, split=False, row_list=False)  # one centroid tile
    assert not hopper_search.supported(x32, 1000, scaled=True, split=False, row_list=False)
    assert not hopper_search.supported(x32, 1000, scaled=False, split=True, row_list=False)
    assert not hopper_search.supported(x32, 1000, scaled=False, split=False, row_list=True)
    assert hopper_search.supported(torch.zeros(10, 100), 1000, scaled=False, split=False, row_list=False)
    assert not hopper_search.supported(torch.zeros(10, 32), 1000, scaled=False, split=False, row_list=False)
    # 16-bit rows from 64 padded features too (the tl.dot search is faster at 17-32, configs.assign_config)
    for features, taken in ((16, False), (24, False), (32, False), (40, True)):
        rows16 = torch.zeros(10, features, dtype=torch.bfloat16)
        assert hopper_search.supported(rows16, 1000, scaled=False, split=False, row_list=False) == taken
    assert not hopper_search.supported(torch.zeros(10, 20, dtype=torch.float16), 1000, scaled=False, split=False,
                                       row_list=False)  # rows not a multiple of 16 bytes
    assert not hopper_search.supported(torch.zeros(10, 32), 1000, scaled=False, split=False, row_list=False,
                                       dtype=torch.float16)  # fp32 rows converted: from 64
    assert not hopper_search.supported(torch.zeros(10, 129), 1000, scaled=False, split=False, row_list=False)
    assert not hopper_search.supported(torch.zeros(10, 101), 1000, scaled=False, split=False, row_list=False)
    assert hopper_search.supported(torch.zeros(10, 256, dtype=torch.bfloat16), 1000, scaled=False, split=False,
                                   row_list=False)
    assert hopper_search.supported(torch.zeros(10, 256), 1000, scaled=False, split=False, row_list=False)
    assert hopper_search.supported(torch.zeros(10, 200), 1000, scaled=False, split=False, row_list=False)
    assert not hopper_search.supported(torch.zeros(10, 512), 1000, scaled=False, split=False, row_list=False)
    # 16-bit rows wider than 256 padded features: the streamed search, where its row tile fits.
    for features in (312, 512, 768, 1600):
        assert hopper_search.supported(torch.zeros(10, features, dtype=torch.bfloat16), 1000, scaled=False,
                                       split=False, row_list=False)
    assert hopper_search.supported(torch.zeros(10, 1000, dtype=torch.float16), 1000, scaled=False, split=False,
                                   row_list=False)
    assert not hopper_search.supported(torch.zeros(10, 1608, dtype=torch.bfloat16), 1000, scaled=False, split=False,
                                       row_list=False)  # no room for the row tile
    assert not hopper_search.supported(torch.zeros(10, 768, dtype=torch.bfloat16), 64, scaled=False, split=False,
                                       row_list=False)  # one centroid tile
    assert not hopper_search.supported(torch.zeros(10, 768), 1000, scaled=False, split=False, row_list=False,
                                       dtype=torch.float16)  # fp32 rows converted: not streamed
    assert not hopper_search.supported(torch.zeros(10, 256)[:, ::2], 1000, scaled=False, split=False,
                                       row_list=False)  # strided features
    assert not hopper_search.supported(torch.zeros(10, 129)[:, 1:], 1000, scaled=False, split=False,
                                       row_list=False)  # rows not 16-byte aligned
    assert not hopper_search.supported(torch.zeros(10, 128, dtype=torch.float64), 1000, scaled=False, split=False,
                                       row_list=False)


def test_streamed_shape_fits_shared_memory(monkeypatch):
    """The streamed search's resident row tile and at least three centroid stages fit an sm_90
    block's shared memory: 128 rows where they fit, else 64, else none; the switch turns it off and
    the experiments' config sets the tiles."""
    monkeypatch.delenv("TORCHKM_HOPPER_STREAMED_CONFIG", raising=False)
    for d in (257, 300, 512, 768, 776, 1000, 1536, 1600, 1608, 2048):
        shape = hopper_search.streamed_shape(d)
        assert (shape is None) == (d > 1600)
        if shape is None:
            continue
        block_n, block_k, block_d, chunks, stages, _ = shape
        assert chunks * block_d >= d and stages >= 3
        assert block_n == (128 if d <= 768 else 64)
        assert (block_n * chunks + stages * block_k) * block_d * 2 <= hopper_search._SHARED_BYTES
    rows = torch.zeros(10, 768, dtype=torch.bfloat16)
    assert hopper_search.streamed(rows) and not hopper_search.packed(rows, 8192)
    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED_CONFIG", "64,32,0,1")
    assert hopper_search.streamed_shape(768) == (128, 64, 32, 24, 8, 1)
    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "0")
    assert not hopper_search.streamed(rows)
    assert not hopper_search.supported(rows, 1000, scaled=False, split=False, row_list=False)


def test_ring_shape_fits_shared_memory_and_serves_the_fast_mode(monkeypatch):
    """The ring search's stages (a row chunk and a centroid chunk each) fit an sm_90 block's shared
    memory whatever the row width (three stages for the fast mode, four for the exact one); by
    default (``TORCHKM_HOPPER_STREAMED=ring``) wide 16-bit rows take it in both modes, in the
    exact mode not under ``TORCHKM_HOPPER_RING_EXACT=0`` (``streamed_checks``)."""
    monkeypatch.delenv("TORCHKM_HOPPER_RING_CONFIG", raising=False)
    monkeypatch.delenv("TORCHKM_HOPPER_RING_EXACT", raising=False)
    for d in (257, 312, 768, 1000, 1600):
        for check, stages_expected in ((False, 3), (True, 4)):
            block_n, block_k, block_d, chunks, stages = hopper_search.ring_shape(d, check=check)
            assert (block_n, block_k, block_d, stages) == (128, 256, 64, stages_expected)
            assert chunks * block_d >= d > (chunks - 1) * block_d
            assert stages * (block_n + block_k) * block_d * 2 <= hopper_search._SHARED_BYTES
    monkeypatch.setenv("TORCHKM_HOPPER_RING_CONFIG", "256,64,8")  # more stages than fit: as many as do
    assert hopper_search.ring_shape(768)[4] == 4
    rows = torch.zeros(10, 768, dtype=torch.bfloat16)
    monkeypatch.delenv("TORCHKM_HOPPER_STREAMED")
    assert hopper_search.STREAMED_DEFAULT == "ring"
    assert hopper_search.streamed(rows) and hopper_search.streamed_checks(rows)
    assert not hopper_search.streamed(torch.zeros(10, 256, dtype=torch.bfloat16))
    assert not hopper_search.streamed(torch.zeros(10, 768))  # fp32 rows: fp16 operands, the tl.dot search
    monkeypatch.setenv("TORCHKM_HOPPER_RING_EXACT", "0")
    assert hopper_search.streamed(rows) and not hopper_search.streamed_checks(rows)
    assert hopper_search.supported(rows, 1000, scaled=False, split=False, row_list=False)
    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "1")
    assert hopper_search.streamed(rows) and hopper_search.streamed_checks(rows)


def test_ring_keys_stay_within_their_slack(monkeypatch):
    """The ring search's keys (``ring_packed``, on by default): a score with a column in its 8 lowest
    bits stays within ``RING_KEY_SLACK`` of the key's magnitude (plus 1e-30, subnormals), so the
    record's moves by that much bound the scores; keys order as their truncated scores, then their
    columns (non-negative scores; negative ones within the slack either way)."""
    monkeypatch.delenv("TORCHKM_HOPPER_RING_PACKED", raising=False)
    assert hopper_search.ring_packed()
    monkeypatch.setenv("TORCHKM_HOPPER_RING_PACKED", "0")
    assert not hopper_search.ring_packed()
    g = torch.Generator().manual_seed(5)
    scores = torch.cat([torch.randn(100_000, generator=g) * 10.0 ** torch.randint(-30, 30, (100_000,), generator=g),
                        torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e30, -3e38, 3e38])])
    cols = torch.randint(0, 256, scores.shape, generator=g, dtype=torch.int32)
    keys = ((scores.view(torch.int32) & -256) | cols).view(torch.float32)
    assert torch.isfinite(keys).all()
    slack = keys.double().abs() * hopper_search.RING_KEY_SLACK + 1e-30
    assert ((keys.double() - scores.double()).abs() < slack).all()
    # The record's moves, in fp32 as the kernel makes them, still bound the scores.
    raised = keys + (keys.abs() * hopper_search.RING_KEY_SLACK + 1e-30)
    lowered = keys - (keys.abs() * hopper_search.RING_KEY_SLACK + 1e-30)
    assert (raised.double() >= scores.double()).all() and (lowered.double() <= scores.double()).all()
    positive = scores >= 0
    trunc = (scores.view(torch.int32) & -256)[positive].long()
    order = torch.argsort(keys[positive])
    assert (trunc[order].diff() >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [65, 129, 1000])
def test_search_operands_split_the_bias_exactly(dtype, k):
    """The packed search's centroid operand: each bias as three parts exact in the product's operand
    type (tf32: 11 significant bits; bf16: 8) summing to it exactly, then three ones, zeros, and
    padding centroids up to a multiple of 128 (whole tiles of any config) with a bias that loses
    to any real one."""
    bias = torch.randn(k, device=DEVICE) * torch.logspace(-3, 6, k, device=DEVICE)
    bias[0] = 0.0
    bias[1] = -bias[1].abs()
    got = hopper_search.search_operands(bias, dtype)
    k_pad = -(-k // 128) * 128
    assert got.shape == (k_pad, hopper_search.extra_k(dtype)) and got.dtype == dtype
    assert torch.equal(got, hopper_search.search_operands_reference(bias, dtype))
    parts = got.float()
    assert torch.equal(parts[:k, 0].double() + parts[:k, 1].double() + parts[:k, 2].double(), bias.double())
    keep = -8192 if dtype == torch.float32 else -65536
    assert torch.equal(parts[:, :3], (parts[:, :3].view(torch.int32) & keep).view(torch.float32))
    assert (parts[:, 3:6] == 1).all() and (parts[:, 6:] == 0).all()
    assert (parts[k:, :3].sum(1) >= 1e29).all()


@pytest.mark.parametrize("k", [65, 129, 1000])
def test_search_operands_split_the_bias_into_fp16_parts(k):
    """fp16 operands: each bias (in the products' units, below 2^31) as four fp16 parts against the
    powers of two ``HALF_PART_SCALES``, summing to it to within 2^-44 |bias| + 2^-39; then those
    scales (against the row term's parts), zeros, and padding centroids whose bias (about 2^31)
    loses to any real score plus row term (below 2^29)."""
    bias = torch.randn(k, device=DEVICE) * torch.logspace(-12, 8, k, device=DEVICE)
    bias[0] = 0.0
    bias[1] = -bias[1].abs()
    bias[2] = 2.0 ** 29
    got = hopper_search.search_operands(bias, torch.float16)
    k_pad = -(-k // 128) * 128
    assert got.shape == (k_pad, 16) and got.dtype == torch.float16
    assert torch.equal(got, hopper_search.search_operands_reference(bias, torch.float16))
    parts = got.double()
    scales = torch.tensor(hopper_search.HALF_PART_SCALES, dtype=torch.float64, device=DEVICE)
    total = parts[:, :4] @ scales
    assert ((total[:k] - bias.double()).abs() <= 2.0 ** -44 * bias.double().abs() + 2.0 ** -39).all()
    assert (parts[:, 4:8] == scales).all() and (parts[:, 8:] == 0).all()
    assert (total[k:] >= 2.0 ** 30.9).all()


def test_given_up_score_by_additions_is_within_the_floors_margin():
    """The exact fold's given-up score ``(best - min(best, key)) + key`` (``_fold_tile`` with
    SECOND_SUMS), in fp32 as the kernel computes it: never below the new best (so a second never
    floors below its slot's best), equal to max(best, key) when key >= best / 2, and otherwise
    within 2^-23 of it (``_key_floor`` lowers such seconds by another 2^-21); an infinite best
    stays infinite. Positive keys, as the packed search's are (its row term's margin)."""
    g = torch.Generator().manual_seed(7)
    n = 200_000
    best = torch.exp2(torch.empty(n).uniform_(-40, 40, generator=g))
    # Keys from far below the best to above it, with ratios near 1/2 and 1 and exact ties.
    ratio = torch.cat([torch.exp2(torch.empty(n // 2).uniform_(-30, 2, generator=g)),
                       torch.empty(n // 4).uniform_(0.45, 0.55, generator=g),
                       torch.empty(n // 4).uniform_(0.999, 1.001, generator=g)])
    ratio[::97] = 1.0
    best = best.float()
    key = (best.double() * ratio.double()).float()
    new_best = torch.minimum(best, key)
    given_up = (best - new_best) + key
    largest = torch.maximum(best, key).double()
    assert (given_up >= new_best).all()
    assert ((given_up.double() - largest).abs() <= 2.0 ** -23 * largest).all()
    halved = key >= best / 2
    assert halved.float().mean() > 0.3
    assert torch.equal(given_up[halved], torch.maximum(best, key)[halved])
    inf = torch.full((3,), float("inf"))
    finite = torch.tensor([0.5, 3.0e38, 1.0e-30])
    assert torch.isinf((inf - torch.minimum(inf, finite)) + finite).all()


def test_packed_takes_fp32_and_bf16_up_to_1024_tiles(monkeypatch):
    x32, x16 = torch.zeros(2, 128), torch.zeros(2, 128, dtype=torch.bfloat16)
    assert hopper_search.packed(x32, 4096) and hopper_search.packed(x16, 65_536)
    assert hopper_search.tile_bits(4096, 4) == 6 and hopper_search.tile_bits(129, 4) == 2
    assert hopper_search.packed(torch.zeros(2, 256), 65_536) and hopper_search.tile_bits(8192, 4, 256) == 7
    assert not hopper_search.packed(x32, 65_537)
    assert not hopper_search.packed(torch.zeros(2, 128, dtype=torch.float16), 4096)
    assert hopper_search.packed(x32, 4096, half=True) and not hopper_search.packed(x16, 4096, half=True)
    assert not hopper_search.packed(x32, 65_537, half=True)
    monkeypatch.setenv("TORCHKM_HOPPER_PACKED", "no-half")
    assert hopper_search.packed(x32, 4096) and not hopper_search.packed(x32, 4096, half=True)
    monkeypatch.setenv("TORCHKM_HOPPER_PACKED", "0")
    assert not hopper_search.packed(x32, 4096) and not hopper_search.packed(x32, 4096, half=True)


def test_mode_follows_the_switch(monkeypatch):
    monkeypatch.setenv("TORCHKM_HOPPER_SEARCH", "0")
    assert hopper_search.mode() is None
    monkeypatch.setenv("TORCHKM_HOPPER_SEARCH", "reference")
    assert hopper_search.mode() == "reference"
    monkeypatch.setenv("TORCHKM_HOPPER_SEARCH", "1")
    assert hopper_search.mode() == ("kernel" if hopper_search.available() else None)


def test_supported_reads_no_address_from_a_traced_tensor():
    """Under torch.compile the rows are fake tensors, which have no address: their storage offset
    decides the alignment (the op copies a block that still arrives misaligned)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(10, 132)  # rows of 528 bytes
        assert hopper_search.traced(x)
        assert hopper_search.supported(torch.empty(10, 128), 1000, scaled=False, split=False, row_list=False)
        assert hopper_search.supported(x[2:, :128], 1000, scaled=False, split=False, row_list=False)
        assert not hopper_search.supported(x[:, 1:129], 1000, scaled=False, split=False, row_list=False)
    assert not hopper_search.traced(torch.zeros(3))


@pytest.mark.parametrize("check", [False, True])
def test_search_op_writes_its_slot(searched, check):
    """``torchkm::hopper_search`` (the search as torch.compile sees it) writes ``records[slot]`` as
    ``search`` writes its record, leaves the other slot alone, and passes torch.library's checks
    of its schema and fake implementation."""
    n, d, k = 150, 64, 200
    x, c = _data(n, d, k, seed=3)
    bias = (c * c).sum(1)
    c_mma = -2 * c
    want = torch.full((hopper_search.record_rows(check), n), float("nan"), device=DEVICE)
    hopper_search.search_reference(x, c_mma, bias, want, check=check)
    records = torch.full((2, hopper_search.record_rows(check), n + 10), float("nan"), device=DEVICE)
    hopper_search.search_in_graph(x, c_mma, bias, records, 1, check=check)
    assert torch.equal(records[1, :, :n].view(torch.int32), want.view(torch.int32))
    assert records[0].isnan().all() and records[1, :, n:].isnan().all()
    torch.library.opcheck(torch.ops.torchkm.hopper_search.default, (x, c_mma, bias, records, 0, check, None, None))


@pytest.mark.parametrize("chunk", [None, 128])
@pytest.mark.parametrize("k", [129, 1000])
@pytest.mark.parametrize("d", [64, 100, 128, 256])
def test_searched_pass_matches_float64(searched, monkeypatch, d, k, chunk):
    """The exact pass over the search record: weighted, centred rows with previous labels and sums
    (settling, deferral and re-search included), against float64; in one chunk, or in chunks of 128
    rows (300 rows: two whole chunks and a part)."""
    if chunk:
        monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", str(chunk))
    _check_fused_pass(d, k, seed=d + k)
    assert len(searched) == (3 if chunk else 1), "the pass did not take the search record chunk by chunk"


@pytest.mark.parametrize("chunk", [None, 128])
@pytest.mark.parametrize(("d", "dtype"), [(100, torch.float32), (64, torch.float16)])
def test_sorted_sums_after_any_searched_pass(searched, monkeypatch, d, dtype, chunk):
    """``TORCHKM_SORTED_SUMS=all``: the exact pass over rows the streamed search does not take
    (fp32 rows, 16-bit rows of at most 256 features) adds its sums in label order once its labels
    are final, one call a pass (its epilogue and re-search add none), against float64; in one
    chunk or in chunks of 128 rows. Another setting is an error."""
    import torchkm._kernels.assign as assign_module

    calls = []
    add_sorted_sums = assign_module.add_sorted_sums

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return add_sorted_sums(*args, **kwargs)

    monkeypatch.setattr(assign_module, "add_sorted_sums", spy)
    monkeypatch.setenv("TORCHKM_SORTED_SUMS", "all")
    if chunk:
        monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", str(chunk))
    _check_fused_pass(d, 300, seed=d, dtype=dtype)
    assert searched and calls == [(300, d)]
    monkeypatch.setenv("TORCHKM_SORTED_SUMS", "yes")
    with pytest.raises(ValueError, match="TORCHKM_SORTED_SUMS"):
        AssignPass(torch.zeros(300, d, dtype=dtype, device=DEVICE), 300, "exact", update=True)


@pytest.mark.parametrize("chunk", [None, 128])
def test_searched_pass_over_streamed_rows_matches_float64(searched, monkeypatch, chunk):
    """16-bit rows wider than 256 features (the streamed search's): the exact pass over its record,
    weighted, centred, with previous labels and sums, in one chunk or in chunks of 128 rows (fp16:
    the interpreter's bf16 is not the GPU's), against float64."""
    if chunk:
        monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", str(chunk))
    _check_fused_pass(312, 200, seed=13, dtype=torch.float16)
    assert len(searched) == (3 if chunk else 1), "the pass did not take the search record chunk by chunk"


def test_ring_chunk_minima_reach_the_candidate_re_search(searched, monkeypatch):
    """Wide 16-bit rows under the ring search's exact record (``TORCHKM_HOPPER_RING_EXACT=1``): the
    search writes each row's lowest score in every chunk of the re-search (``search_chunk_mins``),
    so the candidate plan lists a deferred row only in the chunks that could hold its winner; its
    sums are added in label order once the labels are final (``sorted_sums``; A/B: in the epilogue).
    Clusters of four near centroids, each cluster inside one chunk: with the minima the plan lists
    deferred rows in fewer than every chunk, and the labels, sums and counts are float64's with
    and without them (fp16 rows: the interpreter's bf16 is not the GPU's)."""
    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "ring")
    monkeypatch.setenv("TORCHKM_HOPPER_RING_EXACT", "1")
    monkeypatch.setenv("TORCHKM_RESEARCH_CHUNKS", "2")
    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "0")  # (their lists would take these rows from the chunks)
    n, d, k = 600, 312, 512
    g = torch.Generator().manual_seed(11)
    centres = torch.rand(k // 4, d, generator=g)
    c = centres.repeat_interleave(4, dim=0) + 2e-3 * torch.randn(k, d, generator=g)
    x = (centres[torch.randint(0, k // 4, (n,), generator=g)] + 0.05 * torch.randn(n, d, generator=g)).half()
    x, c = x.to(DEVICE), c.to(DEVICE)
    minima = []
    reference = hopper_search.search_reference

    def spy(*args, **kwargs):
        minima.append(kwargs.get("chunk_mins") is not None)
        return reference(*args, **kwargs)

    monkeypatch.setattr(hopper_search, "search_reference", spy)
    for setting, sorted_sums in (("1", "1"), ("0", "1"), ("1", "0")):
        monkeypatch.setenv("TORCHKM_CHUNK_MINS", setting)
        monkeypatch.setenv("TORCHKM_SORTED_SUMS", sorted_sums)
        p = AssignPass(x, k, "exact", update=True)
        assert p.hopper and p.research_chunks == 2 and p.research_chunk == 256 and p.cand_cap
        assert p.search_mins and (p.chunk_mins is not None) == (setting == "1")
        assert p.sorted_sums == (sorted_sums == "1")
        labels = torch.empty(n, dtype=torch.int64, device=DEVICE)
        p(x, c, offset=None, row_scale=None, raw_norms=x.float().norm(dim=1), sample_weight=None,
          prev_labels=None, labels=labels)
        assert minima[-1] == (setting == "1")
        _check_labels(x.float(), c, labels, "exact")
        ref_sums, ref_counts = update_reference(x.float(), labels, k)
        torch.testing.assert_close(p.acc_sums.sum(0), ref_sums, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(p.acc_counts.sum(0), ref_counts)
        deferred = int(p.flag_count[0])
        assert deferred > 20, "too few rows deferred to test the plan"
        if setting == "1":
            # (Without minima, over so few rows, the candidate launch takes every chunk without a plan.)
            listed = int(p.flag_count[p.lists_at:p.lists_at + 2 * p.research_chunks].sum())
            assert 0 < listed < deferred * p.research_chunks, (listed, deferred)


def test_epilogue_shape(monkeypatch):
    """The epilogue after the search runs 64-row programs of four warps (the tl.dot configs' tiles
    of 128-256 rows stay with the tl.dot search); the persistent one-hot carry keeps its config's;
    the switch takes rows dividing 128."""
    from torchkm._kernels._common import UPDATE_ATOMIC, UPDATE_CARRY
    from torchkm._kernels.assign import _epilogue_shape

    monkeypatch.delenv("TORCHKM_EPILOGUE_CONFIG", raising=False)
    assert _epilogue_shape({"BLOCK_N": 256, "num_warps": 8}, UPDATE_ATOMIC) == (64, 4)
    assert _epilogue_shape({"BLOCK_N": 32, "num_warps": 2}, UPDATE_ATOMIC) == (32, 2)
    assert _epilogue_shape({"BLOCK_N": 128, "num_warps": 8}, UPDATE_CARRY) == (128, 8)
    monkeypatch.setenv("TORCHKM_EPILOGUE_CONFIG", "32,2")
    assert _epilogue_shape({"BLOCK_N": 128, "num_warps": 8}, UPDATE_ATOMIC) == (32, 2)
    monkeypatch.setenv("TORCHKM_EPILOGUE_CONFIG", "48,4")
    with pytest.raises(ValueError, match="divide 128"):
        _epilogue_shape({"BLOCK_N": 128, "num_warps": 8}, UPDATE_ATOMIC)


@pytest.mark.parametrize("check", [False, True])
def test_chunks_bound_the_record(searched, monkeypatch, check):
    monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", "200")
    x, _ = _data(1000, 100, 300, seed=5)
    p = AssignPass(x, 300, "exact" if check else "fast", update=True)
    # Chunks are whole programs of the epilogue and of the search (128 rows), so 200 -> 256.
    assert p.chunk_rows % 128 == 0 and p.chunk_rows % p.cfg["BLOCK_N"] == 0 and p.chunk_rows >= 200
    assert p.chunk_rows % p.epilogue_shape[0] == 0 and p.chunk_grid == p.chunk_rows // p.epilogue_shape[0]
    assert p.searched is None  # until a call searches
    p(x, x[:300].clone(), offset=None, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None,
      prev_labels=None, labels=torch.empty(1000, dtype=torch.int64, device=DEVICE))
    # One record; two on a GPU, where the next chunk's search overlaps this chunk's epilogue.
    assert p.searched.shape == (2 if p.overlap else 1, hopper_search.record_rows(check), p.chunk_rows)
    assert p.overlap == (DEVICE == "cuda")
    assert p.n_chunks == -(-1000 // p.chunk_rows)
    monkeypatch.delenv("TORCHKM_HOPPER_CHUNK_ROWS")
    assert AssignPass(x, 300, "exact", update=True).n_chunks == 1


def test_fast_pass_in_chunks(searched, monkeypatch):
    """The fast mode's two-row record, chunk by chunk, against the tl.dot search's labels."""
    monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", "128")
    n, d, k = 333, 100, 300
    x, c = _data(n, d, k, seed=11)
    out = assign(x, c, precision="fast")
    assert len(searched) >= 2  # 128 rows rounded up to the epilogue's rows per program
    _check_labels(x, c, out.labels, "fast")


@pytest.mark.parametrize(("dtype", "d"), [(torch.float32, 64), (torch.float16, 64), (torch.float16, 24),
                                        (torch.float16, 32), (torch.float32, 32), (torch.float16, 312),
                                        (torch.float16, 520)])
@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_searched_pass_labels_and_distances(searched, precision, dtype, d):
    n, k = 301, 300
    x, c = _data(n, d, k, seed=7, dtype=dtype)
    out = assign(x, c, precision=precision, raw_norms=x.float().norm(dim=1))
    # The fast mode keeps the tl.dot search for fp16 rows of at most 256 features (measured as
    # fast); rows of at most 32 features keep it in both modes (``hopper_search.supported``); 16-bit
    # rows wider than 256 take the streamed search in both, their epilogue streaming features too.
    assert bool(searched) == (d > 32 and (precision == "exact" or dtype == torch.float32 or d > 256))
    _check_labels(x.float(), c, out.labels, precision, input_dtype=dtype)
    direct = ((x.double() - c.double()[out.labels]) ** 2).sum(1)
    torch.testing.assert_close(out.sq_dist.double(), direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("d", "chunk"), [(128, None), (136, 128)])
@pytest.mark.parametrize("magnitude", [1.0, 1e-7, 3e5])
def test_searched_pass_with_fp16_operands(searched, monkeypatch, magnitude, d, chunk):
    """fp32 rows of a multiple of 8 features: the search multiplies them scaled into fp16 (the
    default; ``TORCHKM_HALF_OPERANDS=0``: tf32), chunk by chunk, and the epilogue scales its record
    back. The exact mode gives the tf32 search's labels, distances and counts at any magnitude, on
    exact ties, close calls and rows far below the largest; the fast mode stays within its bound
    (and takes fp16 operands for rows over 512 bytes, for a fit's rows (``fixed_rows``: their maxima
    read once) and from ``HALF_FAST_MIN_K`` centroids). Rows of 100 features keep fp32 operands."""
    if chunk:
        monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", str(chunk))
    n, k = 300, 300
    x, c = _fp16_operand_rows(n, d, k, 47, magnitude)
    results = {}
    for precision in ("exact", "fast"):
        for half in ("1", "0"):
            monkeypatch.setenv("TORCHKM_HALF_OPERANDS", half)
            searched.clear()
            p = AssignPass(x, k, precision, update=True)
            assert p.hopper and p.half == (half == "1" and (precision == "exact" or d > 128 or k >= HALF_FAST_MIN_K))
            labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
            sq_dist = torch.full((n,), float("nan"), device=DEVICE)
            p(x, c, offset=None, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None, prev_labels=None,
              labels=labels, sq_dist=sq_dist)
            assert len(searched) == p.n_chunks and (p.n_chunks > 1) == bool(chunk)
            assert {fp16 for _, fp16 in searched} == {p.half}
            results[precision, half] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0))
        _check_labels(x, c, results[precision, "1"][0], precision)
    _check_fp16_against_tf32(results, x, k, magnitude)
    monkeypatch.setenv("TORCHKM_HALF_OPERANDS", "1")
    assert AssignPass(x, k, "fast", update=True, fixed_rows=True).half
    x100, _ = _data(n, 100, k, seed=47)
    assert not AssignPass(x100, k, "exact", update=True).half


def test_row_lists_and_scaled_rows_keep_the_tl_dot_search(searched):
    n, d, k = 200, 64, 300
    x, c = _data(n, d, k, seed=3)
    p = AssignPass(x, k, "exact", update=False)
    labels = torch.empty(n, dtype=torch.int64, device=DEVICE)
    rows = (torch.arange(0, n, 3, dtype=torch.int32, device=DEVICE),
            torch.tensor([len(range(0, n, 3))], dtype=torch.int32, device=DEVICE))
    p(x, c, offset=None, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None, prev_labels=None,
      labels=labels, rows=rows)
    assert not searched
    p(x, c, offset=None, row_scale=1 / x.norm(dim=1), raw_norms=x.norm(dim=1), sample_weight=None,
      prev_labels=None, labels=labels)
    assert not searched


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize(("dtype", "d", "k"), [
    (torch.float32, 64, 129), (torch.float32, 100, 1000), (torch.float32, 128, 4099),
    (torch.float32, 200, 1000), (torch.float32, 256, 4099),
    (torch.bfloat16, 24, 1000), (torch.bfloat16, 32, 4099), (torch.bfloat16, 64, 1000), (torch.bfloat16, 128, 300),
    (torch.bfloat16, 256, 4099), (torch.float16, 32, 1000), (torch.float16, 128, 1000), ("fp16 operands", 64, 1000), ("fp16 operands", 128, 4099),
    ("fp16 operands", 256, 4099),
    # the streamed search: 128-row programs (768 features), 64-row ones (1000), a partial chunk (312)
    (torch.bfloat16, 768, 4099), (torch.float16, 312, 1000), (torch.bfloat16, 1000, 300),
])
def test_kernel_matches_reference(dtype, d, k, check):
    """Fresh random rows each run; every slot of the record poisoned first. The record's contract (the
    one ``assign._tile`` relies on), within the fast products' rounding of the fp32 reference:
    the best score and its index; with ``check`` the second-best score, another centroid's index
    whose score is at least that, and a lower bound on every other score that is at least the
    second best; a third index and a lower bound on the rest. The kernel keeps per slot (row, tile
    column) the best and second-lowest score, so its runner-up index is the true one unless the
    runner-up shares the winner's slot (then the bound equals the second best and the pass
    re-searches the row); the same for the third. "fp16 operands": fp32 rows (strided, of
    magnitude 1e5) converted in the kernel, times the preparation's scale s; the record is in s^2
    units and only the order of the fp32 sums differs from the reference on the converted rows, besides
    what packing lowers."""
    from torchkm._kernels.centroids import (
        half_scale_reference,
        prepare_centroids,
        prepare_centroids_reference,
    )

    n = 10_007
    half = dtype == "fp16 operands"
    if half:
        dtype = torch.float32
        x = (torch.randn(n, d + 3, device="cuda") * 1e5)[:, :d]
    else:
        x = torch.randn(n, d, device="cuda").to(dtype)
    c = x[torch.randperm(n, device="cuda")[:k]].float() + 0.01 * x.abs().mean() * torch.randn(k, d, device="cuda")
    got = torch.full((7, n), float("nan"), device="cuda")
    if half:
        s = half_scale_reference(x, c)
        prepared = prepare_centroids_reference(c, None, dtype, fast=True, split=False, exact=False, half_scale=s)
        assert hopper_search.supported(x, k, scaled=False, split=False, row_list=False, dtype=torch.float16)
        hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=check, half_scale=prepared.half_scale)
        rows = (x * s).half()
        scale = (rows.float().norm(dim=1) * prepared.c_mma.float().norm(dim=1).max() / 2).double()
    else:
        prepared = prepare_centroids(c, None, dtype, fast=True, split=False, exact=False)
        hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=check)
        rows = x
        scale = (x.float().norm(dim=1) * c.norm(dim=1).max()).double()
    scores = prepared.bias.double()[None, :] + rows.double() @ prepared.c_mma.double().T
    top, order = torch.sort(scores, dim=1, stable=True)
    # fp32 rows enter the products as tf32 (the reference keeps them); 16-bit operands are the
    # reference's own, so only the order of the fp32 sums differs.
    tol = (2.0 ** -10 if dtype == torch.float32 and not half else 2.0 ** -18) * 4 * scale
    # The packed search lowers values by at most what ``hopper_search.packed`` states (the tile's
    # bits cleared from the key, the floor's margin for them, the row term's sum), and ties scores
    # that agree to within them.
    slack = torch.zeros(n, dtype=torch.float64, device="cuda")
    if hopper_search.packed(x, k, half=half):
        term = (1 + hopper_search.ROW_MARGIN_VALUE) * rows.double().pow(2).sum(1)
        bits = hopper_search.tile_bits(k, rows.element_size(), d)
        margin = 1.5 * 2.0 ** (bits - 22) + (2.0 ** -21 if check and hopper_search.SECOND_SUMS_VALUE else 0.0)
        slack = margin * (top[:, :4].abs().max(dim=1).values + term) + 2.0 ** -17 * term
    raised = 0.0
    if not check and _ring_keys(rows):
        # The ring search's fast keys: lowered by what their cleared bits hide, and moved either way
        # by up to 2^-15 of the bias whose low bits carry the column (``hopper_search._ring_rows``).
        slack = slack + 2 * hopper_search.RING_KEY_SLACK * top[:, :2].abs().max(dim=1).values
        raised = 2.0**-15 * prepared.bias.double().abs().max()
    for f in ([0, 2, 4, 6] if check else [0]):
        assert not got[f].isnan().any(), f"record row {f} not written"
    record = got.double()
    labels = got.view(torch.int32).long()
    over = (record[0] - top[:, 0] - tol - raised) / scale
    assert (over <= 0).all(), f"best over its score by {over.max():.3g} x |x| max|c| (tol {tol.max() / scale.max():.3g})"
    under = (top[:, 0] - tol - slack - raised - record[0]) / scale
    assert (under <= 0).all(), f"best under its score by {under.max():.3g} x |x| max|c|"
    clear = (top[:, 1] - top[:, 0]) > 2 * (tol + slack + raised)
    assert (labels[1][clear] == order[:, 0][clear]).all()
    assert clear.float().mean() > 0.3
    if check:
        assert (record[2] <= top[:, 1] + tol).all()
        assert (record[2] >= top[:, 1] - tol - slack).all()
        assert (labels[3] != labels[1]).all()
        assert (scores.gather(1, labels[3][:, None]).squeeze(1) >= top[:, 1] - tol - slack).all()
        assert (record[4] <= top[:, 2] + tol).all()
        assert (record[4] >= top[:, 1] - tol - slack).all()
        block_k = (hopper_search.streamed_shape(d)[1] if hopper_search.streamed(rows)
                   else hopper_search._config(rows.element_size())[1])
        other_slot = order[:, 1] % block_k != order[:, 0] % block_k
        clear2 = clear & other_slot & ((top[:, 2] - top[:, 1]) > 2 * (tol + slack))
        assert (labels[3][clear2] == order[:, 1][clear2]).all()
        assert clear2.float().mean() > 0.3
        # A third candidate: another index whose score is at least the third best's, and a lower
        # bound on all scores but the three, at most the fourth best; the true third where it
        # shares no slot with the best two and its gaps are clear.
        assert ((labels[5] != labels[1]) & (labels[5] != labels[3]) & (labels[5] >= 0)).all()
        assert (scores.gather(1, labels[5][:, None]).squeeze(1) >= top[:, 2] - tol - slack).all()
        assert (record[6] <= top[:, 3] + tol).all()
        assert (record[6] >= top[:, 1] - tol - slack).all()
        slot = order[:, :3] % block_k
        clear3 = (clear2 & (slot[:, 2] != slot[:, 0]) & (slot[:, 2] != slot[:, 1])
                  & ((top[:, 3] - top[:, 2]) > 2 * (tol + slack)))
        assert (labels[5][clear3] == order[:, 2][clear3]).all()
        assert clear3.float().mean() > 0.2


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize(("dtype", "d", "k"), [(torch.bfloat16, 768, 4099), (torch.float16, 312, 1000),
                                               (torch.bfloat16, 1000, 300), (torch.bfloat16, 264, 257)])
@pytest.mark.parametrize("check", [False, True])
def test_ring_search_matches_reference(monkeypatch, dtype, d, k, check):
    """The ring search (``TORCHKM_HOPPER_STREAMED=ring``): partial feature chunks (312, 1000, 264), a
    last centroid tile of one column (257), rows not a multiple of the tile; fresh random rows,
    the record poisoned. The fast record as ``test_kernel_matches_reference`` holds it; the exact
    one's best two are the true best two (scores and indices, where their gaps are clear), its
    third the third-best score, with no third candidate (label3 -1, the rest's bound the third's);
    its chunk minima (runs of one and of two centroid tiles, the last run short) bound each run's
    scores from below, within the scores' error."""
    from torchkm._kernels.centroids import prepare_centroids

    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "ring")
    if not check:
        test_kernel_matches_reference(dtype, d, k, False)
        return
    n = 10_007
    x = torch.randn(n, d, device="cuda").to(dtype)
    c = x[torch.randperm(n, device="cuda")[:k]].float() + 0.01 * torch.randn(k, d, device="cuda")
    prepared = prepare_centroids(c, None, dtype, fast=True, split=False, exact=False)
    scores = prepared.bias.double()[None, :] + x.double() @ prepared.c_mma.double().T
    tol = 2.0 ** -18 * 4 * (x.double().norm(dim=1) * c.double().norm(dim=1).max())
    for min_chunk in (256, 512):
        assert hopper_search.search_chunk_mins(x, min_chunk, check=True)
        n_mins = -(-k // min_chunk)
        mins = torch.full((n * n_mins + 5,), float("nan"), device="cuda")
        got = torch.full((7, n), float("nan"), device="cuda")
        hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=True, chunk_mins=mins,
                             min_chunk=min_chunk)
        assert mins[n * n_mins:].isnan().all()
        runs = torch.nn.functional.pad(scores, (0, n_mins * min_chunk - k), value=float("inf"))
        want = runs.view(n, n_mins, min_chunk).amin(dim=2)
        mins = mins[:n * n_mins].view(n, n_mins).double()
        slack = (2 * hopper_search.RING_KEY_SLACK * want.abs() + 1e-29) if _ring_keys(x) else 0.0
        assert (mins <= want + tol[:, None]).all() and (mins >= want - tol[:, None] - slack).all(), min_chunk
    with pytest.raises(ValueError, match="chunk minima"):  # the fast record has none
        hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=False,
                             chunk_mins=torch.empty(n * k, device="cuda"), min_chunk=256)
    got = torch.full((7, n), float("nan"), device="cuda")
    hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=True)
    top, order = torch.sort(scores, dim=1, stable=True)
    if _ring_keys(x):  # the keys' cleared bits, then the record's move past them
        tol = tol + 2 * hopper_search.RING_KEY_SLACK * top[:, :3].abs().max(dim=1).values
    record, labels = got.double(), got.view(torch.int32).long()
    assert not record[[0, 2, 4, 6]].isnan().any()
    for f, rank in ((0, 0), (2, 1), (4, 2)):
        assert ((record[f] - top[:, rank]).abs() <= tol).all(), f"record row {f}"
    assert torch.equal(record[6], record[4]) and (labels[5] == -1).all()
    assert (labels[3] != labels[1]).all()
    assert ((scores.gather(1, labels[3][:, None]).squeeze(1) - top[:, 1]).abs() <= tol).all()
    clear = (top[:, 1] - top[:, 0]) > 2 * tol
    clear2 = clear & ((top[:, 2] - top[:, 1]) > 2 * tol)
    assert (labels[1][clear] == order[:, 0][clear]).all() and (labels[3][clear2] == order[:, 1][clear2]).all()
    assert clear2.float().mean() > 0.3


def _ring_keys(rows: torch.Tensor) -> bool:
    """Whether ``search`` takes ``rows`` through the ring search folding packed keys."""
    return (hopper_search.streamed(rows) and hopper_search._streamed_setting() == "ring"
            and hopper_search.ring_packed())


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("packed", ["1", "0"])
@pytest.mark.parametrize("k", [1, 2, 256])
def test_ring_search_without_runners_up(monkeypatch, packed, k):
    """Fewer centroids than the exact record names (k = 1, 2) or one tile exactly (256): the missing
    runner-up and third are +inf ("none"), whatever the padding columns scored; keys or scores."""
    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "ring")
    monkeypatch.setenv("TORCHKM_HOPPER_RING_PACKED", packed)
    from torchkm._kernels.centroids import prepare_centroids

    n, d = 1000, 520
    x = torch.randn(n, d, device="cuda").to(torch.bfloat16)
    c = x[torch.randperm(n, device="cuda")[:k]].float()
    prepared = prepare_centroids(c, None, x.dtype, fast=True, split=False, exact=False)
    got = torch.full((7, n), float("nan"), device="cuda")
    hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=True)
    labels = got.view(torch.int32).long()
    scores = prepared.bias.double()[None, :] + x.double() @ prepared.c_mma.double().T
    best = scores.min(dim=1).values
    tol = 2.0**-16 * x.double().norm(dim=1) * c.double().norm(dim=1).max() + 2.0**-14 * best.abs()
    assert ((labels[1] >= 0) & (labels[1] < k)).all()
    assert (scores.gather(1, labels[1][:, None]).squeeze(1) <= best + tol).all()
    assert ((got[0].double() - best).abs() <= tol).all()
    if k == 1:
        assert torch.isinf(got[2]).all() and torch.isinf(got[4]).all()
    else:
        assert torch.isfinite(got[2]).all() and ((labels[3] >= 0) & (labels[3] < k) & (labels[3] != labels[1])).all()
        assert torch.isinf(got[4]).all() == (k == 2) and torch.isfinite(got[4]).all() == (k > 2)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_ring_search_in_the_pass(monkeypatch, precision):
    """Under ``TORCHKM_HOPPER_STREAMED=ring`` (the default) the fast pass over wide 16-bit rows searches
    with the ring kernel (a frozen iteration writes nothing), the exact pass too under
    ``TORCHKM_HOPPER_RING_EXACT=1``; the passes' labels hold against float64."""
    from torchkm._kernels.centroids import prepare_centroids

    monkeypatch.setenv("TORCHKM_HOPPER_STREAMED", "ring")
    n, d, k = 20_001, 776, 3000
    x = torch.randn(n, d, device="cuda").to(torch.bfloat16)
    c = x[torch.randperm(n, device="cuda")[:k]].float()
    if precision == "fast":
        prepared = prepare_centroids(c, None, x.dtype, fast=True, split=False, exact=False)
        out = torch.full((2, n), float("nan"), device="cuda")
        for frozen in (1, 0):
            hopper_search.search(x, prepared.c_mma, prepared.bias, out, check=False,
                                 control=torch.full((1,), frozen, dtype=torch.int32, device="cuda"))
            assert out[0].isnan().all() == bool(frozen)
    for ring_exact in ("1", "0"):
        monkeypatch.setenv("TORCHKM_HOPPER_RING_EXACT", ring_exact)
        assert AssignPass(x, k, precision, update=True).hopper == (precision == "fast" or ring_exact == "1")
        result = assign(x, c, precision=precision, raw_norms=x.float().norm(dim=1))
        sample = torch.arange(0, n, 37, device="cuda")
        _check_labels(x[sample].float(), c, result.labels[sample], precision, input_dtype=x.dtype)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize(("dtype", "d", "k"), [(torch.bfloat16, 128, 4099), ("fp16 operands", 128, 4099),
                                               (torch.bfloat16, 32, 1000), (torch.float32, 256, 4099)])
def test_row_second_and_three_programs_keep_the_record(monkeypatch, dtype, d, k):
    """The exact record is the same, bit for bit, whether each slot keeps its own second-lowest score
    or each row one over a thread's slots (``TORCHKM_HOPPER_ROW_SECOND``), and whether one-warpgroup
    programs run three an SM (registers capped, three stages) or two (``TORCHKM_HOPPER_PROGRAMS``):
    fresh random rows, close calls and exact ties (centroids stored twice), poisoned records."""
    from torchkm._kernels.centroids import half_scale_reference, prepare_centroids, prepare_centroids_reference

    n = 5_003
    half = dtype == "fp16 operands"
    x = torch.randn(n, d, device="cuda")
    c = x[torch.randperm(n, device="cuda")[:k]].clone()
    c[1::7] = c[0::7][: c[1::7].shape[0]]
    x[:500] = c[:500] + 1e-3 * torch.randn(500, d, device="cuda")
    if not half:
        x = x.to(dtype)
    records = {}
    for row_second in ("1", "0"):
        for programs in ("3", "2"):
            monkeypatch.setenv("TORCHKM_HOPPER_ROW_SECOND", row_second)
            monkeypatch.setenv("TORCHKM_HOPPER_PROGRAMS", programs)
            got = torch.full((7, n), float("nan"), device="cuda")
            if half:
                s = half_scale_reference(x, c)
                prepared = prepare_centroids_reference(c, None, torch.float32, fast=True, split=False, exact=False,
                                                       half_scale=s)
                hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=True, half_scale=prepared.half_scale)
            else:
                prepared = prepare_centroids(c, None, x.dtype, fast=True, split=False, exact=False)
                hopper_search.search(x, prepared.c_mma, prepared.bias, got, check=True)
            records[row_second, programs] = got.view(torch.int32)
    reference = records["0", "2"]
    for key, record in records.items():
        assert torch.equal(record, reference), key


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize(("dtype", "d"), [(torch.float32, 128), (torch.bfloat16, 768)])
def test_kernel_skips_a_frozen_iteration(dtype, d):
    from torchkm._kernels.centroids import prepare_centroids

    x = torch.randn(1000, d, device="cuda").to(dtype)
    c = torch.randn(300, d, device="cuda")
    prepared = prepare_centroids(c, None, x.dtype, fast=True, split=False, exact=False)
    out = torch.full((hopper_search.record_rows(True), 1000), float("nan"), device="cuda")
    hopper_search.search(x, prepared.c_mma, prepared.bias, out, check=True,
                         control=torch.ones(1, dtype=torch.int32, device="cuda"))
    assert out.isnan().all()
    hopper_search.search(x, prepared.c_mma, prepared.bias, out, check=True,
                         control=torch.zeros(1, dtype=torch.int32, device="cuda"))
    assert not out[0].isnan().any()


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize(("n", "d", "k", "dtype"), [(100_003, 128, 4096, torch.float32),
                                                    (50_001, 128, 500, torch.bfloat16),
                                                    (20_000, 256, 8192, torch.bfloat16),
                                                    (20_000, 256, 8192, torch.float32),
                                                    (30_001, 64, 1000, torch.float32),
                                                    (30_001, 64, 1000, torch.float16),
                                                    (245_760, 32, 1024, torch.bfloat16),
                                                    (30_001, 24, 1000, torch.float16),
                                                    (20_000, 768, 4096, torch.bfloat16),
                                                    (20_001, 520, 1000, torch.float16)])
def test_default_pass_takes_the_kernel(precision, n, d, k, dtype):
    x = torch.randn(n, d, device="cuda").to(dtype)
    c = x[:k].float()
    p = AssignPass(x, k, precision, update=True)
    assert p.hopper == (d > 32 and (precision == "exact" or dtype in (torch.float32, torch.bfloat16) or d > 256))
    out = assign(x, c, precision=precision, raw_norms=x.float().norm(dim=1))
    sample = torch.arange(0, n, 97, device="cuda")
    _check_labels(x[sample].float(), c, out.labels[sample], precision, input_dtype=dtype)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_chunks_on_two_streams_match_one_chunk(monkeypatch, precision):
    """Seven chunks, each chunk's epilogue overlapping the next chunk's search on a side stream,
    eagerly and replayed from a CUDA graph, against one chunk: the same labels, distances, sums
    and counts (the poisoned outputs are all written)."""
    n, d, k = 100_003, 128, 4096
    x = torch.randn(n, d, device="cuda")
    c = x[torch.randperm(n, device="cuda")[:k]] + 0.05 * torch.randn(k, d, device="cuda")
    norms = x.norm(dim=1)

    def run(chunk_rows, graph=False):
        monkeypatch.setenv("TORCHKM_HOPPER_CHUNK_ROWS", str(chunk_rows))
        p = AssignPass(x, k, precision, update=True)
        labels = torch.full((n,), -1, dtype=torch.int64, device="cuda")
        sq_dist = torch.full((n,), float("nan"), device="cuda")

        def call():
            p(x, c, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None,
              labels=labels, sq_dist=sq_dist)

        if graph:
            call()
            labels.fill_(-1)
            sq_dist.fill_(float("nan"))
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call()
            labels.fill_(-1)
            sq_dist.fill_(float("nan"))
            g.replay()
        else:
            call()
        torch.cuda.synchronize()
        return p, labels, sq_dist, p.acc_sums.sum(0).clone(), p.acc_counts.sum(0).clone()

    one = run(10**9)
    assert one[0].n_chunks == 1
    for graph in (False, True):
        chunked = run(16_384, graph=graph)
        assert chunked[0].n_chunks == 7 and chunked[0].overlap
        assert (chunked[1] >= 0).all()
        assert torch.equal(chunked[1], one[1])
        torch.testing.assert_close(chunked[2], one[2])
        torch.testing.assert_close(chunked[3], one[3], rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(chunked[4], one[4])


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize(("d", "k"), [(64, 1000), (128, 4096), (256, 8192)])
@pytest.mark.parametrize("magnitude", [1.0, 1e-6, 1e4])
def test_kernel_pass_with_fp16_operands(monkeypatch, d, k, magnitude):
    """The Gluon search over fp32 rows scaled into fp16 (packed; the exact mode's default for a
    multiple of 8 features, the fast mode's where ``AssignPass`` takes them), in chunks on two
    streams: the exact mode's labels,
    distances and counts are those of the tf32 search (``TORCHKM_HALF_OPERANDS=0``), on fresh rows
    with close calls and poisoned outputs, and agree with float64 on sampled rows; the fast mode's
    labels stay within its bound."""
    n = 70_001
    x = torch.randn(n, d, device="cuda") * magnitude
    c = x[torch.randperm(n, device="cuda")[:k]] + 0.01 * magnitude * torch.randn(k, d, device="cuda")
    x[:999] = 0.5 * (c[:999] + c[1:1000]) + 1e-4 * magnitude * torch.randn(999, d, device="cuda")  # close calls
    norms = x.norm(dim=1)
    sample = torch.arange(0, n, 37, device="cuda")
    results = {}
    for precision in ("exact", "fast"):
        for half in ("1", "0"):
            monkeypatch.setenv("TORCHKM_HALF_OPERANDS", half)
            p = AssignPass(x, k, precision, update=True)
            assert p.hopper and p.half == (half == "1" and (precision == "exact" or d > 128 or k >= HALF_FAST_MIN_K))
            labels = torch.full((n,), -1, dtype=torch.int64, device="cuda")
            sq_dist = torch.full((n,), float("nan"), device="cuda")
            p(x, c, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None,
              labels=labels, sq_dist=sq_dist)
            results[precision, half] = (labels, sq_dist, p.acc_counts.sum(0).clone())
        _check_labels(x[sample], c, results[precision, "1"][0][sample], precision)
    labels, sq_dist, counts = results["exact", "1"]
    assert (labels >= 0).all() and not sq_dist.isnan().any()
    assert torch.equal(labels, results["exact", "0"][0])
    torch.testing.assert_close(sq_dist, results["exact", "0"][1], rtol=0, atol=0)
    assert torch.equal(counts, results["exact", "0"][2])


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_pass_with_an_offset(dtype):
    """Rows around a mean of 3, the exact pass told the mean (``offset``, which the packed search's
    row term subtracts): labels as float64's on the centred rows, few rows re-searched. (Rows far
    from the origin, a mean of 1e3, are all re-searched with or without packing: the raw rows'
    tf32 rounding bounds every score's error, 2026-11-22.)"""
    precision = "exact"
    n, d, k = 30_011, 128, 1000
    mean = torch.full((d,), 3.0, device="cuda")
    x = (torch.randn(n, d, device="cuda") + mean).to(dtype)
    rows = x.float() - mean
    c = rows[torch.randperm(n, device="cuda")[:k]] + 0.05 * torch.randn(k, d, device="cuda")
    assert AssignPass(x, k, precision, update=False).hopper
    out = assign(x, c, precision=precision, offset=mean, raw_norms=x.float().norm(dim=1))
    sample = torch.arange(0, n, 31, device="cuda")
    _check_labels(rows[sample], c, out.labels[sample], precision, input_dtype=dtype)
    assert int(out.rechecked) < 0.02 * n


def _pair_floor_pass(monkeypatch, x, c, mean, dtype, sample=1, variable="TORCHKM_PAIR_BOUND"):
    """The exact pass with the pairwise floor (or what ``variable`` switches) off and on:
    (re-searched rows, labels) of each; labels checked on every ``sample``-th row, sums and counts
    against float64's of the labels."""
    results = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(variable, setting)
        sums = torch.zeros_like(c)
        counts = torch.zeros(c.shape[0], device=DEVICE)
        out = assign(x.to(dtype), c, precision="exact", offset=mean, raw_norms=x.to(dtype).float().norm(dim=1),
                     sums=sums, counts=counts)
        rows = x.to(dtype).float() - mean
        _check_labels(rows[::sample], c, out.labels[::sample], "exact")
        ref_sums, ref_counts = update_reference(x.to(dtype).float(), out.labels, c.shape[0], offset=mean)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(counts, ref_counts)
        results[setting] = int(out.rechecked), out.labels
    return results


def test_pair_floor_settles_over_split_rows(searched, monkeypatch):
    """Over-split rows (many centroids nearly as near as the nearest, rows off the origin): the
    exact pass over the search record bounds the others' distances from score differences too
    (``assign._pair_floor``), re-searching fewer rows with the same labels (float64's but for
    ties), sums and counts; ``TORCHKM_PAIR_BOUND=0`` turns it off."""
    x, c, mean = _over_split_rows(800, 128, 400, seed=7)
    results = _pair_floor_pass(monkeypatch, x, c, mean, torch.float32)
    (off, labels_off), (on, labels_on) = results["0"], results["1"]
    assert searched and all(half for _, half in searched)  # fp32 rows as fp16 operands, searched
    assert torch.equal(labels_off, labels_on)
    assert on < 0.8 * off, (off, on)


def test_pair_candidates_name_fewer_with_the_same_labels(searched, monkeypatch):
    """The candidate re-search's plan also takes each deferred row's threshold from score
    differences (``assign._candidate_pair_top``, the winner's score computed from the re-scoring's
    own operands; ``TORCHKM_PAIR_CANDIDATES=0`` turns it off). Over-split rows, fp32 rows as fp16
    operands: fewer candidates named, the same labels (float64's but for ties) and re-searched
    rows."""
    monkeypatch.setenv("TORCHKM_CANDIDATE_LISTS", "1")  # the plan, also for few rows
    monkeypatch.setenv("TORCHKM_PAIR_BOUND", "0")  # more rows deferred, so more to name candidates for
    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "0")  # every deferred row re-scored, none by its winner's list
    monkeypatch.setenv("TORCHKM_CENTRED_OPERANDS", "0")  # raw rows' rounding: more rows deferred
    x, c, mean = _over_split_rows(800, 128, 400, seed=11)
    results = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("TORCHKM_PAIR_CANDIDATES", setting)
        p = AssignPass(x, 400, "exact", update=False)
        labels = torch.empty(800, dtype=torch.int64, device=DEVICE)
        p(x, c, offset=mean, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None, prev_labels=None,
          labels=labels)
        assert p.cand_cap > 0 and p.half
        deferred = int(p.flag_count[0])
        named = p.flag_count[2:2 + min(deferred, p.cand_cap)].long()
        _check_labels(x - mean, c, labels, "exact")
        results[setting] = deferred, int(named.sum()), labels
    (deferred0, named0, labels0), (deferred1, named1, labels1) = results["0"], results["1"]
    assert deferred0 == deferred1 > 20
    assert torch.equal(labels0, labels1)
    assert named1 < 0.8 * named0, (named0, named1)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_pass_pair_floor_settles_over_split_rows(monkeypatch, dtype):
    """The same over the Gluon kernel's packed record (its cleared bits and lowered scores), fresh
    random rows each run: labels float64's but for ties with the floor on and off; fewer rows
    re-searched with it over fp32 rows (the rows' operand rounding is what it bounds pairwise), no
    more over bf16 rows (exact operands)."""
    x, c, mean = _over_split_rows(30_011, 128, 2048, seed=int(torch.randint(0, 2**31, ())))
    assert AssignPass(x.to(dtype), 2048, "exact", update=True).hopper
    results = _pair_floor_pass(monkeypatch, x, c, mean, dtype, sample=7)
    (off, labels_off), (on, labels_on) = results["0"], results["1"]
    assert on <= off
    if dtype == torch.float32:
        assert on < 0.8 * off, (off, on)
    # Labels differ only where both are float64's within ties (each checked above).
    assert int((labels_off != labels_on).sum()) <= 0.001 * x.shape[0]


def test_centred_operands_settle_more_rows_off_the_origin(searched, monkeypatch):
    """Centred operands (the default; ``TORCHKM_CENTRED_OPERANDS=0`` off): the search rounds fp32 rows as fp16 operands
    less the offset, (x - m) s, against ||c~||^2 alone, and the epilogue bounds their rounding by
    the centred norm. Over-split rows off the origin (median raw norm about twice the centred one):
    fewer rows re-searched, labels float64's but for ties, sums and counts float64's of the labels;
    the search saw the centred operands and bias."""
    x, c, mean = _over_split_rows(800, 128, 400, seed=7)
    reference = hopper_search.search_reference
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("centred", False))
        return reference(*args, **kwargs)

    monkeypatch.setattr(hopper_search, "search_reference", spy)
    results = _pair_floor_pass(monkeypatch, x, c, mean, torch.float32, variable="TORCHKM_CENTRED_OPERANDS")
    (off, labels_off), (on, labels_on) = results["0"], results["1"]
    assert seen and not seen[0] and seen[-1]  # the first pass raw, the last centred
    assert off >= 10 and on < 0.8 * off, (off, on)
    assert int((labels_off != labels_on).sum()) <= 2  # both float64's but for ties (checked above)


def test_prepare_centroids_emits_the_centred_bias():
    """The passes take the centred search's bias from ``prepare_centroids``' launch
    (``bias_centred``, with fp16 operands and an offset): ||c~||^2 of its own fp16 operand's
    centroids (``c_mma`` holds -2 s c~), in the products' s^2 units, summed in float64 as it sums
    its own bias (then float32, then scaled); the last rounding may differ with the sum's order."""
    from torchkm._kernels.centroids import amax_parts, prepare_centroids

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(61, 17, generator=g) * 4.0 + 9.0).to(DEVICE)
    c = (torch.randn(23, 17, generator=g) * 4.0 + 9.0).to(DEVICE)
    parts = torch.full((5,), float("nan"), device=DEVICE)
    amax_parts(x, c, parts, 3)
    got = prepare_centroids(c, x.mean(0), torch.float32, fast=True, split=False, exact=True, half_parts=parts)
    s = float(got.half_scale[0])
    hi = got.c_mma.double() / (-2.0 * s)
    want = ((hi * hi).sum(1).float() * s) * s
    torch.testing.assert_close(got.bias_centred, want, rtol=2.0**-23, atol=0)
    no_offset = prepare_centroids(c, None, torch.float32, fast=True, split=False, exact=True, half_parts=parts)
    assert no_offset.bias_centred is None


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
def test_kernel_pass_centred_operands_settle_more_rows(monkeypatch):
    """The same over the Gluon kernel (``_half_rows`` centring each row tile as it converts it, the
    row term not centring it twice), fresh random rows each run."""
    x, c, mean = _over_split_rows(30_011, 128, 2048, seed=int(torch.randint(0, 2**31, ())))
    assert AssignPass(x, 2048, "exact", update=True).hopper
    results = _pair_floor_pass(monkeypatch, x, c, mean, torch.float32, sample=7, variable="TORCHKM_CENTRED_OPERANDS")
    (off, labels_off), (on, labels_on) = results["0"], results["1"]
    assert on < 0.8 * off, (off, on)
    assert int((labels_off != labels_on).sum()) <= 0.001 * x.shape[0]


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_pass_takes_the_kernel(precision, dtype, monkeypatch, tmp_path):
    """torch.compile(fullgraph=True) of ``torchkm.assign`` and of the fused assign-and-sum op with
    ``TORCHKM_HOPPER_TRACED=1``: the generated code calls ``torchkm::hopper_search`` (by default it
    keeps the tl.dot search), and labels, distances, sums and counts are the eager pass's (which
    takes the same search), on fresh rows and poisoned memory. Each compile gets its own Inductor
    cache (the caches do not key on the switch)."""
    from torch._inductor.utils import run_and_get_code

    import torchkm
    from torchkm import _ops

    torch._dynamo.reset()
    n, d, k = 20_011, 128, 1000
    x = torch.randn(n, d, device="cuda").to(dtype)
    c = x[torch.randperm(n, device="cuda")[:k]].float() + 0.05 * torch.randn(k, d, device="cuda")
    poison = [torch.full((64 << 20,), 0x7F, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del poison
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "default"))
    plain = torch.compile(lambda a, b: torchkm.assign(a, b, precision=precision), fullgraph=True)
    _, code = run_and_get_code(plain, x, c)
    assert "torchkm.hopper_search" not in "\n".join(code)
    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "traced"))
    monkeypatch.setenv("TORCHKM_HOPPER_TRACED", "1")
    compiled = torch.compile(lambda a, b: torchkm.assign(a, b, precision=precision), fullgraph=True)
    (labels, dist), code = run_and_get_code(compiled, x, c)
    assert "torchkm.hopper_search" in "\n".join(code)
    # (A traced pass keeps tf32 products; by default the eager one multiplies fp32 rows in fp16.)
    monkeypatch.setenv("TORCHKM_HALF_OPERANDS", "0")
    eager = torchkm.assign(x, c, precision=precision)
    # Inductor centres the rows on its own sum of the centroids: last-bit differences may settle a
    # near-tie the other way.
    same = labels == eager[0]
    assert int((~same).sum()) <= 5
    torch.testing.assert_close(dist[same], eager[1][same], rtol=1e-4, atol=1e-4)
    _check_labels(x[::7].float(), c, labels[::7], precision, input_dtype=dtype)

    fused_fn = torch.compile(lambda a, b: _ops.query_assign_and_sum(a, b, precision), fullgraph=True)
    fused, code = run_and_get_code(fused_fn, x, c)
    assert "torchkm.hopper_search" in "\n".join(code)
    counts = torch.bincount(fused[0], minlength=k).float()
    sums = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, fused[0], x.double())
    assert torch.equal(fused[3], counts)
    torch.testing.assert_close(fused[2], sums.float(), rtol=1e-4, atol=1e-3)
