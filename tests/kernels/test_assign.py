"""triton_kernels/assign.py against float64 references (Triton interpreter on CPU, or a GPU)."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from torchkm._kernels._common import NEAR_SCORE_TIES, UPDATE_CARRY, ReplayedCall
from torchkm._kernels.assign import (
    _distance_floor,
    _lowest_three,
    _pair_floor,
    assign,
    assign_reference,
    gap_bound_coefficient,
    score_bound_coefficients,
)
from torchkm._kernels.centroids import round_to_tf32
from torchkm._kernels.update import update_reference

from tests.helpers import (
    assert_labels_match_except_near_ties,
    assert_sums_equal_but_for_order,
    f64_sq_distances,
    fp32_tie_rows,
)
from tests.kernels.conftest import DEVICE, ON_GPU, SMALL_TILES, needs_gpu_for_bf16

PRECISIONS = ["exact", "fast", "tf32x3", "ieee"]


def _data(n, d, k, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(dtype)
    c = torch.randn(k, d, generator=g)
    return x.to(DEVICE), c.to(DEVICE)


def _check_labels(x, c, labels, precision, input_dtype=None):
    """Labels equal the float64 argmin except near-ties: fp32-rounding ties, or for "fast" the
    documented bound of the fast products (of ``input_dtype`` inputs, default ``x.dtype``)."""
    xs, cs = x.double().cpu().numpy(), c.double().cpu().numpy()
    d = f64_sq_distances(xs, cs)
    expected = d.argmin(1)
    if precision == "fast":
        got = labels.cpu().numpy()
        gap = d[np.arange(len(xs)), got] - d[np.arange(len(xs)), expected]
        bound = gap_bound_coefficient(input_dtype or x.dtype, x.shape[1]) * np.linalg.norm(xs, axis=1) * np.linalg.norm(cs, axis=1).max()
        assert (gap <= bound + 1e-6).all()
    else:
        assert_labels_match_except_near_ties(xs, cs, labels.cpu().numpy(), expected)


def _search_config(search: str, d: int) -> dict:
    """Small tiles; "swap" (the transposed search) needs the whole row in one feature chunk, and so
    does "lazy1" (the lazy search over rows in one chunk: packed keys from 16 centroid tiles)."""
    if search in ("swap", "lazy1"):
        return {**SMALL_TILES, "EAGER": False, "SWAP": search == "swap", "BLOCK_D": max(16, 1 << (d - 1).bit_length())}
    return {**SMALL_TILES, "EAGER": search == "eager"}


@pytest.mark.parametrize("search", ["lazy", "lazy1", "eager", "swap"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("d", [1, 3, 17, 129])
@pytest.mark.parametrize("k", [1, 7, 1000])
def test_assign_matches_float64_on_odd_shapes(d, k, precision, search):
    n = 97  # not a multiple of any block
    x, c = _data(n, d, k, seed=d * 10_000 + k)
    out = assign(x, c, precision=precision, raw_norms=x.norm(dim=1), config=_search_config(search, d))
    _check_labels(x, c, out.labels, precision)
    direct = ((x.double() - c.double()[out.labels]) ** 2).sum(1)
    torch.testing.assert_close(out.sq_dist.double(), direct, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.inertia.double(), direct.sum(), rtol=1e-5, atol=1e-4)
    assert int(out.changed) == n


@pytest.mark.parametrize("search", ["lazy", "eager", "swap", "default"])
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("d, k", [(16, 64), (32, 96), (32, 1024)])
def test_whole_tiles_of_whole_rows_load_without_masks(d, k, precision, search):
    """Rows of exactly one feature chunk over whole centroid tiles (``assign._one_chunk`` 2: the
    search's loads without masks, 32-bit offsets): labels, distances and sums as float64's, and the
    same labels as the masked loads of a 16-wide step wider than the rows."""
    from torchkm._kernels.assign import _one_chunk

    n = 97
    x, c = _data(n, d, k, seed=d * 1_000 + k)
    config = None if search == "default" else {**_search_config(search, d), "BLOCK_D": d}
    got = {}
    for width in (d, 2 * d):
        cfg = config and {**config, "BLOCK_D": width}
        if cfg is not None:
            assert _one_chunk(cfg, k, d) == (2 if width == d and k % cfg["BLOCK_K"] == 0 else 1)
        elif width != d:
            continue
        sums = torch.zeros(k, d, device=DEVICE)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, precision=precision, raw_norms=x.norm(dim=1), sums=sums, counts=counts, config=cfg)
        _check_labels(x, c, out.labels, precision)
        direct = ((x.double() - c.double()[out.labels]) ** 2).sum(1)
        torch.testing.assert_close(out.sq_dist.double(), direct, rtol=1e-5, atol=1e-5)
        ref_sums, ref_counts = update_reference(x, out.labels, k)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(counts, ref_counts)
        got[width] = out.labels
    if len(got) == 2:
        assert torch.equal(got[d], got[2 * d])


def test_one_chunk_kinds():
    from torchkm._kernels.assign import _one_chunk

    assert _one_chunk({"BLOCK_D": 32, "BLOCK_K": 32}, 1024, 32) == 2
    assert _one_chunk({"BLOCK_D": 32, "BLOCK_K": 32}, 1000, 32) == 1  # a partial centroid tile
    assert _one_chunk({"BLOCK_D": 32, "BLOCK_K": 32}, 1024, 24) == 1  # a partial feature chunk
    assert _one_chunk({"BLOCK_D": 32, "BLOCK_K": 32}, 1024, 40) == 0  # streamed
    assert _one_chunk({"BLOCK_D": 64, "BLOCK_K": 64}, 2**26, 64) == 1  # k d past 32-bit offsets


def _check_fused_pass(d, k, seed, config=None, dtype=torch.float32):
    """One exact pass of weighted, centred rows (of ``dtype``) with previous labels and sums: labels,
    sums, counts, changed labels, distances and inertia against float64."""
    n = 300  # several tiles per persistent program under the interpreter (4 programs)
    x, c = _data(n, d, k, seed=seed, dtype=dtype)
    xf = x.float()
    w = torch.rand(n, device=DEVICE)
    offset = torch.randn(d, device=DEVICE)
    prev = torch.randint(0, k, (n,), device=DEVICE)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    out = assign(x, c, precision="exact", offset=offset, raw_norms=xf.norm(dim=1), sample_weight=w,
                 prev_labels=prev, sums=sums, counts=counts, config=config)
    _check_labels(xf - offset, c, out.labels, "exact")
    ref_sums, ref_counts = update_reference(xf, out.labels, k, sample_weight=w, offset=offset)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)
    assert int(out.changed) == int((out.labels != prev).sum())
    direct = (((xf - offset).double() - c.double()[out.labels]) ** 2).sum(1)
    torch.testing.assert_close(out.sq_dist.double(), direct, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.inertia.double(), direct @ w.double(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("search", ["lazy", "swap"])
@pytest.mark.parametrize("k", [5, 100])  # one-hot pre-reduction, and per-row atomics
# The small-d kernel; the tensor-core kernel with the one-hot partial sums carried across a
# program's tiles (rows of <= 64 features), and with them added tile by tile (wider rows).
@pytest.mark.parametrize("d", [3, 19, 65])
def test_fused_update_matches_reference(k, d, search):
    _check_fused_pass(d, k, seed=k, config=_search_config(search, d))


# The small-d kernel's centroid chunks: one chunk per tile (k <= 32), several chunks, the
# per-thread sums (d <= 4, few clusters), the one-hot product's sums, per-row atomics.
@pytest.mark.parametrize("k", [5, 33, 40, 64, 100])
@pytest.mark.parametrize("d", [1, 2, 4])
def test_small_d_pass_matches_reference(k, d):
    _check_fused_pass(d, k, seed=10 * k + d)


@pytest.mark.parametrize("layout", ["contiguous", "strided", "bf16"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("d,k", [(1, 64), (2, 32), (2, 40), (3, 7), (4, 16), (8, 5)])
def test_small_d_pass_walks_several_tiles_per_program(d, k, weighted, layout):
    """The small-d kernel loads each tile one step ahead of its search, over interleaved tiles:
    1,037 rows are 9 tiles, 3 per program under the interpreter (4 programs), the last one short and
    the prefetch past the end empty. Contiguous rows of 1, 2 or 4 features take one vector load per
    row, strided or 8-feature rows a tile load, bf16 rows half the bytes. Labels against float64,
    sums and counts against the reference update of those labels, changed labels against ``prev``."""
    n = 1037
    x, c = _data(n, d, k, seed=100 * d + k)
    if layout == "strided":
        wide = torch.zeros(n, 2 * d, device=DEVICE)
        wide[:, 1::2] = x
        x = wide[:, 1::2]
    elif layout == "bf16":
        x = x.to(torch.bfloat16)
    w = torch.rand(n, device=DEVICE) if weighted else None
    prev = torch.randint(0, k, (n,), device=DEVICE)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    out = assign(x, c, precision="exact", sample_weight=w, prev_labels=prev, sums=sums, counts=counts)
    _check_labels(x.float(), c, out.labels, "exact")
    ref_sums, ref_counts = update_reference(x.float(), out.labels, k, sample_weight=w)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)
    assert int(out.changed) == int((out.labels != prev).sum())
    direct = ((x.double() - c.double()[out.labels]) ** 2).sum(1)
    torch.testing.assert_close(out.sq_dist.double(), direct, rtol=1e-5, atol=1e-5)
    weights = torch.ones(n, dtype=torch.float64, device=DEVICE) if w is None else w.double()
    torch.testing.assert_close(out.inertia.double(), direct @ weights, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("search", ["lazy", "eager"])
@pytest.mark.parametrize("k", [5, 100])
@pytest.mark.parametrize("d", [17, 65])
def test_moves_keep_the_float64_sums_of_rows_by_label(k, d, search):
    """``moves=True`` over a row list: only listed rows whose label changed move between the
    float64 sums and counts, so they stay the weighted sums of the rows by their current label.
    Four copies of one centroid defer rows to the re-search (the lazy search settles three tied
    candidates in the pass), whose launch moves them too."""
    from torchkm._kernels.assign import AssignPass

    n = 300
    x, c = _data(n, d, k, seed=31 * d + k)
    c[1:4] = c[0]
    # Its own generator: drawn from the global one, these depended on the tests run before, and in
    # one CI run no listed row was deferred.
    g = torch.Generator().manual_seed(d + k)
    w = torch.rand(n, generator=g).to(DEVICE)
    offset = (torch.randn(d, generator=g) * 0.1).to(DEVICE)
    labels = torch.randint(0, k, (n,), generator=g, dtype=torch.int32).to(DEVICE)
    p = AssignPass(x, k, "exact", update=True, lower_bounds=True, moves=True, config=_search_config(search, d))

    def by_label(lab):  # rows as the kernel forms them (fp32), summed in float64
        rows = ((x - offset) * w[:, None]).double()
        sums = torch.zeros(k, d, dtype=torch.float64, device=DEVICE).index_add_(0, lab.long(), rows)
        return sums, torch.zeros(k, dtype=torch.float64, device=DEVICE).index_add_(0, lab.long(), w.double())

    start_sums, start_counts = by_label(labels)
    p.move_sums[0].copy_(start_sums)
    p.move_counts[0].copy_(start_counts)
    listed = torch.randperm(n, generator=torch.Generator().manual_seed(d))[:200].sort().values
    row_index = listed.to(torch.int32).to(DEVICE)
    before = labels.clone()
    p(x, c, offset=offset, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=w, prev_labels=labels,
      labels=labels, sq_dist=torch.empty(n, device=DEVICE),
      rows=(row_index, torch.tensor([listed.numel()], dtype=torch.int32, device=DEVICE)), moves=True)
    unlisted = torch.ones(n, dtype=torch.bool, device=DEVICE)
    unlisted[listed.to(DEVICE)] = False
    assert torch.equal(labels[unlisted], before[unlisted])
    _check_labels(x[listed.to(DEVICE)] - offset, c, labels[listed.to(DEVICE)].long(), "exact")
    assert int(p.flag_count) > 0  # the re-search moved rows as well
    assert bool((labels != before).any())
    want_sums, want_counts = by_label(labels)
    torch.testing.assert_close(p.move_sums[0], want_sums, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(p.move_counts[0], want_counts, rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError, match="moves=True"):
        AssignPass(x, k, "exact", update=True)(x, c, offset=offset, row_scale=None, raw_norms=x.norm(dim=1),
                                                sample_weight=None, prev_labels=labels, labels=labels, moves=True)


def _flagged_by_the_distance_bound(x, c, candidate, slack):
    """Whether the exact mode's rule (``score_bound_coefficients``) re-searches each row when every
    centroid but its best two scores at least what ``candidate`` (an index per row) scores: float64
    distances, the centroids' tf32 rounding error of that score exactly, and the rest of the
    score's error taken as ``slack`` times its bound (-1 .. 1)."""
    x64, c64 = x.double().cpu(), c.double().cpu()
    c_tf32 = round_to_tf32(c.float().cpu()).double()
    r = c64 - c_tf32
    dist = ((x64[:, None, :] - c64[None]) ** 2).sum(-1)
    best = dist.min(1).values
    rows = torch.arange(len(x64))
    cand = c64[candidate]
    rounding = 2 * ((x64 - cand) * r[candidate]).sum(1) + (r[candidate] ** 2).sum(1)
    coef_x, coef_b = score_bound_coefficients(torch.float32, x.shape[1])
    bias_max = (c_tf32**2).sum(1).max()
    bound = coef_x * x64.norm(dim=1) * c64.norm(dim=1).max() + coef_b * bias_max
    residual = r.norm(dim=1).max()
    t = dist[rows, candidate] + rounding + slack * bound - bound
    low = ((t.clamp_min(0) + residual**2).sqrt() - residual) ** 2
    return low <= best


@pytest.mark.parametrize("d", [8, 24, 128, 256])
def test_fp16_operand_rounding_within_the_half_bound(d):
    """fp32 rows as fp16 operands (scaled by the pass's power of two, rounded to nearest) are off
    by at most ``_HALF_ROW_ERROR`` of their norm floored by ``half_row_floor``: rows of ordinary
    elements (2^-11 of the norm, which the bound nearly reaches), rows with elements in fp16's
    subnormal range (an absolute 2^-25 / s each), and rows of such elements only. The score
    coefficient that takes it is about half tf32's."""
    from torchkm._kernels.assign import _HALF_ROW_ERROR
    from torchkm._kernels.centroids import half_row_floor, half_scale_reference

    g = torch.Generator().manual_seed(d)
    n = 4096
    x = torch.randn(n, d, generator=g)
    # Elements spread over 40 binades, down through fp16's subnormals once scaled (s |x| < 2^-14
    # while the largest |x| sits at 2^8 .. 2^9 scaled).
    x = x * torch.exp2(-40.0 * torch.rand(n, d, generator=g))
    x[: n // 4] *= 2.0**-30  # whole rows in the subnormal range, beside the largest rows
    c = torch.randn(7, d, generator=g)
    s = half_scale_reference(x, c)
    assert float((x[: n // 4].abs().max() * s)) < 2.0**-14
    rounded = (x * s).to(torch.float16).double() / s
    err = (rounded - x.double()).norm(dim=1)
    norm = x.double().norm(dim=1).clamp_min(half_row_floor(d, s))
    ratio = err / (_HALF_ROW_ERROR * norm)
    assert float(ratio.max()) <= 1.0
    assert float(ratio[n // 4:].max()) > 0.3  # ordinary rows: the bound is not loose by much
    # The worst rows: one normal element just under a rounding tie, at the floor's size and around
    # it, and every other element just under half of fp16's smallest subnormal (each rounds to 0,
    # off by nearly 2^-25 / s while adding nothing to the norm). Plain 2^-11 would not cover them.
    worst = torch.zeros(256, d, dtype=torch.float64)
    worst[:, 1:] = 0.4999 * 2.0**-24
    worst[:, 0] = (1.0 + 0.9999 * 2.0**-11) * torch.exp2(torch.linspace(-16, -4, 256).floor())
    worst = (worst / s).float()
    worst_err = ((worst * s).to(torch.float16).double() / s - worst.double()).norm(dim=1)
    worst_norm = worst.double().norm(dim=1).clamp_min(half_row_floor(d, s))
    assert 0.9 < float((worst_err / (_HALF_ROW_ERROR * worst_norm)).max()) <= 1.0
    assert float((worst_err / (2.0**-11 * worst_norm)).max()) > 1.0
    # Each score's operand term: |2 (x~ - x).c| <= (A - accumulation part) ||x|| max||c||.
    half_a, _ = score_bound_coefficients(torch.float32, d, half=True)
    tf32_a, _ = score_bound_coefficients(torch.float32, d)
    assert 0.5 < half_a / tf32_a < 0.6
    score_err = 2.0 * ((rounded - x.double()) @ c.double().T).abs().max(1).values
    assert bool((score_err <= half_a * norm * c.double().norm(dim=1).max()).all())
    with pytest.raises(ValueError, match="fp16 operands"):
        score_bound_coefficients(torch.bfloat16, d, half=True)


@triton.jit
def _floors_kernel(score_ptr, best_ptr, best_sq_ptr, x_sq_ptr, row_norm_ptr, out_ptr, n, c_norm_max, bias_max,
                   residual_max, bound_coef, bias_coef, pair_coef, pair_acc_coef, margin,
                   TILE_BITS: tl.constexpr, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = at < n
    score = tl.load(score_ptr + at, mask=mask, other=0.0)
    best = tl.load(best_ptr + at, mask=mask, other=0.0)
    best_sq = tl.load(best_sq_ptr + at, mask=mask, other=0.0)
    x_sq = tl.load(x_sq_ptr + at, mask=mask, other=0.0)
    row_norm = tl.load(row_norm_ptr + at, mask=mask, other=0.0)
    bound = bound_coef * row_norm * c_norm_max + bias_coef * bias_max
    tl.store(out_ptr + at, _distance_floor(score, x_sq, bound, residual_max, margin), mask=mask)
    tl.store(out_ptr + n + at, _pair_floor(score, best, best_sq, x_sq, row_norm, c_norm_max, bias_max, residual_max,
                                           pair_coef, pair_acc_coef, bias_coef, margin, TILE_BITS), mask=mask)


def _floors_at_their_worst(x, m, c, x_op, c_op, row_norm, tile_bits, pair_eps=None):
    """Both floors of the others' distances (``_distance_floor``, ``_pair_floor``) from a packed
    record pushed to the worst the pass allows, and the others' true (float64) distances.

    ``x_op``, ``c_op``: the operands as multiplied (rounded), ``m`` the offset, ``c`` the centred
    centroids. The scores are the operands' exact products, then pushed each way that could lift
    the floor: every other score high by the fp32 sums' whole bound and recorded as computed, the
    best low by it and recorded as low as the packed key's cleared bits and ``_key_floor`` make it.
    ``pair_eps``: ``_pair_floor``'s coefficient of the rows' rounding, if not the pass's own."""
    from torchkm._kernels.assign import pair_bound_coefficients

    n, d = x.shape
    m64, x64, c64 = m.double(), x.double(), c.double()
    bias = (c_op * c_op).sum(1) + 2.0 * c_op @ m64
    scores = bias[None, :] - 2.0 * x_op @ c_op.T
    true_sq = (((x64 - m64)[:, None, :] - c64[None]) ** 2).sum(-1)
    c_norm_max = float(c64.norm(dim=1).max())
    bias_max = float(bias.abs().max())
    residual_max = float((c64 - c_op).norm(dim=1).max()) * 1.001
    bound_coef, bias_coef = score_bound_coefficients(torch.float32, d + 8, half=True)
    pair_coef, pair_acc_coef = pair_bound_coefficients(torch.float32, d + 8, half=True)
    acc = pair_acc_coef * row_norm * c_norm_max + bias_coef * bias_max
    b = scores.argmin(1)
    rows = torch.arange(n)
    computed = scores + acc[:, None]
    computed[rows, b] = scores[rows, b] - acc
    if tile_bits:
        # The accumulator holds score + row term; the key's tile bits cleared (up to 2^(b - 23) of
        # it), then ``_key_floor``'s slack subtracted.
        term = ((x_op - m64) ** 2).sum(1) * (1 + 2.0**-5)
        value = computed[rows, b] + term
        value = value - value.abs() * 2.0 ** (tile_bits - 23)
        best = value - term - (value.abs() * (2.0 ** (tile_bits - 22) + 2.0**-21) + term * 2.0**-17)
    else:
        best = computed[rows, b]  # a record of the scores themselves (the tl.dot searches')
    recorded = computed.clone()
    recorded[rows, b] = float("inf")
    b2 = recorded.argmin(1)
    recorded[rows, b2] = float("inf")
    third = recorded.min(1).values
    others_sq = true_sq.clone()
    others_sq[rows, b] = float("inf")
    others_sq[rows, b2] = float("inf")
    best_sq = true_sq[rows, b].float()  # the direct fp32 distance (within ``margin``)
    x_sq = ((x64 - m64) ** 2).sum(1).float()
    margin = (d + 16) * 1.1920929e-07
    out = torch.empty(2 * n, dtype=torch.float32, device=DEVICE)
    f32 = dict(dtype=torch.float32, device=DEVICE)
    _floors_kernel[(triton.cdiv(n, 256),)](
        third.to(**f32), best.to(**f32), best_sq.to(DEVICE), x_sq.to(DEVICE), row_norm.to(**f32), out, n, c_norm_max,
        bias_max, residual_max, bound_coef, bias_coef, pair_coef if pair_eps is None else pair_eps, pair_acc_coef,
        margin, TILE_BITS=tile_bits, BLOCK=256)
    per_score, pair = out.cpu().double().view(2, n)
    return per_score, pair, others_sq.min(1).values, true_sq.min(1).values * (1 + margin)


@pytest.mark.parametrize("tile_bits", [0, 1, 6, 10])
def test_pair_floor_holds_against_float64(tile_bits):
    """``_pair_floor``, the exact epilogue's bound from the difference of two scores of the Hopper
    search's packed record (or, ``tile_bits`` 0, of the tl.dot searches' record of the scores
    themselves), stays under every other centroid's float64 distance, and settles rows the
    per-score floor (``_distance_floor``) cannot.

    Rows off the origin with about four centroids a cluster (over-split, as ``bench_lloyd --data
    mixed``), fp32 rows as fp16 operands (scaled, rounded to nearest); and rows built to make the
    pairwise bound tight: the winner and a third centroid on a line through the row, on either
    side, the row's rounding a vector of the whole allowed norm along that line (no fp16 rounding
    reaches it) and the record pushed as far as allowed: each of the floor's terms (the rounding,
    the sums' bound, the best's lowering) is needed there (taking any one out fails this test)."""
    from torchkm._kernels.assign import _HALF_ROW_ERROR
    from torchkm._kernels.centroids import half_row_floor, half_scale_reference

    g = torch.Generator().manual_seed(tile_bits)
    n, d, k = 2000, 128, 300
    centres = torch.rand(k // 4, d, generator=g)
    spread = 0.02 * 10 ** torch.rand(k // 4, 1, generator=g)
    which = torch.randint(0, k // 4, (n,), generator=g)
    x = (centres[which] + spread[which] * torch.randn(n, d, generator=g)).float()
    m = x.double().mean(0).float()
    c = (x[torch.randperm(n, generator=g)[:k]] - m).float()  # centred on the rows' mean, as a fit's
    s = half_scale_reference(x, c)
    row_norm = x.double().norm(dim=1).clamp_min(half_row_floor(d, s))
    per_score, pair, others, winner = _floors_at_their_worst(
        x, m, c, (x * s).half().double() / s, (c * s).half().double() / s, row_norm, tile_bits)
    assert bool((per_score <= others).all())
    assert bool((pair <= others).all()), float((pair / others).max())
    settled_per_score, settled_pair = int((per_score > winner).sum()), int((pair > winner).sum())
    # (2026-12-04: 357 -> 194 of 2,000 rows left at 6 tile bits; at 10, up to 65,536 centroids, the
    # cleared bits take more of the gain, and the epilogue keeps the larger floor anyway.)
    if tile_bits <= 6:
        assert n - settled_pair < 0.7 * (n - settled_per_score), (settled_per_score, settled_pair)

    # Tight rows: row i at x_i, its winner at distance a_i along +v_i, a runner-up at a right angle,
    # a third at a_i (1 + delta_i) along -v_i, a_i of 5-15; rows about 40 apart, so the rest of the
    # centroids are farther; far off the origin (the raw rows' norm sets the rounding), near their
    # mean (which sets the fp32 sums' bound), so that the rounding term is what matters.
    rows = 200
    v = torch.nn.functional.normalize(torch.randn(rows, d, generator=g, dtype=torch.float64), dim=1)
    w = torch.randn(rows, d, generator=g, dtype=torch.float64)
    w = torch.nn.functional.normalize(w - (w * v).sum(1, keepdim=True) * v, dim=1)
    x = (30.0 + 30.0 / d**0.5 * torch.randn(rows, d, generator=g, dtype=torch.float64)).float().double()
    m = x.mean(0).float().double()
    a = 5.0 + 10.0 * torch.rand(rows, 1, generator=g, dtype=torch.float64)
    delta = 10 ** (-3.0 + 2.5 * torch.rand(rows, 1, generator=g, dtype=torch.float64))
    c = (torch.cat([x + a * v, x + 1.001 * a * w, x - a * (1 + delta) * v]) - m).float().double()
    row_norm = x.norm(dim=1)
    # The rounding: the whole allowed norm, the way that makes the third look farther than it is.
    x_op = x + _HALF_ROW_ERROR * row_norm[:, None] * v
    per_score, pair, others, winner = _floors_at_their_worst(x.float(), m.float(), c.float(), x_op, c, row_norm,
                                                             tile_bits)
    assert bool((pair <= others).all()), float((pair / others).max())
    assert int((pair > winner).sum()) > 0  # some rows are settled by it
    # Without its 1.25 safety factor on the rounding (so with no room there), the floor's other
    # terms (the sums' bound, the best's lowering) must still hold it.
    _, pair_exact, _, _ = _floors_at_their_worst(x.float(), m.float(), c.float(), x_op, c, row_norm, tile_bits,
                                                 pair_eps=_HALF_ROW_ERROR)
    assert bool((pair_exact <= others).all()), float((pair_exact / others).max())
    _, pair_without, _, _ = _floors_at_their_worst(x.float(), m.float(), c.float(), x_op, c, row_norm, tile_bits,
                                                   pair_eps=0.0)
    assert bool((pair_without > others).any())  # the rounding term is what keeps the bound


def _over_split_rows(n: int, d: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows as ``bench_lloyd --data mixed`` (clusters in the unit cube, each its own spread), about
    four centroids a cluster (rows drawn as centroids, plus a little noise), centred on the rows'
    mean: (rows, centred centroids, mean)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(k // 4, d, generator=g)
    spread = 0.02 * 10 ** torch.rand(k // 4, 1, generator=g)
    which = torch.randint(0, k // 4, (n,), generator=g)
    x = centres[which] + spread[which] * torch.randn(n, d, generator=g)
    mean = x.mean(0)
    c = x[torch.randperm(n, generator=g)[:k]] - mean + 1e-3 * torch.randn(k, d, generator=g)
    return x.to(DEVICE), c.to(DEVICE), mean.to(DEVICE)


@pytest.mark.parametrize("search", ["eager", "lazy", "swap"])
def test_pair_floor_over_the_tl_dot_searches(monkeypatch, search):
    """The epilogue's pairwise floor (``_pair_floor``) over the tl.dot searches' records (scores, or
    the eager search's packed keys, within the sums' bound; ``TORCHKM_PAIR_BOUND=0`` turns it off).
    Over-split rows: fewer rows re-searched, the same labels (float64's but for ties), sums and
    counts."""
    n, d, k = 700, 40, 150  # d > 32: the distance bound; swap holds the row in one chunk
    x, c, mean = _over_split_rows(n, d, k, seed=3)
    monkeypatch.setenv("TORCHKM_HOPPER_SEARCH", "0")  # on Hopper the packed search would take the rows
    results = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("TORCHKM_PAIR_BOUND", setting)
        sums = torch.zeros_like(c)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, precision="exact", offset=mean, raw_norms=x.norm(dim=1), sums=sums, counts=counts,
                     config=_search_config(search, d))
        _check_labels(x - mean, c, out.labels, "exact")
        ref_sums, ref_counts = update_reference(x, out.labels, k, offset=mean)
        torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(counts, ref_counts)
        results[setting] = int(out.rechecked), out.labels
    (before, labels_before), (after, labels_after) = results["0"], results["1"]
    assert torch.equal(labels_before, labels_after)
    assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("search", ["eager", "lazy", "swap"])
def test_exact_mode_rechecks_the_rows_inside_the_bound(search):
    """Each row's best two candidates are compared by direct fp32 distances; a row is re-searched
    when a third centroid's score could hide a distance below the winner's: its score less the
    bound of what rounding the rows and the fp32 sums add, and less what rounding the centroids adds
    (bounded by the distance itself). The lazy searches (per column slot, transposed or not) name a
    third candidate too and compare it directly where it could win, so their rows are re-searched
    when a fourth could; and when a candidate shares a better one's slot (it has no index)."""
    # d > 32: fp32 rows of at most 32 features keep the gap bound; k > 64: the best-two search
    # (below, short fp32 rows are all searched with 3xTF32, see test_exact_mode_is_all_3xtf32_...).
    n, d, k = 512, 40, 65
    x, c = _data(n, d, k, seed=3)
    c = c[:1] + 0.01 * c  # close centroids: many rows with three candidates near the bounds
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1), sums=sums, counts=counts,
                 config=_search_config(search, d))
    order = (((x.double().cpu()[:, None, :] - c.double().cpu()[None]) ** 2).sum(-1)).argsort(1)
    # The third candidate's own score error besides the centroids' rounding is far inside its bound.
    surely = _flagged_by_the_distance_bound(x, c, order[:, 2], slack=0.5)
    if _names_a_third(x, k, search):
        # The lazy searches also compare a third candidate directly: a row is re-searched only if a
        # fourth could win (test_lazy_exact_search_settles_a_third_candidate).
        surely = _flagged_by_the_distance_bound(x, c, order[:, 3], slack=0.5)
    # The lazy searches may take the runner-up's score for the third's (or the fourth's).
    maybe = _flagged_by_the_distance_bound(x, c, order[:, 2] if search == "eager" else order[:, 1], slack=-0.5)
    assert 0 < int(surely.sum()) <= int(out.rechecked) <= int(maybe.sum())
    # Fewer than the gap bound of the fast products would re-search.
    _, top3 = assign_reference(x.cpu(), c.cpu())
    gap_bound = gap_bound_coefficient(torch.float32, d) * x.norm(dim=1).cpu().double() * c.norm(dim=1).max().cpu().double()
    if search == "eager":
        assert int(out.rechecked) <= int((top3[:, 2] - top3[:, 0] <= gap_bound).sum())
    _check_labels(x, c, out.labels, "exact")
    # Settled and re-searched rows reach the sums under their final labels, once each.
    ref_sums, ref_counts = update_reference(x, out.labels, k)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("search", ["lazy", "swap"])
def test_lazy_exact_search_re_searches_a_runner_up_in_the_winners_slot(search):
    """The best two of row 0 sit in the same centroid slot (indices 1 and 1 + BLOCK_K), closer than the
    rounding bound: the lazy searches keep no index for the second, so the row is re-searched and
    still gets the float64 label; the same pair in different slots is settled in the pass."""
    d, k = 12, 144  # k > 128: the best-two search (not all 3xTF32, see exact_as_tf32x3)
    x, c = _data(1, d, k, seed=21)
    c = c * 10  # every other centroid far away
    for first, runner_up in [(1, 17), (1, 18)]:  # slot 1 twice (BLOCK_K = 16), then slots 1 and 2
        cc = c.clone()
        cc[runner_up] = x[0] + 0.010 * torch.eye(d, device=DEVICE)[0]
        cc[first] = x[0] + 0.008 * torch.eye(d, device=DEVICE)[1]
        out = assign(x, cc, precision="exact", raw_norms=x.norm(dim=1), config=_search_config(search, d))
        assert int(out.labels[0]) == first
        assert torch.equal(out.labels.cpu(), assign_reference(x.cpu(), cc.cpu())[0])
        assert int(out.rechecked) == (1 if runner_up == 17 else 0)


def _names_a_third(x, k, search):
    """Whether the exact pass's search names a third candidate: the lazy ones, and on Hopper GPUs
    the Gluon search, which takes these rows whatever the tile config."""
    from torchkm._kernels.assign import AssignPass

    return search != "eager" or AssignPass(x, k, "exact", update=False, config=_search_config(search, x.shape[1])).hopper


@pytest.mark.parametrize("search", ["eager", "lazy", "swap"])
def test_lazy_exact_search_settles_a_third_candidate(search):
    """Under the distance bound (fp32 rows of more than 32 features), row 0 has three centroids in
    different slots closer together than the bound, every other one far away. The lazy searches
    name the third candidate and compare all three directly: the row is settled in the pass. The
    eager search names no third, so it re-searches the row (on Hopper GPUs these rows take the
    Gluon search, which names one). With a fourth such centroid (here the
    nearest) every search re-searches it, and the row still gets the float64 label."""
    d, k = 40, 80
    x, c = _data(1, d, k, seed=23)
    c = c * 10
    eye = torch.eye(d, device=DEVICE)
    for near, rechecked in [({2: 0.008, 1: 0.009, 3: 0.010}, {"eager": 1, "lazy": 0, "swap": 0}),
                            ({2: 0.008, 1: 0.009, 3: 0.010, 4: 0.007}, {"eager": 1, "lazy": 1, "swap": 1})]:
        cc = c.clone()
        for i, (index, step) in enumerate(near.items()):
            cc[index] = x[0] + step * eye[i]
        out = assign(x, cc, precision="exact", raw_norms=x.norm(dim=1), config=_search_config(search, d))
        assert int(out.labels[0]) == min(near, key=near.get)
        assert torch.equal(out.labels.cpu(), assign_reference(x.cpu(), cc.cpu())[0])
        assert int(out.rechecked) == rechecked["lazy" if _names_a_third(x, k, search) else search]


def test_split_re_search_gives_ties_to_the_lowest_index_across_chunks():
    """At k = 1000 the exact mode's re-search runs over eight centroid chunks (one program column
    each) and joins them through per-row keys. Rows whose three nearest codes are one vector stored
    three times, in different chunks, are deferred and get the lowest of the three indices; every
    other row gets the float64 label, and the sums see each row once, under its final label."""
    n, d, k = 300, 12, 1000
    x, c = _data(n, d, k, seed=5)
    g = torch.Generator(device=DEVICE).manual_seed(5)
    triples = [(3, 400, 900), (150, 151, 700), (260, 520, 999)]
    for group, (first, second, third) in enumerate(triples):
        c[second] = c[first]
        c[third] = c[first]
        x[group * 20:(group + 1) * 20] = c[first] + 1e-3 * torch.randn(20, d, device=DEVICE, generator=g)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1), sums=sums, counts=counts)
    assert int(out.rechecked) >= 60
    for group, (first, _, _) in enumerate(triples):
        assert (out.labels[group * 20:(group + 1) * 20] == first).all()
    _check_labels(x, c, out.labels, "exact")
    ref_sums, ref_counts = update_reference(x, out.labels, k)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)
    direct = ((x.double() - c.double()[out.labels]) ** 2).sum(1)
    torch.testing.assert_close(out.sq_dist.double(), direct, rtol=1e-5, atol=1e-5)


def _launched(monkeypatch):
    """Names of the kernels ``assign`` launches from now on."""
    import torchkm._kernels.assign as assign_module

    names = []
    real = assign_module.launcher

    def recording(kernel):
        names.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return real(kernel)

    monkeypatch.setattr(assign_module, "launcher", recording)
    return names


@pytest.mark.parametrize("mins", ["1", "0"])
@pytest.mark.parametrize("cap", [None, 8])
def test_candidate_re_search_settles_deferred_rows_as_the_full_one(monkeypatch, cap, mins):
    """Under the distance bound (d > 32) with a split re-search (k = 1000), deferred rows are first
    scored again with the fast product, and only the centroids that could still win are compared
    directly. Rows near a vector stored four times (once in each centroid chunk; the lazy and
    Hopper searches settle three candidates in the pass) have four such candidates and get the
    lowest index; rows near one stored twenty times have more than the 16
    kept and take the 3xTF32 re-search, as do the rows past the candidate buffer (``cap``: 8
    deferred rows). Labels, distances, sums and counts equal the full re-search's
    (``TORCHKM_RESEARCH_CANDIDATES=0``) and float64's beyond ties. Without the chunk minima
    (``mins`` "0") there are no lists to plan: the candidate launch takes the deferred rows as they
    are, over its own finer chunks."""
    import torchkm._kernels.assign as assign_module

    if cap is not None:
        monkeypatch.setattr(assign_module, "candidate_rows", lambda n: cap)
    monkeypatch.setenv("TORCHKM_CHUNK_MINS", mins)
    n, d, k = 300, 40, 1000
    x, c = _data(n, d, k, seed=31)
    g = torch.Generator(device=DEVICE).manual_seed(31)
    groups = [[5, 300, 600, 900], list(range(100, 1000, 45))]  # 4 copies (one per chunk); 20 copies
    for group, copies in enumerate(groups):
        c[copies] = c[copies[0]].clone()
        x[group * 20:(group + 1) * 20] = c[copies[0]] + 1e-3 * torch.randn(20, d, device=DEVICE, generator=g)
    # More close calls: rows halfway between two centroids.
    x[40:60] = 0.5 * (c[7] + c[8]) + 1e-4 * torch.randn(20, d, device=DEVICE, generator=g)
    results = {}
    for candidates in ("1", "0"):
        monkeypatch.setenv("TORCHKM_RESEARCH_CANDIDATES", candidates)
        launched = _launched(monkeypatch)
        sums = torch.zeros(k, d, device=DEVICE)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1), sums=sums, counts=counts)
        assert ("_candidate_kernel" in launched) == (candidates == "1")
        if mins == "0":  # (with them, the Hopper search keeps no minima either: no plan there)
            assert "_candidate_plan_kernel" not in launched
        results[candidates] = (out, sums, counts)
    out, sums, counts = results["1"]
    full, full_sums, full_counts = results["0"]
    assert int(out.rechecked) == int(full.rechecked) >= 40
    for group, copies in enumerate(groups):
        assert (out.labels[group * 20:(group + 1) * 20] == copies[0]).all()
    assert torch.equal(out.labels, full.labels)
    torch.testing.assert_close(out.sq_dist, full.sq_dist, rtol=0, atol=0)
    _check_labels(x, c, out.labels, "exact")
    ref_sums, ref_counts = update_reference(x, out.labels, k)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(counts, ref_counts, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sums, full_sums, rtol=1e-6, atol=1e-6)
    assert torch.equal(counts, full_counts)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_gpu_for_bf16)])
def test_chunk_minima_list_fewer_chunks_and_keep_the_result(monkeypatch, dtype):
    """Rows wider than the Hopper search (d = 300) through the eager search keep each row's lowest
    score per re-search chunk; the candidate re-search then scores a deferred row again only in
    the chunks that could hold a winner. Rows near a vector stored once in each of 4 chunks need
    them all; rows near one stored three times in one chunk need that one. Labels, distances,
    sums and counts equal those without the minima (``TORCHKM_CHUNK_MINS=0``, every chunk) and
    float64's beyond ties, and fewer (row, chunk) pairs are listed."""
    from torchkm._kernels.assign import AssignPass

    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "0")  # (the near rows would be listed for no chunk)
    n, d, k = 300, 300, 1000
    x, c = _data(n, d, k, seed=37)
    g = torch.Generator(device=DEVICE).manual_seed(37)
    groups = [[5, 300, 600, 900], [10, 11, 12]]  # one copy in each of 4 chunks; 3 copies in chunk 0
    for group, copies in enumerate(groups):
        c[copies] = c[copies[0]].clone()
        x[group * 20:(group + 1) * 20] = c[copies[0]] + 1e-3 * torch.randn(20, d, device=DEVICE, generator=g)
    x = x.to(dtype)
    results = {}
    for mins in ("1", "0"):
        monkeypatch.setenv("TORCHKM_CHUNK_MINS", mins)
        p = AssignPass(x, k, "exact", update=True, config={"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64,
                                                          "num_warps": 4, "num_stages": 2, "EAGER": True})
        assert p.cand_cap and (p.chunk_mins is not None) == (mins == "1") and not p.hopper
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        p(x, c, offset=None, row_scale=None, raw_norms=x.float().norm(dim=1), sample_weight=None, prev_labels=None,
          labels=labels, sq_dist=sq_dist)
        deferred = int(p.flag_count[0])
        listed = int(p.flag_count[p.lists_at:].sum())
        results[mins] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0), deferred, listed)
    labels, sq_dist, sums, counts, deferred, listed = results["1"]
    labels0, sq_dist0, sums0, counts0, deferred0, listed0 = results["0"]
    assert deferred == deferred0 >= 40
    # Without the minima every chunk is listed for every row where the plan copies rows into fp16
    # (fp32 rows with fp16 operands); else nothing is, as the candidate launch reads the rows.
    assert listed0 == (deferred0 * p.research_chunks if p.half and p.copy_rows else 0) and p.research_chunks == 4
    assert deferred <= listed <= 4 * deferred0 - 3 * 20
    for group, copies in enumerate(groups):
        assert (labels[group * 20:(group + 1) * 20] == copies[0]).all()
    assert torch.equal(labels, labels0)
    torch.testing.assert_close(sq_dist, sq_dist0, rtol=0, atol=0)
    _check_labels(x.float(), c, labels, "exact")
    ref_sums, ref_counts = update_reference(x.float(), labels, k)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-5)
    assert_sums_equal_but_for_order(sums, sums0, x.float(), labels)  # float atomics: any order
    assert torch.equal(counts, counts0) and torch.equal(counts, ref_counts.to(counts.dtype))


