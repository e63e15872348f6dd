"""The launch tables' rules that do not need a kernel to check."""

from __future__ import annotations

import pytest
from torchkm._kernels.configs import CANDIDATE_CHUNKS, candidate_chunks, candidate_exact_config


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
