"""The launch tables' rules that do not need a kernel to check."""

from __future__ import annotations

import pytest
import torch
from torchkm._kernels.configs import (
    CANDIDATE_CHUNKS,
    assign_config,
    atomic_replicas,
    candidate_chunks,
    candidate_exact_config,
    exact_as_tf32x3,
    lazy_register_cap,
    tf32x3_rows_config,
)


@pytest.mark.parametrize("k", [1, 2, 100, 128, 129, 1000, 4096, 8192, 8193, 65_536, 1_000_000])
def test_candidate_chunks_cover_the_centroids_in_whole_tiles(k):
    """The unlisted candidate launch's chunks: at most CANDIDATE_CHUNKS of them, each the fewest whole
    128-centroid tiles that allows (a program's work is its chunk), covering every centroid with
    none left empty."""
    chunk, chunks = candidate_chunks(k)
    tiles = -(-k // 128)
    assert chunk == 128 * -(-tiles // CANDIDATE_CHUNKS) and 1 <= chunks <= CANDIDATE_CHUNKS
    assert (chunks - 1) * chunk < k <= chunks * chunk


def test_candidate_chunks_follow_the_switch(monkeypatch):
    monkeypatch.setenv("TORCHKM_CANDIDATE_CHUNKS", "16")
    assert candidate_chunks(8192) == (512, 16)


@pytest.mark.parametrize("d", [1, 3, 17, 32, 33, 129, 256, 768, 4096])
def test_candidate_exact_tiles_hold_sixteen_candidates_a_row(d):
    """The direct distances' tiles: over few rows, 4 rows with each row's features in steps of at
    least 32 and at most 128 (the whole row up to 128); otherwise 16 rows over 32 features. Either
    way at most 8,192 candidate elements a step (64 a thread in 4 warps)."""
    few = candidate_exact_config(d, few_rows=True)
    assert few["BLOCK_R"] == 4 and few["EPI_D"] == min(128, max(32, 1 << (d - 1).bit_length()))
    assert candidate_exact_config(d) == {"BLOCK_R": 16, "EPI_D": 32, "num_warps": 4}
    for cfg in (few, candidate_exact_config(d)):
        assert cfg["BLOCK_R"] * 16 * cfg["EPI_D"] <= 8192


def test_candidate_exact_tiles_follow_the_switch(monkeypatch):
    monkeypatch.setenv("TORCHKM_CANDIDATE_EXACT_CONFIG", "2,256,8")
    assert candidate_exact_config(300, few_rows=True) == {"BLOCK_R": 2, "EPI_D": 256, "num_warps": 8}


@pytest.mark.parametrize("k", [1, 7, 32, 64, 65, 1024])
@pytest.mark.parametrize("d", [9, 17, 32])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_short_rows_take_lazy_narrow_tiles_and_two_warps_over_few_centroids(k, d, dtype, precision):
    """Rows of at most 32 features: the whole row in one chunk, lazy minimum, at most 32 centroids a
    tile; over at most 32 centroids two warps (the one-hot sums weigh most there), over 33-64 one
    tile of 64 with four warps (two for the fast mode over 16-bit rows; not for the fast mode over
    padded features, which keeps the 32-centroid tiles), over row lists (the bounds engine) the
    four-warp tiles, so that whole tiles of whole rows (``_one_chunk`` 2) come from d = 32 and k a
    multiple of the tile."""
    import torch
    from torchkm._kernels.assign import _one_chunk

    dt = getattr(torch, dtype)
    cfg = assign_config(245_760, k, d, dt, precision)
    listed = assign_config(245_760, k, d, dt, precision, row_list=True)
    assert cfg["BLOCK_D"] == max(16, 1 << (d - 1).bit_length()) and not cfg["EAGER"] and not cfg["SWAP"]
    one_tile_64 = 32 < k <= 64 and (precision == "exact" or d == cfg["BLOCK_D"])
    assert cfg["BLOCK_K"] == (64 if one_tile_64 else min(32, max(16, 1 << (k - 1).bit_length())))
    assert listed["BLOCK_K"] <= 64 and listed["num_warps"] == 4
    if one_tile_64:
        assert cfg["num_warps"] == (2 if precision == "fast" and dtype == "bfloat16" else 4)
    else:
        assert cfg["num_warps"] == (2 if k <= 64 else 4)
    assert (_one_chunk(cfg, k, d) == 2) == (d == cfg["BLOCK_D"] and k % cfg["BLOCK_K"] == 0)
    if d == 32 and k in (32, 64, 1024):
        assert _one_chunk(cfg, k, d) == 2


def test_lazy_register_cap(monkeypatch):
    """The packed lazy search's register caps: 80 for the exact mode over fp32 rows, none over
    16-bit rows (not faster capped), 128 for the fast mode; the switch sets both, 0 for none."""
    monkeypatch.delenv("TORCHKM_ASSIGN_MAXNREG", raising=False)
    assert lazy_register_cap(True, torch.float32) == 80
    assert lazy_register_cap(True, torch.bfloat16) is None and lazy_register_cap(True, torch.float16) is None
    assert lazy_register_cap(False, torch.float32) == 128 == lazy_register_cap(False, torch.bfloat16)
    monkeypatch.setenv("TORCHKM_ASSIGN_MAXNREG", "96,0")
    assert lazy_register_cap(True, torch.bfloat16) == 96 and lazy_register_cap(False, torch.float32) is None


def test_lazy_register_cap_over_row_lists(monkeypatch):
    """The row-list search's caps (the exact mode): over fp32 rows three programs an SM below 2^20
    rows and four from there, over 16-bit rows three; its own switch, apart from the dense search's."""
    monkeypatch.delenv("TORCHKM_LIST_MAXNREG", raising=False)
    monkeypatch.setenv("TORCHKM_ASSIGN_MAXNREG", "96,0")
    assert lazy_register_cap(True, torch.float32, row_list=True, n=245_760) == 168
    assert lazy_register_cap(True, torch.float32, row_list=True, n=1 << 20) == 128
    assert lazy_register_cap(True, torch.bfloat16, row_list=True, n=10) == 168
    assert lazy_register_cap(True, torch.float16, row_list=True, n=1 << 22) == 168
    assert lazy_register_cap(False, torch.float32, row_list=True, n=10) is None
    monkeypatch.setenv("TORCHKM_LIST_MAXNREG", "0")
    assert lazy_register_cap(True, torch.float32, row_list=True, n=10) is None
    monkeypatch.setenv("TORCHKM_LIST_MAXNREG", "144,96")
    assert lazy_register_cap(False, torch.float32, row_list=True, n=10) == 96


def test_row_lists_take_their_own_tiles_where_set(monkeypatch):
    """``TORCHKM_LIST_CONFIG`` sets the row-list search's tiles alone; ``TORCHKM_ASSIGN_CONFIG`` all."""
    monkeypatch.delenv("TORCHKM_ASSIGN_CONFIG", raising=False)
    monkeypatch.setenv("TORCHKM_LIST_CONFIG", "64,32,32,4,3")
    dense = assign_config(245_760, 1024, 32, torch.float32, "exact", transposed=False)
    listed = assign_config(245_760, 1024, 32, torch.float32, "exact", transposed=False, row_list=True)
    assert (listed["BLOCK_N"], listed["num_stages"]) == (64, 3) and dense == listed
    monkeypatch.setenv("TORCHKM_LIST_CONFIG", "32,32,32,2,2")
    listed = assign_config(245_760, 1024, 32, torch.float32, "exact", transposed=False, row_list=True)
    assert (listed["BLOCK_N"], listed["num_warps"]) == (32, 2)
    assert assign_config(245_760, 1024, 32, torch.float32, "exact", transposed=False) == dense


def test_atomic_replicas(monkeypatch):
    """Copies of the per-row atomic sums: about 2 MB of them, between 1 and 64, from k and d only
    (data-parallel ranks all-reduce the copies as they are); the switch forces a count."""
    monkeypatch.delenv("TORCHKM_ATOMIC_REPLICAS", raising=False)
    assert atomic_replicas(128, 32) == 64 and atomic_replicas(1024, 32) == 16
    assert atomic_replicas(4096, 128) == 1 == atomic_replicas(65_536, 128) == atomic_replicas(1_000_000, 3)
    assert all(atomic_replicas(k, d) * k * d <= 1 << 19 or atomic_replicas(k, d) == 1
               for k in (65, 100, 1000, 4096) for d in (1, 17, 32, 129, 768))
    monkeypatch.setenv("TORCHKM_ATOMIC_REPLICAS", "3")
    assert atomic_replicas(128, 32) == 3


@pytest.mark.parametrize("k", [1, 7, 33, 64, 65, 100, 128])
@pytest.mark.parametrize("d", [9, 17, 32])
def test_every_row_3xtf32_takes_all_centroids_in_one_tile(monkeypatch, k, d):
    """Where the exact mode searches every row in 3xTF32 products (rows of at most 32 features, at
    most 128 centroids, any input dtype), its tiles hold every centroid (one tile: no running
    minimum) and whole rows; the switch turns the route off."""
    monkeypatch.delenv("TORCHKM_EXACT_X3", raising=False)
    assert all(exact_as_tf32x3(k, d, dtype) for dtype in (torch.float32, torch.float16, torch.bfloat16))
    assert not exact_as_tf32x3(129, d, torch.float32) and not exact_as_tf32x3(k, 33, torch.float32)
    cfg = tf32x3_rows_config(100_000, k, d, torch.float32)
    assert cfg["BLOCK_D"] >= d and cfg["BLOCK_K"] >= k and not cfg["EAGER"] and not cfg["SWAP"]
    monkeypatch.setenv("TORCHKM_EXACT_X3", "0")
    assert not exact_as_tf32x3(k, d, torch.float32)