def _stored_copies(n, d, k, seed):
    """Rows near a vector stored once in each of 4 centroid chunks (rows 0-39), near one stored three
    times in one chunk (40-79), and halfway between two centroids (80-119): many deferred rows, with
    exact ties. Returns x, c and the stored copies' indices by group."""
    x, c = _data(n, d, k, seed=seed)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    groups = [[5, 300, 600, 900], [10, 11, 12]]
    for group, copies in enumerate(groups):
        c[copies] = c[copies[0]].clone()
        x[group * 40:(group + 1) * 40] = c[copies[0]] + 1e-3 * torch.randn(40, d, device=DEVICE, generator=g)
    x[80:120] = 0.5 * (c[7] + c[8]) + 1e-4 * torch.randn(40, d, device=DEVICE, generator=g)
    return x, c, groups


def _assert_same_pass(x, c, groups, got, other, shift=None):
    """Two exact passes over ``_stored_copies`` data: each group's rows at its first copy, labels and
    distances equal, labels float64's beyond ties, sums (of the rows less ``shift``) within float
    atomics' reordering, counts equal."""
    labels, sq_dist, sums, counts = got
    for group, copies in enumerate(groups):
        assert (labels[group * 40:(group + 1) * 40] == copies[0]).all()
    assert torch.equal(labels, other[0])
    torch.testing.assert_close(sq_dist, other[1], rtol=0, atol=0)
    _check_labels(x, c, labels, "exact")
    assert_sums_equal_but_for_order(sums, other[2], x if shift is None else x - shift, labels)
    assert torch.equal(counts, other[3])


