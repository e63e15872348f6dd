"""The launch tables' rules that do not need a kernel to check."""

from __future__ import annotations

import pytest
from torchkm._kernels.configs import CANDIDATE_CHUNKS, candidate_chunks


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