@pytest.mark.parametrize("offset", [False, True])
def test_candidate_copy_keeps_the_result(monkeypatch, offset):
    """fp32 rows with fp16 operands: the candidate re-search scores the deferred rows that fit the
    search's fp16 row buffer from an fp16 copy the plan writes (``COPY``), the rest from x. With
    the copy cut to 64 rows (``copy_rows``) and more rows deferred, both lists run, and
    labels, distances, sums and counts equal those without the copy (``TORCHKM_CANDIDATE_COPY=0``)
    and float64's beyond ties; as many (row, chunk) pairs are listed."""
    from torchkm._kernels.assign import AssignPass

    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "0")  # (the near rows would be listed for no chunk)
    n, d, k = 300, 300, 1000
    x, c, groups = _stored_copies(n, d, k, seed=53)
    if offset:
        x = x + 3.0  # the plan centres what it sums, never what it copies
    shift = x.mean(0) if offset else None
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}
    launched = _launched(monkeypatch)
    results = {}
    for copy in ("1", "0"):
        monkeypatch.setenv("TORCHKM_CANDIDATE_COPY", copy)
        p = AssignPass(x, k, "exact", update=True, config=config)
        assert p.half and p.cand_cap and p.copy_rows == min(p.cand_cap, p.half_rows) >= n
        p.copy_rows = 64
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        launched.clear()
        p(x, c - (shift if offset else 0), offset=shift, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None,
          prev_labels=None, labels=labels, sq_dist=sq_dist)
        assert launched.count("_candidate_kernel") == (2 if copy == "1" else 1)
        lists = p.flag_count[p.lists_at:].view(2, -1).sum(1)
        results[copy] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0), int(p.flag_count[0]),
                         lists.tolist())
    labels, sq_dist, sums, counts, deferred, lists = results["1"]
    labels0, sq_dist0, sums0, counts0, deferred0, lists0 = results["0"]
    assert deferred == deferred0 > p.copy_rows
    assert lists[0] > 0 and lists[1] > 0 and lists0[0] == 0 and sum(lists) == lists0[1]
    _assert_same_pass(x, c, groups, (labels, sq_dist, sums, counts), (labels0, sq_dist0, sums0, counts0), shift)


@pytest.mark.parametrize("mins", ["1", "0"])
def test_candidate_rows_loaded_once_keep_the_result(monkeypatch, mins):
    """The candidate launch over rows of at most its ``BLOCK_D`` features loads and converts each
    tile of rows once (``X_ONCE``) instead of once per centroid tile and feature step: labels,
    distances, sums and counts equal those of the tiles that step through the features, and of
    ``TORCHKM_CANDIDATE_X_ONCE=0``, and float64's beyond ties. With the chunk minima ("1") the
    launch reads the plan's lists, without them the deferred rows as they are."""
    import torchkm._kernels.assign as assign_module
    from torchkm._kernels.assign import AssignPass

    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "0")  # (the near rows would be listed for no chunk)
    monkeypatch.setenv("TORCHKM_CHUNK_MINS", mins)
    monkeypatch.setenv("TORCHKM_CANDIDATE_COPY", "0")  # (copied rows are read from the copy)
    n, d, k = 300, 40, 1000
    x, c, groups = _stored_copies(n, d, k, seed=61)
    once = []
    real = assign_module.launcher

    def recording(kernel):
        launch = real(kernel)
        if getattr(kernel, "fn", kernel).__name__ != "_candidate_kernel":
            return launch

        class Recorded:
            def __getitem__(self, grid):
                def call(*args, **kwargs):
                    once.append(kwargs["X_ONCE"])
                    return launch[grid](*args, **kwargs)
                return call
        return Recorded()

    monkeypatch.setattr(assign_module, "launcher", recording)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}
    results = {}
    for name, tiles, setting in (("once", "32,64,64,4,1", "1"), ("steps", "32,64,16,4,1", "1"),
                                 ("off", "32,64,64,4,1", "0")):
        monkeypatch.setenv("TORCHKM_CANDIDATE_CONFIG", tiles)
        monkeypatch.setenv("TORCHKM_CANDIDATE_X_ONCE", setting)
        p = AssignPass(x, k, "exact", update=True, config=config)
        assert p.cand_cap and (p.chunk_mins is not None) == (mins == "1")
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        once.clear()
        p(x, c, offset=None, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None, prev_labels=None,
          labels=labels, sq_dist=sq_dist)
        assert once == [name == "once"]
        results[name] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0))
        assert int(p.flag_count[0]) >= 40
    for name in ("steps", "off"):
        _assert_same_pass(x, c, groups, results["once"], results[name])


def test_neighbour_lists_up_to_their_cluster_limit(monkeypatch):
    """The exact mode lists near centroids (15, the candidate buffer less the winner) up to
    ``NEIGHBOUR_MAX_CLUSTERS`` centroids; ``TORCHKM_NEIGHBOURS`` 0 / 1: never / at any k."""
    from torchkm._kernels.assign import CANDIDATES, NEIGHBOUR_MAX_CLUSTERS, neighbour_count

    monkeypatch.delenv("TORCHKM_NEIGHBOURS", raising=False)
    assert neighbour_count(NEIGHBOUR_MAX_CLUSTERS) == CANDIDATES - 1 == 15
    assert neighbour_count(NEIGHBOUR_MAX_CLUSTERS + 1) == 0
    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "1")
    assert neighbour_count(1 << 20) == 15
    monkeypatch.setenv("TORCHKM_NEIGHBOURS", "0")
    assert neighbour_count(7) == 0


@pytest.mark.parametrize("offset", [False, True])
def test_neighbour_lists_settle_tight_clusters_as_the_candidate_re_search(monkeypatch, offset):
    """Rows of tight clusters, each split among four close centroids (one in each re-search chunk),
    are deferred by the fast pass; with each centroid's nearest others listed
    (``TORCHKM_NEIGHBOURS=1``, ``centroids.centroid_neighbours``) the plan takes the winner and its
    list as their candidates, no chunk re-scores them, and labels, distances, sums and counts equal
    those of the candidate re-search without the lists and float64's beyond ties."""
    from torchkm._kernels.assign import AssignPass

    n, d, k = 300, 300, 1000
    x, c = _data(n, d, k, seed=59)
    g = torch.Generator(device=DEVICE).manual_seed(59)
    for group in range(8):
        members = [group, 250 + group, 500 + group, 750 + group]
        base = c[group].clone()
        c[members] = base + 2e-3 * torch.randn(4, d, device=DEVICE, generator=g)
        x[group * 30:(group + 1) * 30] = base + 2e-3 * torch.randn(30, d, device=DEVICE, generator=g)
    if offset:  # rows and centroids far from the origin, the rows centred as they are read
        x, c = x + 3.0, c + 3.0
    shift = x.mean(0) if offset else None
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}
    results = {}
    for neighbours in ("1", "0"):
        monkeypatch.setenv("TORCHKM_NEIGHBOURS", neighbours)
        p = AssignPass(x, k, "exact", update=True, config=config)
        assert p.cand_cap and p.neighbours == (15 if neighbours == "1" else 0)
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        p(x, c - (shift if offset else 0), offset=shift, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None,
          prev_labels=None, labels=labels, sq_dist=sq_dist)
        results[neighbours] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0), int(p.flag_count[0]),
                               int(p.flag_count[p.lists_at:].sum()))
    labels, sq_dist, sums, counts, deferred, listed = results["1"]
    labels0, sq_dist0, sums0, counts0, deferred0, listed0 = results["0"]
    assert deferred == deferred0 >= 200
    assert listed < listed0 and listed0 >= deferred0  # the tight clusters' rows are listed for no chunk
    assert torch.equal(labels, labels0)
    torch.testing.assert_close(sq_dist, sq_dist0, rtol=0, atol=0)
    _check_labels(x, c, labels, "exact")
    assert_sums_equal_but_for_order(sums, sums0, x if shift is None else x - shift, labels)
    assert torch.equal(counts, counts0)


@pytest.mark.parametrize("offset", [False, True])
def test_unlisted_candidates_keep_the_result(monkeypatch, offset):
    """Without chunk minima or a copy, the candidate launch reads the deferred rows in order and
    computes their thresholds itself, over finer centroid chunks (``configs.candidate_chunks``),
    where the plan would list every row for every chunk (``TORCHKM_CANDIDATE_LISTS=1``). Labels,
    distances, sums and counts are the plan's, with and without an offset (the thresholds take
    the centred rows), and float64's beyond ties."""
    from torchkm._kernels.assign import AssignPass
    from torchkm._kernels.configs import candidate_chunks

    n, d, k = 300, 40, 1000
    x, c, groups = _stored_copies(n, d, k, seed=59)
    if offset:  # rows and centroids far from the origin, where the centred norms matter
        x, c = x + 3.0, c + 3.0
    shift = x.mean(0) if offset else None
    monkeypatch.setenv("TORCHKM_CHUNK_MINS", "0")
    launched = _launched(monkeypatch)
    results = {}
    for lists in ("1", "0"):
        monkeypatch.setenv("TORCHKM_CANDIDATE_LISTS", lists)
        p = AssignPass(x, k, "exact", update=True)
        assert p.cand_cap and p.chunk_mins is None
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        launched.clear()
        p(x, c - (shift if offset else 0), offset=shift, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None,
          prev_labels=None, labels=labels, sq_dist=sq_dist)
        assert ("_candidate_plan_kernel" in launched) == (lists == "1") and "_candidate_kernel" in launched
        results[lists] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0), int(p.flag_count[0]))
    labels, sq_dist, sums, counts, deferred = results["0"]
    labels1, sq_dist1, sums1, counts1, deferred1 = results["1"]
    # (40 on Hopper GPUs: the search settles the rows with three candidates in the pass)
    assert deferred == deferred1 >= 40 and candidate_chunks(k)[1] > p.research_chunks
    _assert_same_pass(x, c, groups, (labels, sq_dist, sums, counts), (labels1, sq_dist1, sums1, counts1), shift)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_gpu_for_bf16)])
@pytest.mark.parametrize("k", [70, 1000])
def test_packed_keys_keep_the_exact_labels(monkeypatch, dtype, k):
    """The eager exact search with its best three as packed keys (a score's column in its lowest
    bits; the default for 16-bit rows, ``TORCHKM_PACKED_KEYS=1`` forces it for fp32) gives the
    labels, distances, sums and counts of the unpacked search, on rows with exact ties (centroids
    stored twice or three times) and close calls; it defers at least as many rows (its bound is
    wider by what the cleared bits hide)."""
    from torchkm._kernels.assign import AssignPass

    n, d = 300, 300  # beyond the Hopper search, which settles three candidates in the pass
    x, c = _data(n, d, k, seed=41)
    g = torch.Generator(device=DEVICE).manual_seed(41)
    c[[3, 4, 5]] = c[3].clone()
    c[[9, 60]] = c[9].clone()
    x[:20] = c[3] + 1e-3 * torch.randn(20, d, device=DEVICE, generator=g)
    x[20:40] = c[9] + 1e-3 * torch.randn(20, d, device=DEVICE, generator=g)
    x[40:60] = 0.5 * (c[7] + c[8]) + 1e-4 * torch.randn(20, d, device=DEVICE, generator=g)
    x = x.to(dtype)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}
    results = {}
    # "1": the lowest three through the merging network (default); "1-minima": three successive
    # minima (TORCHKM_TOP3_NETWORK=0); "0": unpacked.
    for packed in ("1", "1-minima", "0"):
        monkeypatch.setenv("TORCHKM_TOP3_NETWORK", "0" if packed == "1-minima" else "1")
        monkeypatch.setenv("TORCHKM_PACKED_KEYS", packed[0])
        p = AssignPass(x, k, "exact", update=True, config=config)
        assert not p.hopper
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        p(x, c, offset=None, row_scale=None, raw_norms=x.float().norm(dim=1), sample_weight=None, prev_labels=None,
          labels=labels, sq_dist=sq_dist)
        results[packed] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0), int(p.flag_count[0]))
    labels, sq_dist, sums, counts, deferred = results["1"]
    labels0, sq_dist0, sums0, counts0, deferred0 = results["0"]
    # Both reductions find the same three keys a tile: the same labels, distances and deferred rows
    # (the sums' float atomics add in any order on a GPU).
    labels1, sq_dist1, sums1, counts1, deferred1 = results["1-minima"]
    assert torch.equal(labels, labels1) and torch.equal(sq_dist, sq_dist1) and torch.equal(counts, counts1)
    assert deferred == deferred1
    assert_sums_equal_but_for_order(sums, sums1, x.float(), labels, atol=1e-6)
    assert deferred >= deferred0 >= 20
    assert (labels[:20] == 3).all() and (labels[20:40] == 9).all()
    assert torch.equal(labels, labels0)
    torch.testing.assert_close(sq_dist, sq_dist0, rtol=0, atol=0)
    _check_labels(x.float(), c, labels, "exact")
    assert_sums_equal_but_for_order(sums, sums0, x.float(), labels, atol=1e-6)
    assert torch.equal(counts, counts0)


@triton.jit
def _lowest_three_kernel(key_ptr, out_ptr, ROWS: tl.constexpr, W: tl.constexpr):
    rows = tl.arange(0, ROWS)
    m1, m2, m3 = _lowest_three(tl.load(key_ptr + rows[:, None] * W + tl.arange(0, W)[None, :]))
    tl.store(out_ptr + rows, m1)
    tl.store(out_ptr + ROWS + rows, m2)
    tl.store(out_ptr + 2 * ROWS + rows, m3)


@pytest.mark.parametrize("width", [4, 8, 64, 256])
def test_lowest_three_is_the_first_three_of_a_sort(width):
    """``_lowest_three`` (the eager exact search's merging network over a tile of packed keys) gives
    each row's three lowest values, sorted, as a sort would: on random keys, repeated values,
    +inf padding and rows of fewer than three finite values."""
    g = torch.Generator().manual_seed(width)
    key = torch.randn(32, width, generator=g)
    key[1] = 2.5  # all equal
    key[2, :: 2] = -1.0  # repeated lowest
    key[3] = float("inf")  # padding only
    key[4, 1:] = float("inf")  # one finite value
    key[5, 2:] = float("inf")
    key[6] = torch.randperm(width, generator=g).float()
    key = key.to(DEVICE)
    out = torch.full((3, 32), float("nan"), device=DEVICE)
    _lowest_three_kernel[(1,)](key, out, 32, width)
    torch.testing.assert_close(out, key.sort(dim=1).values[:, :3].T.contiguous(), rtol=0, atol=0)


@pytest.mark.parametrize("k", [70, 1000])
@pytest.mark.parametrize("magnitude", [1.0, 1e-7, 3e5])
def test_fp16_operands_keep_the_exact_labels(monkeypatch, k, magnitude):
    """fp32 rows through the streamed eager search multiply fp16 operands scaled into its range
    (the default; ``TORCHKM_HALF_OPERANDS=0``: tf32): the exact mode gives the labels, distances,
    sums and counts of the tf32 products, at any magnitude, on exact ties, close calls and rows
    far below the largest (whose features fall into fp16's subnormals: the bound's row floor);
    the fast mode stays within its documented bound."""
    from torchkm._kernels.assign import AssignPass

    n, d = 300, 300
    x, c = _fp16_operand_rows(n, d, k, 43, magnitude)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}
    results = {}
    for precision in ("exact", "fast"):
        for half in ("1", "0"):
            monkeypatch.setenv("TORCHKM_HALF_OPERANDS", half)
            p = AssignPass(x, k, precision, update=True, config=config)
            assert p.half == (half == "1")
            labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
            sq_dist = torch.full((n,), float("nan"), device=DEVICE)
            p(x, c, offset=None, row_scale=None, raw_norms=x.norm(dim=1), sample_weight=None, prev_labels=None,
              labels=labels, sq_dist=sq_dist)
            results[precision, half] = (labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0))
        _check_labels(x, c, results[precision, "1"][0], precision)
    _check_fp16_against_tf32(results, x, k, magnitude)


@pytest.mark.parametrize("dtype, d, half", [(torch.float32, 136, True), (torch.float32, 17, False),
                                            (torch.float16, 40, False), (torch.float32, 136, False)])
def test_exact_pass_takes_the_row_norms_itself_when_not_given(monkeypatch, dtype, d, half):
    """Without ``raw_norms`` the exact pass computes them (in the fp16 operands' row maxima launch,
    or a launch of its own) and returns what it returns given them: labels, distances, sums."""
    from torchkm._kernels.assign import AssignPass

    monkeypatch.setenv("TORCHKM_HALF_OPERANDS", "1" if half else "0")
    n, k = 203, 150  # k > 128: the best-two route (not all 3xTF32), which needs the norms
    x, c = _fp16_operand_rows(n, d, k, 5, 1.0)
    x = x.to(dtype)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64 if d > 64 else 32, "num_warps": 4, "num_stages": 2,
              "EAGER": True}
    results = []
    for norms in (torch.linalg.vector_norm(x, dim=1, dtype=torch.float32), None):
        p = AssignPass(x, k, "exact", update=True, config=config)
        assert p.half == half
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        for _ in range(2):  # the second call reuses the pass's norms buffer
            p(x, c, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None,
              labels=labels, sq_dist=sq_dist)
        if norms is None:
            torch.testing.assert_close(p.own_norms, torch.linalg.vector_norm(x, dim=1, dtype=torch.float32),
                                       rtol=2e-6, atol=0)
        results.append((labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0)))
    given, own = results
    assert torch.equal(given[0], own[0]) and torch.equal(given[1], own[1]) and torch.equal(given[3], own[3])
    assert_sums_equal_but_for_order(given[2], own[2], x.float(), given[0])  # float atomics: any order


def test_fp16_operands_of_fixed_rows_read_their_maxima_once(monkeypatch):
    """``AssignPass(fixed_rows=True)`` (a fit's engine) reads the largest |x| at its first call only;
    its passes then equal a fresh object's, with centroids of another magnitude, and a call with
    other rows reads theirs."""
    from torchkm._kernels import assign as assign_module
    from torchkm._kernels.assign import AssignPass

    n, d, k = 130, 136, 40
    x, c = _fp16_operand_rows(n, d, k, 7, 1.0)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}
    reads = []
    amax_parts = assign_module.amax_parts
    monkeypatch.setattr(assign_module, "amax_parts",
                        lambda *args, rows=True, **kw: (reads.append(rows), amax_parts(*args, rows=rows, **kw)))

    def run(p, rows, centroids):
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        sq_dist = torch.full((n,), float("nan"), device=DEVICE)
        p(rows, centroids, offset=None, row_scale=None, raw_norms=rows.norm(dim=1), sample_weight=None,
          prev_labels=None, labels=labels, sq_dist=sq_dist)
        return labels, sq_dist, p.acc_sums.sum(0), p.acc_counts.sum(0)

    fixed = AssignPass(x, k, "exact", update=True, config=config, fixed_rows=True)
    assert fixed.half
    other = x * 1e4
    for rows, centroids, read in ((x, c, True), (x, c * 1e3, False), (x, c * 1e-3, False), (other, c * 1e4, True)):
        got = run(fixed, rows, centroids)
        assert reads[-1] == read
        want = run(AssignPass(rows, k, "exact", update=True, config=config), rows, centroids)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[3], want[3])
        torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5 * float(rows.abs().max()))  # (atomics)


def test_fp16_operands_of_new_fixed_rows_are_read_where_their_slots_say_unknown():
    """The first call of a ``fixed_rows`` pass may be a CUDA graph's capture (a fit after the first of
    its shape): its launch for the rows' maxima then runs at every replay, so it reads the rows only
    where their slots still hold -1 when it runs, and keeps maxima already there. Other rows later
    are forgotten and read."""
    from torchkm._kernels.assign import AssignPass

    n, d, k = 130, 136, 40
    x, c = _fp16_operand_rows(n, d, k, 8, 1.0)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_D": 64, "num_warps": 4, "num_stages": 2, "EAGER": True}

    def run(p, rows):
        labels = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        p(rows, c, offset=None, row_scale=None, raw_norms=rows.norm(dim=1), sample_weight=None, prev_labels=None,
          labels=labels)
        assert int(labels.min()) >= 0

    fixed = AssignPass(x, k, "exact", update=True, config=config, fixed_rows=True)
    programs = fixed.half_x_programs
    assert fixed.half and (fixed.half_parts[:programs] == -1).all()
    fixed.half_parts[:programs] = 1e3  # as an earlier replay of the same launch would have left them
    run(fixed, x)
    assert (fixed.half_parts[:programs] == 1e3).all()
    other = x * 3
    run(fixed, other)
    assert fixed.half_parts[:programs].max() == other.abs().max()
    run(fixed, other)  # then the centroids' only
    assert fixed.half_parts[:programs].max() == other.abs().max()


def _fp16_operand_rows(n: int, d: int, k: int, seed: int, magnitude: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and centroids for fp16 operands: exact ties (centroid 3 stored three times), close calls
    (midpoints of 7 and 8), and rows 2^-40 below the rest nearest to a centroid as small (11),
    whose features fall into fp16's subnormals; all times ``magnitude``."""
    x, c = _data(n, d, k, seed=seed)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    c[[3, 4, 5]] = c[3].clone()
    x[:20] = c[3] + 1e-3 * torch.randn(20, d, device=DEVICE, generator=g)
    x[40:60] = 0.5 * (c[7] + c[8]) + 1e-4 * torch.randn(20, d, device=DEVICE, generator=g)
    x[60:80] = x[60:80] * 2.0**-40 + c[11] * 2.0**-41
    c[11] = c[11] * 2.0**-41
    return x * magnitude, c * magnitude


def _check_fp16_against_tf32(results: dict, x: torch.Tensor, k: int, magnitude: float) -> None:
    """The exact pass with fp16 operands (``results["exact", "1"]``: labels, distances, sums, counts)
    against tf32 products (``results["exact", "0"]``) on ``_fp16_operand_rows``."""
    labels, sq_dist, sums, counts = results["exact", "1"]
    labels0, sq_dist0, sums0, counts0 = results["exact", "0"]
    assert (labels[:20] == 3).all() and (labels[60:80] == 11).all()
    assert torch.equal(labels, labels0)
    torch.testing.assert_close(sq_dist, sq_dist0, rtol=0, atol=0)
    # (the GPU's atomics add in any order)
    torch.testing.assert_close(sums, sums0, rtol=1e-5, atol=1e-4 * magnitude)
    torch.testing.assert_close(sums, update_reference(x, labels, k)[0], rtol=1e-5, atol=1e-4 * magnitude)
    assert torch.equal(counts, counts0)


@pytest.mark.parametrize(("precision", "search"), [("exact", "eager"), ("exact", "swap"), ("fast", "lazy"), ("fast", "swap")])
def test_cosine_rows_are_scaled_as_they_are_read(precision, search):
    n, d, k = 150, 33, 9
    x, c = _data(n, d, k, seed=5)
    c = c / c.norm(dim=1, keepdim=True)
    scale = x.norm(dim=1).reciprocal()
    out = assign(x, c, precision=precision, row_scale=scale, raw_norms=x.norm(dim=1), config=_search_config(search, d))
    unit = x / x.norm(dim=1, keepdim=True)
    _check_labels(unit, c, out.labels, precision)
    torch.testing.assert_close(out.sq_dist, ((unit - c[out.labels]) ** 2).sum(1), rtol=1e-5, atol=1e-5)


def test_ties_break_to_the_lowest_index_across_tiles():
    d = 5
    x, _ = _data(40, d, 3, seed=7)
    # Centroid 2 reappears at 20 and 37 (other centroid tiles of 16): ties must keep index 2.
    c = torch.randn(40, d, generator=torch.Generator().manual_seed(8)).to(DEVICE) * 50
    c[2] = c[20] = c[37] = x[0]
    # Two copies only: the exact mode settles this row from its best two, which tie exactly.
    c[5] = c[30] = x[1]
    for precision, search in [(p, "lazy") for p in PRECISIONS] + [(p, "swap") for p in PRECISIONS]:
        out = assign(x, c, precision=precision, raw_norms=x.norm(dim=1), config=_search_config(search, d))
        assert int(out.labels[0]) == 2
        assert int(out.labels[1]) == 5
        assert torch.equal(out.labels.cpu(), assign_reference(x.cpu(), c.cpu())[0]) or precision == "fast"


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=needs_gpu_for_bf16)])
@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_half_precision_inputs(dtype, precision):
    n, d, k = 97, 40, 23
    x, c = _data(n, d, k, seed=11, dtype=dtype)
    out = assign(x, c, precision=precision, raw_norms=x.float().norm(dim=1), config=SMALL_TILES)
    _check_labels(x.float(), c, out.labels, precision, input_dtype=dtype)


def test_strided_input_int32_labels_and_errors():
    x, c = _data(64, 12, 5, seed=13)
    wide = torch.zeros(64, 24, device=DEVICE)
    wide[:, ::2] = x
    labels = torch.empty(64, dtype=torch.int32, device=DEVICE)
    out = assign(wide[:, ::2], c, precision="ieee", labels=labels, config=SMALL_TILES)
    assert out.labels is labels and out.labels.dtype == torch.int32
    torch.testing.assert_close(out.labels.long().cpu(), assign_reference(x.cpu(), c.cpu())[0])
    with pytest.raises(ValueError, match="expected x"):
        assign(x, c[:, :3])
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        assign(x.double(), c)
    with pytest.raises(ValueError, match="precision"):
        assign(x, c, precision="tf16")
    with pytest.raises(ValueError, match="raw_norms"):
        assign(x, c, precision="fast", row_scale=1 / x.norm(dim=1))
    with pytest.raises(ValueError, match="both sums and counts"):
        assign(x, c, precision="fast", sums=torch.zeros(5, 12, device=DEVICE))


@pytest.mark.skipif(not ON_GPU, reason="large shapes need a GPU")
def test_large_shape_on_gpu():
    n, d, k = 3_000_017, 96, 1000
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, d, device="cuda", generator=g)
    c = torch.randn(k, d, device="cuda", generator=g)
    out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1))
    rows = torch.randint(0, n, (20_000,), device="cuda", generator=g)
    _check_labels(x[rows], c, out.labels[rows], "exact")


@pytest.mark.parametrize("d,k,tf32x3", [(12, 64, True), (32, 7, True), (12, 65, True), (17, 128, True), (12, 129, False),
                                         (33, 7, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_exact_mode_is_all_3xtf32_for_short_rows_and_few_clusters(d, k, tf32x3, dtype):
    """Where keeping the best two costs more than tripling the products (``exact_as_tf32x3``), the
    exact mode searches every row with 3xTF32: nothing deferred, the same labels as the tf32x3 mode,
    and float64's labels outside fp32 near-ties. 16-bit rows too (exact in tf32; bf16 on GPUs in
    ``test_bfloat16_exact_pass_at_default_configs``). The bounds engine's passes (``lower_bounds``)
    keep the best two."""
    from torchkm._kernels.assign import AssignPass
    from torchkm._kernels.configs import exact_as_tf32x3

    for of in (torch.float32, torch.float16, torch.bfloat16):
        assert exact_as_tf32x3(k, d, of) is tf32x3
    n = 301
    x, c = _data(n, d, k, seed=d + k, dtype=dtype)
    out = assign(x, c, precision="exact", raw_norms=x.float().norm(dim=1))
    _check_labels(x.float(), c, out.labels, "exact")
    assert AssignPass(x, k, "exact", update=False).precision == ("tf32x3" if tf32x3 else "exact")
    assert AssignPass(x, k, "exact", update=False, lower_bounds=True).precision == "exact"
    if tf32x3:
        assert int(out.rechecked) == 0
        assert torch.equal(out.labels, assign(x, c, precision="tf32x3").labels)


@pytest.mark.skipif(not ON_GPU, reason="default tile configs at benchmark sizes need a GPU")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("n,d,k", [(245_760, 32, 32), (245_760, 32, 64), (1_000_003, 24, 48), (245_760, 32, 128),
                                   (100_003, 17, 80), (245_760, 32, 1024), (100_003, 2, 32), (100_003, 4, 40),
                                   (100_003, 1, 7), (50_000, 128, 500)])
def test_fused_counts_and_sums_at_default_configs(precision, n, d, k):
    g = torch.Generator(device="cuda").manual_seed(n + d + k)
    x = torch.randn(n, d, device="cuda", generator=g)
    c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].clone()
    labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")
    sums = torch.zeros(k, d, device="cuda")
    counts = torch.zeros(k, device="cuda")
    assign(x, c, precision=precision, raw_norms=x.norm(dim=1), labels=labels, sums=sums, counts=counts, store_sq_dist=False)
    assert int(labels.min()) >= 0
    rows = torch.randint(0, n, (2_000,), device="cuda", generator=g)
    _check_labels(x[rows], c, labels[rows], precision)
    ref_counts = torch.bincount(labels, minlength=k).float()
    assert torch.equal(counts, ref_counts), f"{int((counts != ref_counts).sum())} clusters, total {float(counts.sum())} vs {n}"
    torch.testing.assert_close(sums, torch.zeros_like(sums).index_add_(0, labels, x), rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not ON_GPU, reason="default tile configs at benchmark sizes need a GPU")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d,k", [(40, 7), (64, 33), (64, 48), (64, 64), (96, 48), (128, 64)])
def test_fused_sums_of_half_precision_rows_at_default_configs(precision, dtype, d, k):
    """bf16 / fp16 rows of 33-128 features and at most 64 clusters: the one-hot sums carried
    across a program's tiles (<= 64 features) or added tile by tile (wider rows), against float64
    sums by the pass's own labels. (A one-hot partial per tile at 64 features, fast half-precision
    launches, once returned NaN sums on an H100 with right labels: BENCHMARKS.md, 2026-12-06.)"""
    n = 24_577
    g = torch.Generator(device="cuda").manual_seed(d * 100 + k)
    centres = torch.rand(k, d, device="cuda", generator=g)
    x = (centres[torch.arange(n, device="cuda") % k] + 0.2 * torch.randn(n, d, device="cuda", generator=g)).to(dtype)
    c = x[:k].float()
    labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")
    sums = torch.full((k, d), float("nan"), device="cuda").zero_()
    counts = torch.zeros(k, device="cuda")
    assign(x, c, precision=precision, labels=labels, sums=sums, counts=counts, store_sq_dist=False)
    assert int(labels.min()) >= 0 and int(labels.max()) < k
    x64 = x.double()
    ref_sums = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, labels, x64)
    assert torch.equal(counts.double(), torch.bincount(labels, minlength=k).double())
    assert bool(torch.isfinite(sums).all())
    assert float((sums.double() - ref_sums).abs().max()) <= 1e-5 * max(1.0, float(ref_sums.abs().max()))


@pytest.mark.skipif(not ON_GPU, reason="millions of rows a cluster chain need a GPU")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_atomic_sums_of_many_rows_a_cluster_stay_near_float64(precision, dtype):
    """k > 64: each row adds its features by atomics, so a cluster's sum is a chain of n / k fp32
    additions. 16-bit rows less an fp32 offset (a fit's centred rows) all carry the offset's low
    bits, and one chain of 30,000 was 7.8e-4 (relative) off float64; the copies of
    ``configs.atomic_replicas`` shorten the chains (3.3e-5 on an H200)."""
    n, d, k = 3_932_160, 32, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
    offset = x.float().mean(0)
    c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float() - offset
    labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")
    sums = torch.zeros(k, d, device="cuda")
    counts = torch.zeros(k, device="cuda")
    assign(x, c, precision=precision, offset=offset, raw_norms=x.float().norm(dim=1), labels=labels, sums=sums,
           counts=counts)
    ref = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, labels, x.double() - offset.double())
    assert torch.equal(counts, torch.bincount(labels, minlength=k).float())
    assert float((sums.double() - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.skipif(not ON_GPU, reason="default tile configs at benchmark sizes need a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,d,k", [(245_760, 32, 1024), (50_000, 128, 500), (20_000, 256, 300)])
def test_half_precision_fast_pass_at_default_configs(dtype, n, d, k):
    """The default tiles of 2-byte inputs (the transposed search where the row fits one chunk)."""
    g = torch.Generator(device="cuda").manual_seed(n + d + k)
    x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
    c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float()
    labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")
    out = assign(x, c, precision="fast", labels=labels, raw_norms=x.float().norm(dim=1))
    assert int(labels.min()) >= 0
    rows = torch.randint(0, n, (2_000,), device="cuda", generator=g)
    _check_labels(x[rows].float(), c, labels[rows], "fast", input_dtype=dtype)
    direct = ((x.float() - c[labels]) ** 2).sum(1)
    torch.testing.assert_close(out.sq_dist, direct, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not ON_GPU, reason="default tile configs at benchmark sizes need a GPU")
@pytest.mark.parametrize("n,d,k", [(245_760, 32, 32), (245_760, 32, 1024), (50_000, 17, 300), (50_000, 128, 500),
                                   (30_000, 200, 700)])
def test_bfloat16_exact_pass_at_default_configs(n, d, k):
    """bf16 rows, exact mode (one bf16 product under the distance bound; every row with 3xTF32 at 32
    features and 32 clusters; the tl.dot search's packed keys at 32 features and 1024 clusters; on a
    Hopper GPU its search at 128 and 200):
    labels of the fp32 computation on the bf16 values, and sums equal to those labels' sums."""
    g = torch.Generator(device="cuda").manual_seed(n + d + k)
    x = torch.randn(n, d, device="cuda", generator=g).bfloat16()
    c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float()
    labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")
    sums = torch.zeros(k, d, device="cuda")
    counts = torch.zeros(k, device="cuda")
    assign(x, c, precision="exact", labels=labels, raw_norms=x.float().norm(dim=1), sums=sums, counts=counts,
           store_sq_dist=False)
    assert int(labels.min()) >= 0
    rows = torch.randint(0, n, (2_000,), device="cuda", generator=g)
    _check_labels(x[rows].float(), c, labels[rows], "exact")
    assert torch.equal(counts, torch.bincount(labels, minlength=k).float())
    torch.testing.assert_close(sums, torch.zeros_like(sums).index_add_(0, labels, x.float()), rtol=1e-4, atol=1e-3)


def test_round_to_tf32_is_exact_in_tf32_and_within_half_an_ulp():
    from torchkm._kernels.centroids import round_to_tf32

    values = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * torch.logspace(-20, 20, 10_000)
    rounded = round_to_tf32(values)
    assert (rounded.view(torch.int32) & 0x1FFF == 0).all()  # 10 explicit mantissa bits left
    assert ((rounded - values).abs() <= values.abs() * 2.0**-11).all()
    assert torch.equal(round_to_tf32(rounded), rounded)


@pytest.mark.parametrize("search", ["eager", "swap"])
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("d", [3, 19])
def test_no_launch_passes_one_tensor_for_two_pointer_arguments(monkeypatch, d, precision, search):
    """Under torch.compile, Inductor clones each argument a kernel may write; a tensor passed for two
    arguments gets two clones, and the one copied back last can undo the kernel's writes. So no
    launch of the pass (preparation, search, re-search, small-d kernel) passes a tensor twice. (The
    fit loop, which nothing compiles, does pass one label buffer as ``labels`` and ``prev_labels``.)"""
    import torchkm._kernels.assign as assign_module
    import torchkm._kernels.centroids as centroids_module

    launches = []

    def recording_launcher(kernel):
        class Recording:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                    launches.append([t.data_ptr() for t in tensors])
                    return kernel[grid](*args, **kwargs)
                return launch
        return Recording()

    monkeypatch.setattr(assign_module, "launcher", recording_launcher)
    monkeypatch.setattr(centroids_module, "launcher", recording_launcher)
    # The exact mode's best-two search and re-search (not all 3xTF32, which 72 clusters of short
    # rows would take: ``exact_as_tf32x3``).
    monkeypatch.setenv("TORCHKM_EXACT_X3", "0")
    k = 72
    x, c = _data(300, d, k, 5)
    x[:40] = (c[0::2][:20].repeat(2, 1) + c[1::2][:20].repeat(2, 1)) / 2  # ties: the exact mode re-searches
    prev = torch.zeros(300, dtype=torch.int64, device=DEVICE)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    norms = x.norm(dim=1)
    out = assign(x, c, precision=precision, raw_norms=norms, config=_search_config(search, d), prev_labels=prev,
                 sums=sums, counts=counts)
    _check_labels(x, c, out.labels, precision)
    # (the maxima for fp16 operands,) preparation, search(, re-search)
    half = search == "eager" and d > SMALL_TILES["BLOCK_D"]
    assert len(launches) == (2 if d == 3 or precision == "fast" else 3) + 2 * half  # (and the fp16 copy)
    for ptrs in launches:
        assert len(set(ptrs)) == len(ptrs), "a tensor passed for two pointer arguments of one launch"


def test_assign_reuses_its_pass_for_calls_of_one_shape(monkeypatch):
    """``assign`` keeps the pass of a shape (host time of small passes) and its results equal a new
    pass's: other rows and centroids, sums, the re-searched count handed out as a copy. Another
    shape, another ``TORCHKM_*`` setting, a given config, another thread or
    ``TORCHKM_REUSE_PASSES=0`` build a new one."""
    from torchkm._kernels import assign as assign_module

    built = []
    real_pass = assign_module.AssignPass
    monkeypatch.setattr(assign_module, "AssignPass", lambda *args, **kwargs: built.append(args[0].shape) or real_pass(*args, **kwargs))
    assign_module.clear_reused_passes()
    n, d, k = 97, 17, 7

    def call(seed, rows=n, **kwargs):
        x, c = _data(rows, d, k, seed=seed)
        sums = torch.zeros(k, d, device=DEVICE)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, raw_norms=x.norm(dim=1), prev_labels=torch.zeros(rows, dtype=torch.int64, device=DEVICE),
                     sums=sums, counts=counts, **kwargs)
        return out, sums, counts

    first = call(1)
    assert len(built) == 1
    kept = assign_module._reused_passes()
    (held,) = kept.values()
    assert first[0].rechecked.data_ptr() != held.run.flag_count.data_ptr()
    first_rechecked = int(first[0].rechecked)
    second = call(2)
    assert len(built) == 1 and list(kept.values()) == [held]
    assert int(first[0].rechecked) == first_rechecked
    monkeypatch.setenv("TORCHKM_REUSE_PASSES", "0")
    fresh = call(2)
    assert len(built) == 2
    for got, want in zip((*second[0], *second[1:]), (*fresh[0], *fresh[1:])):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)  # (sums: atomics)
    monkeypatch.delenv("TORCHKM_REUSE_PASSES")

    call(3, rows=n + 1)
    assert len(built) == 3
    call(4, config=SMALL_TILES)
    assert len(built) == 4
    monkeypatch.setenv("TORCHKM_HALF_OPERANDS", "0")
    call(5)
    assert len(built) == 5
    monkeypatch.delenv("TORCHKM_HALF_OPERANDS")
    call(6)
    assert len(built) == 5
    thread = threading.Thread(target=call, args=(7,))
    thread.start()
    thread.join()
    assert len(built) == 6
    for rows in range(n + 2, n + 2 + assign_module.REUSED_PASSES):
        call(8, rows=rows)
    assert len(kept) == assign_module.REUSED_PASSES and held not in kept.values()
    assign_module.clear_reused_passes()
    assert not kept


def test_clearing_all_threads_reused_passes_reaches_a_live_thread():
    from torchkm._kernels import assign as assign_module

    called, cleared = threading.Event(), threading.Event()
    seen = {}

    def worker():
        x, c = _data(33, 5, 3, seed=0)
        assign(x, c, raw_norms=x.norm(dim=1))
        seen["before"] = len(assign_module._reused_passes())
        called.set()
        cleared.wait(timeout=60)
        seen["after"] = len(assign_module._reused_passes())

    thread = threading.Thread(target=worker)
    thread.start()
    assert called.wait(timeout=600)
    x, c = _data(34, 5, 3, seed=1)
    assign(x, c, raw_norms=x.norm(dim=1))
    assign_module.clear_reused_passes(all_threads=True)
    assert not assign_module._reused_passes()
    cleared.set()
    thread.join()
    assert seen == {"before": 1, "after": 0}


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs")
@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize(("n", "d", "k", "dtype"), [(4099, 64, 512, torch.float32), (32_768, 256, 8192, torch.float32),
                                                    (10_001, 40, 1000, torch.bfloat16), (5000, 3, 40, torch.float32)])
def test_assign_replays_queries_as_cuda_graphs(monkeypatch, precision, n, d, k, dtype):
    """From a shape's second call on, a query (no previous labels, weights or label buffer) is a
    replayed CUDA graph: fresh rows and centroids each call, the graph's outputs poisoned before
    it runs; labels, distances, sums, counts and the re-searched count equal a new pass's
    (``TORCHKM_REUSE_PASSES=0``), and the handed-out tensors are not the graph's."""
    from torchkm._kernels import assign as assign_module

    assign_module.clear_reused_passes()
    g = torch.Generator(device="cuda").manual_seed(n + d + k)

    def call(x, c):
        sums = torch.zeros(k, d, device="cuda")
        counts = torch.zeros(k, device="cuda")
        out = assign(x, c, precision=precision, raw_norms=x.float().norm(dim=1), offset=c.mean(0), sums=sums, counts=counts)
        return out, sums, counts

    for step in range(4):
        x = (torch.randn(n, d, device="cuda", generator=g) * 3).to(dtype)
        c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float() + 0.01
        kept = assign_module._reused_passes()
        for held in kept.values():
            if held.replayed.graph is not None:
                held.replayed.outputs[0].fill_(-7)
                held.replayed.outputs[1].fill_(float("nan"))
        got = call(x, c)
        (held,) = kept.values()
        assert (held.replayed.graph is not None) == (step >= 1)
        if held.replayed.graph is not None:
            assert got[0].labels.data_ptr() != held.replayed.outputs[0].data_ptr()
        monkeypatch.setenv("TORCHKM_REUSE_PASSES", "0")
        want = call(x, c)
        monkeypatch.delenv("TORCHKM_REUSE_PASSES")
        assert int(got[0].labels.min()) >= 0
        assert torch.equal(got[0].labels, want[0].labels)
        assert torch.equal(got[0].sq_dist, want[0].sq_dist)
        assert int(got[0].rechecked) == int(want[0].rechecked)
        assert torch.equal(got[2], want[2])
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-3)  # (atomics)
        torch.testing.assert_close(got[0].inertia, want[0].inertia, rtol=1e-5, atol=1e-3)
    # Rows not 16-byte aligned: the pass runs eagerly.
    rows = torch.randn(n * d + 1, device="cuda", generator=g)[1:].view(n, d).to(dtype)
    if rows.data_ptr() % 16:
        for _ in range(2):
            call(rows, c)
        assert list(assign_module._reused_passes().values())[-1].replayed.graph is None  # (the last used)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs")
def test_aliased_replayed_call_reads_inputs_in_place_at_their_address_only():
    call = ReplayedCall(aliased=True)
    a = torch.arange(6.0, device="cuda")
    out = call(lambda inputs: inputs["v"] * 2, {"v": a}, a.device)
    assert torch.equal(out, a * 2) and not call.static  # no copy of the inputs kept
    a.add_(1)
    assert torch.equal(call(lambda inputs: inputs["v"] * 2, {"v": a}, a.device), a * 2)  # read in place
    assert call(lambda inputs: inputs["v"] * 2, {"v": a.clone()}, a.device) is None  # elsewhere: not served


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("offset", [False, True])
def test_packed_lazy_keys_keep_the_labels_and_the_lowest_index_on_ties(monkeypatch, precision, offset):
    """The lazy search with the tile's number in the scores' low bits (``TORCHKM_LAZY_KEYS=1``:
    from 2 tiles) against the compare-and-select one: the exact mode's labels equal, the fast
    mode's within its bound; exact duplicates of a centroid in the same slot of later tiles (and in
    other slots) keep the lowest index, for rows far from the origin too (raw rows multiplied)."""
    n, d, k = 150, 17, 70  # 5 centroid tiles of 16
    x, c = _data(n, d, k, seed=21)
    x = x + 40.0  # uncentred rows: the products' rounding is relative to the raw rows
    c = c + 40.0
    c[2] = c[18] = c[50] = x[0]  # slot 2 of tiles 0, 1 and 3
    c[5] = c[37] = x[1]
    mean = x.mean(0) if offset else None
    cs = c - mean if offset else c
    xs = x - mean if offset else x
    # The whole row in one feature chunk: packed keys need it (``AssignPass._lazy_bits``).
    config = {**_search_config("lazy", d), "BLOCK_D": 32}
    got = {}
    for lazy in ("0", "1"):
        monkeypatch.setenv("TORCHKM_LAZY_KEYS", lazy)
        out = assign(x, cs, precision=precision, offset=mean, raw_norms=x.norm(dim=1), config=config)
        assert int(out.labels[0]) == 2 and int(out.labels[1]) == 5
        _check_labels(xs, cs, out.labels, precision)
        got[lazy] = out.labels.cpu()
    if precision == "exact":
        assert torch.equal(got["0"], got["1"])


def _record_assign_launches(monkeypatch, what) -> list:
    """A list that gets ``what(kwargs)`` of every ``_assign_kernel`` launch from now on."""
    import torchkm._kernels.assign as assign_module

    launches = []
    real = assign_module.launcher

    def recording(kernel):
        launch = real(kernel)

        class Grid:
            def __getitem__(self, grid):
                def call(*args, **kwargs):
                    if kernel is assign_module._assign_kernel:
                        launches.append(what(kwargs))
                    return launch[grid](*args, **kwargs)
                return call
        return Grid()

    monkeypatch.setattr(assign_module, "launcher", recording)
    return launches


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_packed_lazy_search_launches_with_its_register_cap(monkeypatch, precision):
    """The packed lazy search is launched with ``configs.lazy_register_cap``'s ``maxnreg`` (fp32 rows:
    80 exact, 128 fast), and gives the same labels as uncapped; the compare-and-select search
    (``TORCHKM_LAZY_KEYS=0``) is launched uncapped."""
    launches = _record_assign_launches(monkeypatch, lambda kwargs: (kwargs.get("LAZY_BITS", 0), kwargs.get("maxnreg")))
    n, d, k = 150, 17, 140  # k > 128: the best-two search (not all 3xTF32)
    x, c = _data(n, d, k, seed=31)
    got = {}
    for lazy in ("1", "0"):
        monkeypatch.setenv("TORCHKM_LAZY_KEYS", lazy)
        launches.clear()
        got[lazy] = assign(x, c, precision=precision, raw_norms=x.norm(dim=1),
                           config={**_search_config("lazy", d), "BLOCK_D": 32}).labels.cpu()
        searches = [launch for launch in launches if launch[0]]
        if lazy == "1":
            assert searches and all(cap == (80 if precision == "exact" else 128) for _, cap in searches)
        else:
            assert not searches and all(cap is None for _, cap in launches)
    _check_labels(x, c, got["1"].to(x.device), precision)
    if precision == "exact":
        assert torch.equal(got["0"], got["1"])


@pytest.mark.parametrize("setting", ["auto", "distance", "gap"])
def test_exact_bound_switch_for_short_fp32_rows(monkeypatch, setting):
    """fp32 rows of at most 32 features take the gap bound unless ``TORCHKM_EXACT_BOUND=distance``
    (which only experiments set); scaled (cosine) rows take it whatever the switch. Either bound
    gives the float64 labels, through the packed lazy search (k = 1,024, whole tiles)."""
    from torchkm._kernels.assign import AssignPass

    monkeypatch.setenv("TORCHKM_EXACT_BOUND", setting)
    n, d, k = 97, 32, 1024
    x, c = _data(n, d, k, seed=41)
    p = AssignPass(x, k, "exact", update=False)
    assert bool(p._bound_arguments(torch.float32, d, False)["DISTANCE_BOUND"]) == (setting == "distance")
    assert not p._bound_arguments(torch.float32, d, True)["DISTANCE_BOUND"]
    assert bool(p._bound_arguments(torch.float32, 33, False)["DISTANCE_BOUND"]) == (setting != "gap")
    out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1))
    _check_labels(x, c, out.labels, "exact")


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("d,k", [(17, 7), (32, 32)])
def test_carried_pass_loads_each_tile_ahead(monkeypatch, precision, d, k):
    """Few clusters over whole rows (carried sums): each persistent program loads its next tile of
    rows (and with ``2`` its previous labels and weights) while it searches the current one, and
    takes the rows' distances and sums from that tile.
    Same labels and changed count as the pass that reads the rows itself (``TORCHKM_CARRY_PREFETCH=0``),
    and its sums, counts and distances but for rounding, on weighted, centred rows with previous
    labels, whose last tile is partial and whose programs walk several tiles (300 rows: 10 tiles
    over 4 programs under the interpreter)."""
    launches = _record_assign_launches(monkeypatch, lambda kwargs: kwargs["PREFETCH"])
    n = 300
    x, c = _data(n, d, k, seed=53)
    g = torch.Generator().manual_seed(54)
    w = torch.rand(n, generator=g).to(DEVICE)
    offset = torch.randn(d, generator=g).to(DEVICE)
    prev = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    got = {}
    for setting in ("2", "1", "0"):
        monkeypatch.setenv("TORCHKM_CARRY_PREFETCH", setting)
        launches.clear()
        sums = torch.zeros(k, d, device=DEVICE)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, precision=precision, offset=offset, raw_norms=x.norm(dim=1), sample_weight=w,
                     prev_labels=prev, sums=sums, counts=counts, config=_search_config("lazy1", d))
        assert launches == [int(setting)]
        got[setting] = (out.labels.cpu(), sums.cpu(), counts.cpu(), out.sq_dist.cpu(), int(out.changed),
                        float(out.inertia))
    _check_labels(x - offset, c, got["0"][0].to(DEVICE), precision)
    assert got["0"][4] == int((got["0"][0] != prev.cpu()).sum())
    assert got["0"][5] == pytest.approx(float((got["0"][3] * w.cpu()).sum()), rel=1e-5)
    ref_sums, ref_counts = update_reference(x, got["0"][0].to(DEVICE), k, sample_weight=w, offset=offset)
    torch.testing.assert_close(got["0"][1], ref_sums.cpu(), rtol=1e-5, atol=1e-5)
    for setting in ("2", "1"):
        labels, sums, counts, sq_dist, changed, inertia = got[setting]
        assert torch.equal(labels, got["0"][0])
        # (Loaded ahead, the programs carry their changed counts and inertia per row slot.)
        assert changed == got["0"][4]
        assert inertia == pytest.approx(got["0"][5], rel=1e-5)
        # (The programs' atomics add in any order, and a tile's distances may be summed in another.)
        torch.testing.assert_close(sums, got["0"][1], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(counts, got["0"][2], rtol=1e-6, atol=0)
        torch.testing.assert_close(sq_dist, got["0"][3], rtol=1e-6, atol=1e-6)


def test_carry_prefetch_rule(monkeypatch):
    """Rows, previous labels and weights are loaded ahead, but for the fast mode over fp32 rows
    (rows only, as measured); ``TORCHKM_CARRY_PREFETCH`` sets the level."""
    from torchkm._kernels.assign import _carry_prefetch

    monkeypatch.delenv("TORCHKM_CARRY_PREFETCH", raising=False)
    assert _carry_prefetch(False) == 2 and _carry_prefetch(True) == 1
    for setting in ("0", "1", "2"):
        monkeypatch.setenv("TORCHKM_CARRY_PREFETCH", setting)
        assert _carry_prefetch(False) == _carry_prefetch(True) == int(setting)


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_gpu_for_bf16)])
@pytest.mark.parametrize("d,k", [(16, 40), (24, 48), (32, 64)])
def test_up_to_64_centroids_over_short_rows_take_one_tile(precision, dtype, d, k):
    """33-64 centroids over rows of at most 32 features, at the default tiles: one tile of 64
    centroids but for the fast mode over padded features (d = 24 here). Labels equal float64's
    but for near-ties, and sums and counts those of the labels, on centred rows with previous
    labels. (On an H200 the fast mode over padded fp32 rows summed wrong, 3e-2 relative, with a
    64-centroid tile of four warps: ``configs.assign_config`` keeps it off that config.)"""
    from torchkm._kernels.configs import assign_config

    n = 3001 if ON_GPU else 200
    x, c = _data(n, d, k, seed=61 + d, dtype=dtype)
    g = torch.Generator().manual_seed(62)
    offset = (0.1 * torch.randn(d, generator=g)).to(DEVICE)
    prev = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    cfg = assign_config(n, k, d, dtype, precision)
    assert cfg["BLOCK_K"] == (32 if precision == "fast" and d == 24 else 64)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    out = assign(x, c, precision=precision, offset=offset, raw_norms=x.float().norm(dim=1), prev_labels=prev,
                 sums=sums, counts=counts)
    _check_labels(x.float() - offset, c, out.labels, precision, input_dtype=dtype)
    assert int(out.changed) == int((out.labels != prev).sum())
    ref_sums, ref_counts = update_reference(x.float(), out.labels, k, offset=offset)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(counts, ref_counts, rtol=0, atol=0)


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("d,k", [(17, 7), (17, 16), (32, 7), (32, 16), (40, 7)])
def test_one_centroid_tile_keeps_the_result(monkeypatch, precision, d, k):
    """Where every centroid fits the first tile, the lazy search takes the tile's scores as the best
    without a running minimum (the default; ``TORCHKM_ONE_TILE=0`` turns it off). Same labels,
    changed count, sums and distances as without (d = 17: the exact mode's 3xTF32 products; d = 40: its best two and the
    re-check; k = 16: the tile exactly full, with d = 32 whole tiles of whole rows, unmasked, the
    tile kept by each persistent program), and only where the centroids fit one tile (and not
    for the fast mode over padded features, d = 17 and 40 here, measured slower)."""
    launches = _record_assign_launches(monkeypatch,
                                       lambda kwargs: (kwargs["ONE_TILE"], kwargs["PREFETCH"], kwargs["ONE_CHUNK"]))
    n = 300
    x, c = _data(n, d, k, seed=59)
    g = torch.Generator().manual_seed(60)
    offset = torch.randn(d, generator=g).to(DEVICE)
    prev = torch.randint(0, k, (n,), generator=g).to(DEVICE)
    config = {**SMALL_TILES, "EAGER": False, "BLOCK_D": max(16, 1 << (d - 1).bit_length())}
    got = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("TORCHKM_ONE_TILE", setting)
        launches.clear()
        sums = torch.zeros(k, d, device=DEVICE)
        counts = torch.zeros(k, device=DEVICE)
        out = assign(x, c, precision=precision, offset=offset, raw_norms=x.norm(dim=1), prev_labels=prev,
                     sums=sums, counts=counts, config=config)
        padded_fast = precision == "fast" and d < config["BLOCK_D"]
        assert launches[0][0] == (setting == "1" and k <= config["BLOCK_K"] and not padded_fast)
        if (d, k) == (32, 16):
            assert launches[0][1] > 0 and launches[0][2] == 2  # rows loaded ahead, whole tiles
        got[setting] = (out.labels.cpu(), sums.cpu(), counts.cpu(), out.sq_dist.cpu(), int(out.changed))
    _check_labels(x - offset, c, got["0"][0].to(DEVICE), precision)
    assert torch.equal(got["1"][0], got["0"][0]) and got["1"][4] == got["0"][4]
    torch.testing.assert_close(got["1"][1], got["0"][1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got["1"][2], got["0"][2], rtol=0, atol=0)
    torch.testing.assert_close(got["1"][3], got["0"][3], rtol=1e-6, atol=1e-6)


# The searches of the tie tests at each shape: at 769 features only those that stream features in
# chunks (a whole-row search there needs 264-320 KiB of shared memory on an H100; no config of the
# library takes one at that width).
TIE_SEARCHES = [(d, k, search) for d, k in [(17, 1000), (33, 7), (33, 1000), (129, 7), (769, 7)]
                for search in ["lazy", "lazy1", "eager", "swap"] if d < 769 or search in ("lazy", "eager")]


@pytest.mark.parametrize("d, k, search", TIE_SEARCHES)
def test_exact_mode_settles_fp32_ties_by_float64_distances(d, k, search):
    """Rows whose best two direct fp32 distances lie within fp32 rounding take the float64 argmin
    of the fp32 values (lowest index on equal ones), whatever order the kernel sums features in:
    one label for every search, epilogue width and tile shape. (Without the float64 sweep, a
    third to half of these rows went the other way in some search.) At 769 features the window of
    ``_common.fp32_tie``, taken from the epilogue's chunked sums, is about a tenth of d's: such rows
    must still fall inside it."""
    n = 203
    x, c = fp32_tie_rows(n, d, k, seed=d * 1000 + k, device=DEVICE)
    dist = ((x.double().cpu()[:, None, :] - c.double().cpu()[None]) ** 2).sum(-1)
    expected = dist.argmin(1)
    top2 = dist.topk(2, dim=1, largest=False).values
    # The data is what it says: fp32 cannot order these pairs, and every row has one.
    assert ((top2[:, 1] - top2[:, 0]) / top2[:, 0] < 1e-7).float().mean() > 0.9
    for cfg in ({**_search_config(search, d)}, {**_search_config(search, d), "BLOCK_N": 64, "num_warps": 2}):
        out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1), config=cfg)
        assert torch.equal(out.labels.cpu().long(), expected), cfg


@pytest.mark.parametrize("d, k, search", [case for case in TIE_SEARCHES if case[:2] in ((33, 7), (769, 7))])
def test_exact_mode_settles_a_few_fp32_tie_rows_one_at_a_time(d, k, search):
    """Where rows stream in chunks of features ("lazy" and "eager" here), a tile with only a few
    tied rows settles them one row at a time (``_common.TIE_ROW_D`` features a step), not by the
    tile-wide sweep that the test above mostly takes (and whole-row searches, "lazy1" and "swap",
    always take): the same float64 labels. Every 29th row is on a tie; the others sit on a
    centroid, with a clear winner."""
    n = 203
    x, c = fp32_tie_rows(n, d, k, seed=d * 1000 + k + 2, device=DEVICE)
    g = torch.Generator().manual_seed(d + k)
    plain = torch.arange(n) % 29 != 3
    x[plain.to(DEVICE)] = c[torch.randint(k, (int(plain.sum()),), generator=g).to(DEVICE)]
    dist = ((x.double().cpu()[:, None, :] - c.double().cpu()[None]) ** 2).sum(-1)
    top2 = dist.topk(2, dim=1, largest=False).values
    assert ((top2[~plain, 1] - top2[~plain, 0]) / top2[~plain, 0] < 1e-7).all()
    for cfg in ({**_search_config(search, d)}, {**_search_config(search, d), "BLOCK_N": 64, "num_warps": 2}):
        out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1), config=cfg)
        assert torch.equal(out.labels.cpu().long(), dist.argmin(1)), cfg


@pytest.mark.parametrize("d, k", [(40, 7), (64, 16), (64, 48)])
def test_exact_mode_settles_fp32_ties_while_carrying_sums(monkeypatch, d, k):
    """The tie rows above through the pass fits run at up to 64 clusters of 33-64 features: the
    exact search, its float64 tie settling, and the rows added into sums carried through a one-hot
    product. Labels and sums against float64. (On sm_90, Triton 3.6 gives these launches less
    shared memory with the tie code than without, as it gave the bounds engine's row-list launch
    whose one-hot product compute-sanitizer caught reading outside its shared memory; on an H100
    these pass, also under memcheck: BENCHMARKS.md, 2026-12-06.)"""
    launches = _record_assign_launches(monkeypatch, lambda kwargs: kwargs["UPDATE"])
    n = 24_576 if ON_GPU else 203
    x, c = fp32_tie_rows(n, d, k, seed=d * 1000 + k + 1, device=DEVICE)
    expected = ((x.double().cpu()[:, None, :] - c.double().cpu()[None]) ** 2).sum(-1).argmin(1)
    sums = torch.zeros(k, d, device=DEVICE)
    counts = torch.zeros(k, device=DEVICE)
    out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1), sums=sums, counts=counts,
                 prev_labels=torch.zeros(n, dtype=torch.int64, device=DEVICE))
    assert UPDATE_CARRY in launches
    assert torch.equal(out.labels.cpu().long(), expected)
    ref_sums, ref_counts = update_reference(x, out.labels, k)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(counts, ref_counts, rtol=0, atol=0)


X3_TIES_ON = pytest.mark.skipif(not NEAR_SCORE_TIES, reason=(
    "TORCHKM_X3_TIES=1 is read at import: run in a process of its own by "
    "test_near_scores_settle_in_a_process_with_x3_ties_on"))


@X3_TIES_ON
@pytest.mark.parametrize("centroids", ["pairs", "duplicates"])
@pytest.mark.parametrize("d, k", [(17, 7), (17, 70), (32, 40), (20, 128)])
def test_exact_3xtf32_search_settles_near_scores_by_direct_distances(d, k, centroids):
    """At most 32 features and 128 clusters the exact mode scores every row in 3xTF32 products
    (``configs.exact_as_tf32x3``), with no best two to compare directly. With ``TORCHKM_X3_TIES=1``
    rows whose lowest score has others within the scores' rounding are settled by direct distances
    there (float64 on fp32 ties), so they take the float64 argmin of the fp32 values as every other
    route does. Pairs: two near centroids a row (``fp32_tie_rows``); duplicates: the first pair's
    second centroid twice, so its rows have three near scores (every centroid compared), lower
    index on equal. (Without the setting a third to half of these rows went the other way.)"""
    n = 203
    x, c = fp32_tie_rows(n, d, k, seed=d * 1000 + k + 1, device=DEVICE)
    if centroids == "duplicates":
        c[k - 1] = c[1]
    # (Centred rows: the kernel reads fl(x - offset), the centroids come in that space.)
    offset = x.mean(0) if k == 70 else None
    xt = x if offset is None else x - offset
    if offset is not None:
        c = c - offset
    dist = ((xt.double().cpu()[:, None, :] - c.double().cpu()[None]) ** 2).sum(-1)
    expected = dist.argmin(1)
    top2 = dist.topk(2, dim=1, largest=False).values
    # (centring rounds the rows by about 1e-7 of their size: still inside the 3xTF32 scores' rounding)
    assert ((top2[:, 1] - top2[:, 0]) / top2[:, 0] < (1e-7 if offset is None else 1e-6)).float().mean() > 0.9
    if centroids == "duplicates":
        assert (expected == 1).any() and not (expected == k - 1).any()
    got = assign(x, c, precision="exact", raw_norms=x.norm(dim=1),
                 **({} if offset is None else {"offset": offset}))
    assert torch.equal(got.labels.cpu().long(), expected)


def test_near_scores_settle_in_a_process_with_x3_ties_on():
    """The near-score tests (the kernel's above, and dense against pruned fits at 17 x 70 and 32 x
    100 in tests/test_pruned.py) in a process with ``TORCHKM_X3_TIES=1``, which the kernels read
    at import."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/kernels/test_assign.py::test_exact_3xtf32_search_settles_near_scores_by_direct_distances",
         "tests/test_pruned.py::test_dense_and_pruned_fits_settle_fp32_ties_alike"],
        cwd=root, env={**os.environ, "TORCHKM_X3_TIES": "1"}, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "11 passed" in out.stdout, out.stdout[-2000:]


@pytest.mark.parametrize("search", ["lazy", "eager"])
def test_candidate_re_search_settles_fp32_ties_by_float64_distances(monkeypatch, search):
    """Rows within fp32 rounding of three centroids (a tie pair and a third next to the second)
    under the distance bound (d = 40) with a split re-search (k = 1000): the lazy search compares
    the third in its epilogue, the eager one defers the rows to the candidate re-search, which
    compares its candidates directly. Both give every row the float64 argmin. (On Hopper GPUs the
    Hopper search, which names a third candidate, takes these rows: its epilogue settles most of
    them, and the few it defers go to the candidate re-search; H100, 2026-12-05: 4 of 150.)"""
    monkeypatch.setenv("TORCHKM_RESEARCH_CANDIDATES", "1")
    n, d, k = 150, 40, 1000
    x, c = fp32_tie_rows(n, d, 600, seed=40, device=DEVICE)
    c = c.double().cpu()
    pair_b = c[1::2]
    gap = pair_b - c[0::2]
    third = pair_b + (1e-6 / gap.norm(dim=1, keepdim=True)) * gap  # just past b, on the pair's line
    far = 10.0 * torch.randn(k - 900, d, generator=torch.Generator().manual_seed(41), dtype=torch.float64) + 100.0
    c = torch.cat([c, third, far]).float().to(DEVICE)
    dist = ((x.double().cpu()[:, None, :] - c.double().cpu()[None]) ** 2).sum(-1)
    expected = dist.argmin(1)
    top3 = dist.topk(3, dim=1, largest=False).values
    # (the third's fp32 rounding moves it by about 1e-6; fp32 distances of 40 features round by up to 5e-6)
    assert ((top3[:, 2] - top3[:, 0]) / top3[:, 0] < 5e-6).float().mean() > 0.9
    launched = _launched(monkeypatch)
    cfg = {"EAGER": search == "eager"}
    from torchkm._kernels.configs import assign_config

    out = assign(x, c, precision="exact", raw_norms=x.norm(dim=1),
                 config={**assign_config(n, k, d, torch.float32, "exact"), **cfg})
    assert torch.equal(out.labels.cpu().long(), expected)
    if search == "eager":
        assert "_candidate_exact_kernel" in launched
        assert ON_GPU or int(out.rechecked) > n // 2
