"""Launch configurations of the kernels: one table, chosen from the problem's shape and dtype.

The table was set from sweeps on an H200 and an H100 (benchmarks/bench_lloyd.py --sweep); ``TORCHKM_ASSIGN_CONFIG``
(``BLOCK_N,BLOCK_K,BLOCK_D,num_warps,num_stages[,EAGER[,SWAP]]``) overrides it for experiments, and
``TORCHKM_RECHECK_CONFIG`` (same format) the exact mode's re-search, whose centroid chunks
``TORCHKM_RESEARCH_CHUNKS`` sets (default 16 with the candidate re-search, else 8; see ``assign.AssignPass``). Also for experiments:
``TORCHKM_BF16_SPLIT`` (``1``/``0``: bf16 centroids as hi + lo parts or not),
``TORCHKM_EXACT_BOUND=gap`` / ``distance`` (the exact mode's bound on the whole gap instead of the
distance bound / the distance bound also for fp32 rows of at most 32 features),
``TORCHKM_CANDIDATE_CONFIG`` (the candidate re-search's tiles, see ``candidate_config``),
``TORCHKM_CANDIDATE_CHUNKS`` (its centroid chunks without lists, see ``candidate_chunks``),
``TORCHKM_CANDIDATE_EXACT_CONFIG`` (its direct distances' tiles, see ``candidate_exact_config``),
``TORCHKM_CHUNK_MINS=0`` (the candidate re-search scores every centroid chunk) and
``TORCHKM_PACKED_KEYS`` (``1``/``0``: the eager exact search keeps packed keys for fp32 rows too /
never; see ``assign.AssignPass``) and ``TORCHKM_TOP3_NETWORK=0`` (that search finds a tile's best three
by three successive minima instead of ``assign._lowest_three``'s merging network) and ``TORCHKM_HALF_OPERANDS=0`` (fp32 rows of the streamed and Hopper
searches multiply tf32 operands, not scaled fp16 ones; see ``assign``'s precision notes), and
``TORCHKM_ATOMIC_REPLICAS`` (the copies of the per-row atomic sums, see ``atomic_replicas``) and
``TORCHKM_FIXED_ROWS=0`` (every pass of a fit reads the rows' largest |x| for those operands, not
only the first; see ``assign.AssignPass``) and ``TORCHKM_REUSE_PASSES=0`` (``assign`` builds a new pass
for every call instead of reusing one per shape; see ``assign._reusable_key``) and
``TORCHKM_REPLAY_QUERIES=0`` (kept query passes run their launches eagerly instead of as a replayed
CUDA graph; see ``assign._KeptPass``) and ``TORCHKM_ONEHOT_SUMS=ieee`` (the one-hot sums of few
clusters in fp32 FMAs instead of three bf16 products; see ``_common.onehot_sums``) and
``TORCHKM_LAZY_KEYS`` (``1``/``0``: packed keys in the lazy search from 2 centroid tiles / never;
see ``assign.AssignPass._lazy_bits``) and ``TORCHKM_ASSIGN_MAXNREG`` (that search's register caps,
see ``lazy_register_cap``) and ``TORCHKM_DENSE_MOVES=1``/``0`` (dense Lloyd keeps float64 sums across
passes always / never, instead of for rows of at most 32 features; see ``dense_moves``) and
``TORCHKM_DENSE_PASSES`` (the bounds engine's passes over every row after a start and a relocation; see
``dense_settle_passes``) and ``TORCHKM_EPILOGUE_WIDTH`` (features per chunk of the assignment
epilogue; see ``assign.AssignPass.__call__``).
"""

from __future__ import annotations

import os

import torch
import triton

__all__ = ["FEW_ROWS", "assign_config", "atomic_replicas", "candidate_chunks", "candidate_config", "candidate_exact_config", "DENSE_MOVES_MAX_D", "dense_moves", "dense_settle_passes", "exact_as_tf32x3", "lazy_register_cap", "num_persistent_programs", "settle_config", "small_d_launch", "tf32x3_rows_config", "top_moves",
           "update_config"]


def _override(precision: str, row_list: bool = False) -> dict | None:
    # The exact mode's re-search (tf32x3) has its own override, and the search over a row list may
    # (``TORCHKM_LIST_CONFIG``: the bounds engine's settle passes alone).
    if precision == "tf32x3":
        spec = os.environ.get("TORCHKM_RECHECK_CONFIG")
    else:
        spec = (row_list and os.environ.get("TORCHKM_LIST_CONFIG")) or os.environ.get("TORCHKM_ASSIGN_CONFIG")
    if not spec:
        return None
    bn, bk, bd, warps, stages, *flags = (int(v) for v in spec.split(","))
    flags += [0, 0]
    return _config(bn, bk, bd, warps, stages, bool(flags[0]), swap=bool(flags[1]))


def _config(bn: int, bk: int, bd: int, warps: int, stages: int, eager: bool, *, swap: bool = False) -> dict:
    return {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_D": bd, "num_warps": warps, "num_stages": stages, "EAGER": eager,
            "SWAP": swap}


def assign_config(n: int, k: int, d: int, dtype: torch.dtype, precision: str, *, transposed: bool = True,
                  row_list: bool = False, split: bool = False) -> dict:
    """Tile sizes for the fused assignment kernel (``EAGER``: reduce each centroid tile per row at once;
    ``SWAP``: scores as (centroids x rows), the resident row tile as the right operand).

    A row tile is loaded once for all centroid tiles when the padded row fits one chunk (d <= 128
    for 4-byte operands, 256 for 2-byte ones); otherwise the features are streamed in chunks, through
    tiles of 256 centroids where there are more than 128. The
    exact mode reduces eagerly (it keeps the best two candidates with their indices), except in the
    transposed search and for rows of at most 32 features. From the H200 sweep of 2026-11-21 (only
    configs without register spills under ptxas were tried), and for the transposed search the
    H100 sweeps of the same day (which spill a few hundred bytes and are faster anyway).
    ``transposed=False``: never the transposed search. ``row_list``: the pass searches lists of rows
    (the bounds engine). ``split``: bf16 centroids as hi + lo parts (two products per tile).
    """
    override = _override(precision, row_list)
    if override is not None:
        return override
    d_pad = max(16, triton.next_power_of_2(d))
    k_tile = min(128, max(16, triton.next_power_of_2(k)))
    if precision == "tf32x3":
        # Re-search of the deferred rows: three products per tile, so features are streamed.
        if d_pad <= 32:
            return _config(64, min(64, k_tile), d_pad, 4, 2, False)
        return _config(128, k_tile, 32, 8, 4, True)
    operand_bytes = 4 if (dtype == torch.float32 or precision == "ieee") else 2
    exact = precision == "exact"
    one_chunk = 128 if operand_bytes == 4 else 256
    # The fast pass over many clusters with the whole row in one chunk: the transposed search, whose
    # resident row tile is the shared-memory operand, so that a row tile of 256 fits beside the
    # centroid stages (fewer centroid reads per score). H100 sweep of 2026-11-21: 1M x 128, k = 4096
    # fast pass 5.20 -> 4.27 ms (fp32), 2.69 -> 2.35 (bf16).
    # The exact mode's transposed search also keeps each slot's second-lowest score (four tile-sized
    # arrays), so it takes 128 rows: 1M x 128, k = 4096 fp32 went 8.31 -> 6.65 ms. Only where
    # measured: for bf16 (two products, hi and lo centroids) it was slower (6.75 -> 9.39 ms), and
    # rows of d <= 64 were not timed. ``transposed=False`` keeps the row-oriented search.
    if d_pad <= 32 and precision in ("exact", "fast"):
        # Short rows: a tile's product is a few instructions, so the running minimum's element-wise
        # work and its registers set the pace. Narrow centroid tiles (32 columns) and 4 warps keep
        # the lazy per-column arrays small and occupancy high. H200 sweep of 2026-11-21 (CUDA-graph
        # timed fused pass, 245,760 x 32): k = 1024 exact fp32 0.403 -> 0.236 ms, bf16 0.345 ->
        # 0.206, fast fp32 0.161 -> 0.133; k = 32 exact fp32 0.129 -> 0.102, fast fp32 0.077 ->
        # 0.057. bf16's fast pass then measured best with the general config below (64 x 64), which
        # it keeps over row lists (without a list: below).
        # Over a row list, 64-row tiles lose a third: H200, 3.9M x 32, k = 1024, the exact pass took
        # 1.58 ns per row over a list of all rows against 1.18 without a list; 128-row tiles 1.09
        # and 1.07, and 1.24 against 1.77 over a shuffled list of 12 % of the rows
        # (scripts/diag_rowlist.py, 2026-11-22).
        # With the packed keys of kernels v25, three stages and, exact, 64-row tiles for both dtypes:
        # H200, 2026-11-29, fused pass (replayed; tile sweep of 245,760 and 3.9M x 32, k = 1024), ms,
        # before -> after: exact fp32 0.217 -> 0.213 and 3.17 -> 3.09; exact bf16 on this search
        # 0.215 -> 0.193 and 2.96 -> 2.60 (the Hopper search took 0.201 and 2.85: 16-bit rows of at
        # most 32 features now stay here, ``hopper_search.supported``); fast fp32 0.130 -> 0.121 and
        # 1.84 -> 1.71; fast bf16 (64 x 64 before) 0.106 -> 0.101 and 1.56 -> 1.44. 128-row exact
        # tiles, 64-centroid tiles, 8 warps or 4 stages: level or slower.
        if k > 64 and not row_list:
            return _config(64 if exact else 128, 32, d_pad, 4, 3, False)
        if not row_list:
            # At most 64 centroids, the sums (one-hot, on the tensor cores) take half the pass or
            # more, and two warps a tile measured faster. H200, 2026-11-29, fused pass replayed at
            # 245,760 / 3,932,160 x 32, k = 32, ms, before -> after (all tried: 32-256 rows, 1, 2
            # and 4 warps, 2 and 3 stages): exact fp32 (3xTF32, ``exact_as_tf32x3``) 0.062 ->
            # 0.050 and 0.837 -> 0.742; exact bf16 0.056 -> 0.051 and 0.733 -> 0.688; fast fp32
            # 0.050 -> 0.045 and 0.641 -> 0.592; fast bf16 0.056 -> 0.039 and 0.776 -> 0.487.
            # Since each program loads its next tile ahead (``AssignPass``, 2026-12-02), fast bf16
            # takes 64-row tiles: 128 spill 744 bytes with the tile ahead, and 3.9M x 32, k = 32
            # went 0.487 -> 0.403 ms (245,760 rows 0.038 -> 0.032) against 0.540 (0.042) at 128.
            if k_tile == 64 and (exact or d == d_pad):
                # 33-64 centroids in one tile of 64 (no running minimum across tiles, ``ONE_TILE``),
                # four warps but for the fast mode over 16-bit rows. The 32-centroid tiles spilled
                # there (sm_90, 3.9M x 32 x 64: 520 bytes exact bf16, 352 fast fp32). H200,
                # 2026-12-03, fused pass replayed (centred rows), ms, 32-centroid tiles -> one tile
                # of 64 at 3.9M / 245,760 x 32 x 64: exact fp32 0.959 -> 0.756 and 0.067 -> 0.059,
                # exact bf16 0.941 -> 0.661 and 0.069 -> 0.053, fast fp32 0.737 -> 0.536 and 0.055 ->
                # 0.046, fast bf16 (two warps) 0.576 -> 0.446 and 0.046 -> 0.038; in that order at
                # 1M x 32 x 48 0.256 -> 0.196, 0.250 -> 0.175, 0.197 -> 0.152, 0.159 -> 0.119, and
                # at 1M x 16 x 64 0.179 -> 0.138, 0.141 -> 0.140, 0.113 -> 0.110, 0.100 -> 0.096;
                # exact at 1M x 24 x 48 0.358 -> 0.232 (fp32), 0.420 -> 0.238 (bf16). Not the fast
                # mode over padded features: bf16 was slower (1M x 24 x 48: 0.282 -> 0.433), and
                # over fp32 rows the sums came out wrong on the GPU with four warps (3e-2 relative;
                # right with two, and under the interpreter). ``test_up_to_64_centroids_over_short_
                # rows_take_one_tile`` holds the default tiles' sums.
                return _config(64, 64, d_pad, 2 if not exact and operand_bytes == 2 else 4, 2, False)
            if exact:
                return _config(32 if operand_bytes == 4 else 64, min(32, k_tile), d_pad, 2, 2, False)
            return _config(64, min(32, k_tile), d_pad, 2, 3 if operand_bytes == 4 else 2, False)
        if exact:
            return _config(128, min(32, k_tile), d_pad, 4, 2, False)
        if operand_bytes == 4:
            return _config(128, min(32, k_tile), d_pad, 4, 2, False)
        return _config(64, min(64, k_tile), d_pad, 4, 2, False)
    swap = transposed and precision == "fast" and k > 64 and d_pad <= one_chunk
    if transposed and exact and operand_bytes == 4 and k > 64 and d_pad == 128:
        return _config(128, 64, d_pad, 8, 3, False, swap=True)
    # 16-bit rows, one product (no hi + lo split): the transposed exact search too. H200, 2026-11-22,
    # fused pass (scripts/diag_exact_bound.py): bf16 1M x 128, k = 4096: 6.01 -> 4.86 ms (6.59 with
    # the split); SIFT 245,760 x 128: 1.52 -> 1.19; 32,768 x 256, k = 8192: 0.78 -> 0.53 (0.97).
    if transposed and exact and operand_bytes == 2 and not split and k > 64 and d_pad in (128, 256):
        return _config(128, 64, d_pad, 8, 3, False, swap=True)
    if d_pad > one_chunk and k > 128:
        # Streamed features: a (rows x centroids) tile reads BLOCK_N + BLOCK_K operand rows per
        # feature chunk from L2 for BLOCK_N * BLOCK_K products, and at 128 x 128 that traffic, not the
        # tensor cores, set the pace (both dtypes moved about 6 TB/s). 256 centroids a tile read a
        # quarter less per product. H200, 1M x 768, k = 8192, fused pass (scripts/diag_streamed.py,
        # 2026-11-22), ms, 128 x 128 -> 128 x 256: fp32 fast 64.6 -> 50.1, exact 81.7 -> 60.6; bf16
        # fast 31.0 -> 25.3, exact 50.1 -> 44.0 (256 rows x 128 centroids: 58.1, 72.8, 33.4, 50.3;
        # cuBLAS x @ c.T: 38.9 tf32, 20.7 bf16). At 128 x 256 L2 no longer sets the pace: ncu (H100,
        # bf16 fast, 2026-12-07) read 4.2 TB/s from L2 of the 9.7 it serves, the tensor pipe 55 %
        # busy (loads restart at every centroid tile); 16-bit rows of more than 256 features take
        # the ring search in the fast mode (hopper_search.py).
        return _config(128, 256, 32, 8, 3, True) if operand_bytes == 4 else _config(128, 256, 64, 8, 3, True)
    if operand_bytes == 4:
        if swap:
            return _config(256, 64, d_pad, 8, 3, False, swap=True) if d_pad >= 128 else \
                _config(128, 64, d_pad, 4, 2, False, swap=True)
        if d_pad <= one_chunk:
            # Few clusters: the lazy per-column minimum measured slower (one centroid tile only).
            return _config(128, k_tile, d_pad, 8, 2, exact or k <= 64)
        return _config(128, k_tile, 64, 8, 3, True) if exact else _config(128, k_tile, 32, 8, 4, True)
    if swap and d_pad <= 128:
        return _config(128, 64, d_pad, 4, 2, False, swap=True)
    if d_pad <= 128:
        return _config(128, min(64, k_tile), d_pad, 8, 2, True) if exact else _config(64, min(64, k_tile), d_pad, 4, 2, False)
    if d_pad <= one_chunk and not exact:
        return _config(64, min(64, k_tile), d_pad, 4, 2, False)
    return _config(128, k_tile, 64, 8, 3, True)


def atomic_replicas(k: int, d: int) -> int:
    """Copies (replicas) of the fused sums where each row adds its features by its own atomics
    (more than ``onehot_max_k`` clusters): program ``p`` adds into copy ``p % R``, and the update
    sums the copies. Depends on k and d only, so that data-parallel ranks share the layout.

    Two reasons. Speed: a cluster's d addresses take every row of the cluster, and same-address
    atomics queue in L2. Accuracy: a cluster's sum is a chain of n / k fp32 additions; 16-bit rows
    less an fp32 offset all carry the offset's low bits, so their roundings do not cancel and the
    error grows with the chain. R copies make the chains R times shorter. H200, 2026-12-03
    (BENCHMARKS.md), R = 1 -> 16 -> 64, centred rows: the scatter alone
    (``scripts/diag_atomics.py``), ms, 3.9M x 32, k = 128 fp32 0.961 -> 0.330 -> 0.258, bf16
    error relative to float64 5.1e-4 -> 3.0e-5 -> 1.4e-5; k = 1,024 fp32 0.483 -> 0.273 -> 0.263;
    245,760 x 32, k = 1,024 0.034 -> 0.018 -> 0.019. The fused pass at 3.9M x 32, k = 128: fast
    fp32 0.978 -> 0.450 -> 0.448 ms, bf16 sums 7.8e-4 -> 1.7e-4 -> 3.3e-5 off; where the search
    takes longer (k = 1,024) level in time. Copies past about 2 MB cost L2 room instead: 1M x 128,
    k = 4,096 fp32 scatter 0.256 (R = 1), 0.247 (4), 0.310 (16). So R = 2^19 / (k d), between 1
    and 64. ``TORCHKM_ATOMIC_REPLICAS`` overrides it (experiments).
    """
    forced = os.environ.get("TORCHKM_ATOMIC_REPLICAS")
    if forced:
        return max(1, int(forced))
    return min(64, max(1, (1 << 19) // max(1, k * d)))


def float64_replicas(k: int, d: int) -> int:
    """Copies of ``update.float64_sums``' float64 sums, as ``atomic_replicas`` for the fp32 sums:
    program ``p`` adds into copy ``p % R``, then one sum over the copies, so that the rows of a
    large cluster do not queue on its d addresses in L2. R = 2^18 / (k d) (the same 2 MB of copies
    as the fp32 sums' 2^19), between 1 and 64. ``TORCHKM_F64_REPLICAS`` overrides it (experiments)."""
    forced = os.environ.get("TORCHKM_F64_REPLICAS")
    if forced:
        return max(1, int(forced))
    return min(64, max(1, (1 << 18) // max(1, k * d)))


# Dense Lloyd keeps float64 sums across passes by default for rows of at most this many features,
# where it was timed level with fresh fp32 sums or faster (``dense_moves``).
DENSE_MOVES_MAX_D = 32


def dense_moves(d: int) -> bool:
    """Whether dense Lloyd fits over ``d``-feature rows keep their sums in float64 across passes
    where they can (``lloyd.LloydEngine``'s ``moves``): by default for rows of at most
    ``DENSE_MOVES_MAX_D`` features; ``TORCHKM_DENSE_MOVES=1`` / ``0``: always / never.

    There the fits repeat to the bit and take the bounds engine's steps (issue 4's identical labels
    and iterations), at no cost. H100, 2026-12-05, fits to convergence against fresh fp32 sums at
    245,760 x 32, k = 1,024: 0.994x / 0.978x the time (sigma^2 0.0125 / 0.05), and 0.973x / 0.979x
    in a later run; at 3.9M rows 0.94x / 0.78x, and 0.963x at 0.05 later (the fp32-sum fits there
    took 116 against 109 and 107 against 107 iterations); 20-iteration fits from random rows
    (``scripts/diag_dense_moves.py``, paired) 1.014x fp32, 0.951x bf16.
    Wider rows pay for it: its first pass adds every row by an unreplicated float64 atomic, and each
    later one moves the changed rows by two. The same 20-iteration fits (H100, 2026-12-05), moves
    over fp32 sums: 1M x 128, k = 4,096 1.088x fp32, 1.070x bf16; 1M x 768, k = 8,192 1.049x /
    1.008x; 32,768 x 256, k = 8,192 1.066x / 1.053x. So they keep fp32 sums unless asked."""
    forced = os.environ.get("TORCHKM_DENSE_MOVES")
    if forced in ("0", "1"):
        return forced == "1"
    return d <= DENSE_MOVES_MAX_D


def candidate_config(dtype: torch.dtype, d: int, few_rows: bool = False) -> dict:
    """Tiles of the candidate re-search's fast product (``assign._candidate_kernel``): rows x
    centroids x features per step, warps, stages. ``TORCHKM_CANDIDATE_CONFIG``
    (``BLOCK_N,BLOCK_K,BLOCK_D,num_warps,num_stages``) overrides it for experiments.

    H200, 1M x 768, k = 8192, centroids after two Lloyd iterations (23-28 % of rows deferred),
    candidate kernel alone (``scripts/diag_streamed.py --exact-env``, 2026-11-22), ms: bf16 128 x 64
    16.5, 128 x 128 12.9, 64 x 256 13.1, 128 x 256 16.0 (spills 920 bytes); fp32 128 x 64 27.6,
    128 x 128 20.0, 64 x 256 18.0, 128 x 256 23.4.

    ``few_rows``: a pass over at most ``FEW_ROWS`` rows, whose candidate launch splits the centroids
    finer (``candidate_chunks``): 64 x 128 tiles for every dtype. H200, 32,768 x 256, k = 8192,
    about 50 rows deferred, kernel alone with 32 chunks, ms: fp32 64 x 256 0.023, 64 x 128 0.019;
    bf16 128 x 128 0.015-0.016, 64 x 128 0.014-0.015 (2026-11-29).

    16-bit operands of 65-128 features (``d``): 64 x 128 tiles of whole rows on 4 warps, 2 stages,
    so that each tile of rows is loaded and converted once (``X_ONCE``). H200, 1M x 128, k = 4096,
    Hopper search (every deferred row listed in all 16 chunks but where the neighbour lists settle
    it), kernel alone, us, 128 x 128 x 64 on 8 warps -> this: fp32 rows as fp16 operands, N(0, 1)
    rows, 0.6 % deferred 104 -> 75, over-split rows 21-25 % deferred 287-294 -> 232-250; bf16
    N(0, 1) 1.1 % deferred 129 -> 114-116, over-split 5-7 % 25-46 -> 23-44. Whole rows on 128 x
    128 tiles, 8 warps: 87, 249, 126 (110, 320, 139 loading each tile of rows per centroid tile).
    (benchmarks/results/2026-12-04_h200_s11_call1_gap0.txt.)"""
    spec = os.environ.get("TORCHKM_CANDIDATE_CONFIG")
    if spec:
        bn, bk, bd, warps, stages = (int(v) for v in spec.split(","))
        return {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_D": bd, "num_warps": warps, "num_stages": stages}
    if few_rows:
        return {"BLOCK_N": 64, "BLOCK_K": 128, "BLOCK_D": 64, "num_warps": 4, "num_stages": 3}
    if dtype == torch.float32:
        return {"BLOCK_N": 64, "BLOCK_K": 256, "BLOCK_D": 32, "num_warps": 8, "num_stages": 3}
    if 64 < d <= 128:
        return {"BLOCK_N": 64, "BLOCK_K": 128, "BLOCK_D": 128, "num_warps": 4, "num_stages": 2}
    return {"BLOCK_N": 128, "BLOCK_K": 128, "BLOCK_D": 64, "num_warps": 8, "num_stages": 3}


def candidate_exact_config(d: int, few_rows: bool = False) -> dict:
    """Tiles of the candidate re-search's direct distances (``assign._candidate_exact_kernel``): rows
    per tile, features per step (each row's candidates at once), warps.
    ``TORCHKM_CANDIDATE_EXACT_CONFIG`` (``BLOCK_R,EPI_D,num_warps``) overrides it for experiments.

    A pass over few rows (``few_rows``, at most ``FEW_ROWS``) defers tens to hundreds: a tile or two
    of 16 rows, whose time is the chain of dependent loads of its feature steps. Narrow tiles over
    wide steps spread them over more programs and shorten the chain. H200, 32,768 x 256, k = 8192,
    kernel alone (``scripts/diag_streamed.py --exact-env``, 2026-11-29), ms, rows x features per
    step: with about 50 rows deferred 16 x 32 0.008-0.009, 8 x 64 0.005, 4 x 128 0.004, 2 x 256 and
    1 x 256 0.003; with 340-530 (centroids sampled rows) 0.008-0.009, 0.005-0.006, 0.004, 0.004,
    0.003-0.004. Thousands of deferred rows keep 16 x 32: at 1M x 128, k = 4096 (8,000-9,600
    deferred) 16 x 32 0.009-0.010, 8 x 64 0.012-0.013, 4 x 128 0.017-0.020."""
    spec = os.environ.get("TORCHKM_CANDIDATE_EXACT_CONFIG")
    if spec:
        rows, width, warps = (int(v) for v in spec.split(","))
        return {"BLOCK_R": rows, "EPI_D": width, "num_warps": warps}
    if few_rows:
        return {"BLOCK_R": 4, "EPI_D": min(128, max(32, triton.next_power_of_2(d))), "num_warps": 4}
    return {"BLOCK_R": 16, "EPI_D": 32, "num_warps": 4}


# Passes over at most this many rows defer a few hundred at most (a fraction of a percent once the
# centroids are means): their candidate launch splits the centroids finer (``candidate_chunks``).
FEW_ROWS = 1 << 17
# ... into at most this many chunks, each at least one 128-wide tile.
CANDIDATE_CHUNKS = 64


def candidate_chunks(k: int) -> tuple[int, int]:
    """(centroids per chunk, chunks) of the candidate launch of a pass over at most ``FEW_ROWS`` rows
    without the plan's lists (one program column a chunk): as many chunks as 128-centroid tiles, up
    to ``CANDIDATE_CHUNKS``, so that a few deferred rows still spread over the GPU; each program's
    work is its chunk. Other passes keep the plan, the re-search's 16 chunks and larger tiles,
    better for thousands of rows (H200, 1M x 128, k = 4096, about 10,000 rows deferred: kernel
    alone fp32 0.13 ms against 0.20 with this split, bf16 0.127 against 0.189, and 0.167 / 0.178
    with the plan's chunks and tiles but each program's own thresholds, 2026-11-29).
    ``TORCHKM_CANDIDATE_CHUNKS`` sets the most chunks (experiments)."""
    most = int(os.environ.get("TORCHKM_CANDIDATE_CHUNKS", CANDIDATE_CHUNKS))
    chunks = max(1, min(most, triton.cdiv(k, 128)))
    chunk = triton.cdiv(triton.cdiv(k, chunks), 128) * 128
    return chunk, triton.cdiv(k, chunk)


def lazy_register_cap(exact: bool, dtype: torch.dtype, row_list: bool = False, n: int = 0) -> int | None:
    """Registers a thread (ptxas' ``maxnreg``) of the lazy search with packed keys (``assign._tile``,
    ``LAZY_BITS``), or None: uncapped. ``AssignPass`` caps it over rows of at most 32 features.
    Without a row list that loop is bound by latency with four programs an SM (ncu,
    245,760 x 32, k = 1,024, 2026-11-28: no eligible warp in 41 % of cycles, occupancy limited by
    registers); capped, more programs share an SM, and ptxas' spills stay outside the loop (sm_90
    SASS, Triton 3.6). Exact over fp32 rows: 105-107 -> 80 registers, six programs an SM instead
    of four; fast: 143-164 -> 128, four instead of three. H200, fused pass replayed, four
    processes a setting over two calls, ms (2026-12-02, scripts/diag_second_sums.py;
    BENCHMARKS.md): 245,760 x 32 x 1,024 exact fp32 0.190-0.194 -> 0.183, fast fp32 0.113 ->
    0.110-0.112, fast bf16 0.095-0.097 -> 0.089-0.090; 3.9M x 32 x 1,024 exact fp32 2.741 / 2.746
    -> 2.613 / 2.605, fast bf16 1.333 / 1.336 -> 1.265 / 1.261. The exact search over 16-bit rows
    did not move at 80 (0.177 both ways), 96 or 88, so it stays uncapped; 72 and 96 (exact, fast)
    were no faster. ``TORCHKM_ASSIGN_MAXNREG=EXACT,FAST`` sets both caps (0: uncapped;
    experiments).

    ``row_list``: the search over a list of the ``n`` rows (the bounds engine's settle passes, the
    exact mode over 128-row tiles). Uncapped it took 255 registers (two programs an SM); capped at
    168 (three) or 128 (four). H100, 245,760 x 32 x 1,024, the search alone over sorted random
    lists of 100 / 60 / 30 / 10 / 3 % of the rows, ms (scripts/diag_rowlist.py, 2026-12-06):
    uncapped 0.238 / 0.154 / 0.096 / 0.044 / 0.039, 168 0.202 / 0.125 / 0.082 / 0.050 / 0.042, 128
    0.196 / 0.134 / 0.089 / 0.053 / 0.042 (96 and 80 slower; the dense pass's 64-row tiles over a
    list no better). A fit's GPU time (seed 000 group B, two draws): 168 level at 245,760 rows and
    sigma^2 = 0.0125 (short lists), 5 % less at 0.05, 7-10 % at 3.9M rows; 128 3-4 % more at 245,760
    rows and 0.0125, 9-14 % less at 3.9M (benchmarks/results/2026-12-06_h100_s25_call2_*). So 168
    below 2^20 rows, 128 from there over fp32 rows (only those two sizes measured). Over bf16 rows
    168 at every size: a fit's GPU time, same sizes and draw, uncapped -> 168: 4.18 -> 4.21 /
    6.98 -> 6.57 ms at 245,760 rows (sigma^2 0.0125 / 0.05), 68.6 -> 63.6 / 129.0 -> 113.0 at 3.9M;
    the dense pass's 64-row tiles over the lists (which searched lists faster alone, and then run
    no dense passes) 4.24 / 6.56 / 67.6 / 120.0 (s25 call 5; 128 not tried over bf16 rows). The
    fast mode (not the bounds engine's) stays uncapped. ``TORCHKM_LIST_MAXNREG=EXACT,FAST`` sets
    these caps (experiments)."""
    spec = os.environ.get("TORCHKM_LIST_MAXNREG" if row_list else "TORCHKM_ASSIGN_MAXNREG")
    if spec:
        caps = [int(v) for v in spec.split(",")]
        return (caps[0] if exact else caps[-1]) or None
    if row_list:
        if not exact:
            return None
        return 168 if n < 1 << 20 or dtype != torch.float32 else 128
    if not exact:
        return 128
    return 80 if dtype == torch.float32 else None


def exact_as_tf32x3(k: int, d: int, dtype: torch.dtype) -> bool:
    """Whether the exact mode searches every row with 3xTF32 products instead of keeping the fast
    pass's best two candidates (and re-searching the close calls with 3xTF32 anyway), on the tiles
    of ``tf32x3_rows_config``.

    For rows of at most 32 features and few clusters, the products are a few instructions per
    tile and keeping the best two (more element-wise work and registers) costs more than tripling
    them. H200, 2026-11-21, fp32, fused pass at 245,760 x 32 (CUDA-graph timed): k = 32, 0.100 ms
    exact against 0.065 ms 3xTF32 (fast: 0.057), both with ``assign_config``'s exact tiles (128 x
    32, 4 warps, lazy); at k = 1024 the best two win, 0.236 against 0.280 (the best 3xTF32 tiles).
    16-bit rows too: they are exact in tf32, so the products are as accurate as for fp32 rows.
    H200, 2026-11-22, bf16, Lloyd iteration at 245,760 x 32, k = 32 (bench_lloyd, three
    alternating runs): 0.046 / 0.085 / 0.076 ms against 0.135 / 0.124 / 0.119 keeping the best two
    (fp16: the same kernel, not measured).
    65 to 128 clusters take one tile of 128 centroids. H200, 2026-12-03, fused pass replayed
    (``scripts/diag_exact_x3.py``, centred rows), ms, best two -> every row 3xTF32 on 64 x 128
    tiles: 3.9M x 32 x 128 fp32 0.977 -> 0.773, bf16 0.989 -> 0.810; 245,760 x 32 x 128 fp32
    0.074 -> 0.055, bf16 0.076 -> 0.057. At 256 clusters (two such tiles) 3xTF32 lost: 3.9M x 32 x
    256 fp32 1.26 -> 1.93. ``TORCHKM_EXACT_X3=0``: never (experiments).
    """
    if os.environ.get("TORCHKM_EXACT_X3") == "0":
        return False
    return dtype in (torch.float32, torch.float16, torch.bfloat16) and triton.next_power_of_2(d) <= 32 and k <= 128


def tf32x3_rows_config(n: int, k: int, d: int, dtype: torch.dtype) -> dict:
    """Tiles of the exact mode where it searches every row in 3xTF32 products
    (``exact_as_tf32x3``): all centroids in one tile (no running minimum across tiles, the pass's
    ``ONE_TILE``), of 128 above 64 clusters (H200 measurements in ``exact_as_tf32x3``), otherwise
    the exact mode's tiles."""
    if k > 64:
        return _config(64, 128, max(16, triton.next_power_of_2(d)), 4, 2, False)
    return assign_config(n, k, d, dtype, "exact")


def settle_config() -> dict:
    """Rows per tile and warps of the bounds engine's settle pass (``prune._settle_kernel``);
    ``TORCHKM_SETTLE_CONFIG`` (``BLOCK_N,num_warps``) overrides it for experiments."""
    spec = os.environ.get("TORCHKM_SETTLE_CONFIG")
    if spec:
        block_n, warps = (int(v) for v in spec.split(","))
        return {"BLOCK_N": block_n, "num_warps": warps}
    # H200, 3.9M x 32, k = 1024 (scripts/diag_bounds.py, 2026-11-22): 227 us per pass at 256 rows
    # and 4 warps; 245 at 128 / 4, 243 at 64 / 2, 278 at 256 / 8, 300 at 512 / 8.
    return {"BLOCK_N": 256, "num_warps": 4}


def dense_settle_passes() -> tuple[int, int]:
    """How many of the bounds engine's passes after its first pass, and after a relocation of empty
    clusters, search every row on the dense engine's tiles instead of settling rows and searching
    the rest (``prune.BoundsEngine``, where those tiles differ from the row-list ones): while the
    centroids still move far, most rows are listed, and the row-list search over most rows is
    slower than the dense one over every row. ``TORCHKM_DENSE_PASSES=A,B`` sets both (``0,0``:
    none), for experiments.

    H100, 2026-12-06, seed 000 group B (``bench_prune.py --decompose``: a fit's kernel time under
    torch.profiler, one process per setting, same data), GPU ms per fit, k = 1,024:

    | setting | 245,760 x 32, sigma^2 0.0125 | 0.05 | 3.9M x 32, 0.0125 | 0.05 |
    |---|---:|---:|---:|---:|
    | 0,0 (none) | 4.04 | 9.17 | 106.6 | 134.9 |
    | 3,1 | 3.78 | 8.80 | 102.7 | 132.3 |
    | 3,3 | 3.77 | 8.88 | 102.0 | 132.1 |
    | 6,3 | 3.76 | 8.63 | 99.7 | 129.1 |
    | 8,3 | 3.75 | 8.52 | 102.2 | 126.9 |
    | **5,2** | **3.61** | **8.60** | **99.3** | **129.5** |

    with the same labels and iterations (29, 62, 101, 103). Passes counted by ncu in one such fit
    (245,760 rows, sigma^2 0.05, with 3,1): a dense pass 211 us, the list passes right after it
    265-297 us, 60-70 a few passes later. (Whole fits' wall times at 245,760 rows moved by more
    than these differences from process to process.) With the list search register-capped
    (``lazy_register_cap``, later that day) its list of every row costs about the dense search, and
    5,2 still gave the shortest fits: 128 registers, seed 2416, 5,2 / 2,1 / 0,0: 3.69 / 3.76 / 3.86,
    5.53 / 5.68 / 5.74, 98.5 / 100.5 / 100.6, 91.8 / 93.2 / 93.5 ms.
    """
    spec = os.environ.get("TORCHKM_DENSE_PASSES")
    if spec:
        after_start, after_relocation = (max(0, int(v)) for v in spec.split(","))
        return after_start, after_relocation
    return 5, 2


def top_moves(k: int, d: int) -> int:
    """How many of the centroids that moved most the bounds engine's settle pass measures each row
    against (``prune._top_moves_kernel``): their exact distances replace the bound's decay by their
    moves, and the others' moves are at most the next largest. 0 (the default): Hamerly's rule alone
    (the largest move of any other centroid). ``TORCHKM_TOP_MOVES=16`` (a power of two, at least 16)
    turns it on where the settle pass holds the whole row (d <= 64) and one program selects among
    all the moves (k <= 4096), for experiments.

    Off because it measured slower. Counted on the CPU (seed 000's data, 245,760 x 32, k = 1,024,
    sigma^2 = 0.0125), late passes listed 3-11 % of the rows under Hamerly's rule with a few dozen
    centroids still moving, and 0-5 % with 16 measured: 45 % fewer rows searched over a fit. On an
    H200 (2026-12-03, seed 000's data at that size, replayed fits) the settle pass took 55 us instead of 17 with
    the 16 distances as one fp32 product (85-91 us as 16 row reductions), and the late searches
    barely shrank (their cost has a floor of about 35 us): the fit's kernels 4.20 -> 5.08 ms at
    sigma^2 = 0.0125, 5.87 -> 5.69 at 0.05; at 3.9M x 32 x 1,024, sigma^2 = 0.0125, a fit 114.3 ->
    154.9 ms (16 more distances a row in every settle pass)."""
    spec = os.environ.get("TORCHKM_TOP_MOVES")
    if spec and int(spec) > 0 and 3 <= k <= 4096 and d <= 64:
        # (One product of the row tile with the listed centroids: a power of two, at least 16.)
        return max(16, triton.next_power_of_2(int(spec)))
    return 0


def update_config(d: int) -> dict:
    """Tile sizes of the stand-alone update kernels."""
    return {"BLOCK_N": 64, "BLOCK_D": min(128, max(16, triton.next_power_of_2(d)))}


def num_persistent_programs(device: torch.device) -> int:
    """Programs of a persistent launch: a few per SM (a handful under the CPU interpreter)."""
    if device.type != "cuda":
        return 4
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


def small_d_launch(n: int, device: torch.device, per_program_sums: bool) -> tuple[int, int, int]:
    """(rows per tile, programs, tiles per program) of the small-d kernel: one row per thread, each
    program walking its share of the tiles.

    ``per_program_sums``: the programs keep per-cluster sums in registers and add them with atomics
    when they end, all to the same k (d + 1) addresses, so 4 programs per SM, about as many as fit
    at once. (H200, 2026-11-23, ms per pass against 32 programs per SM: 1M x 2 x 32 0.077 -> 0.030,
    245,760 x 2 x 32 0.034 -> 0.017, 1M x 8 x 32 1.05 -> 0.30, 100M x 2 x 32 unchanged at 1.84; two
    per SM was a little faster up to 1M rows and slower at 10M x 3 x 100.) Otherwise 32 per SM, small
    waves: searches alone or per-row atomics (100M x 2 x 32, search only: 1.09 ms against 1.27 with 4).
    """
    block_n = 128
    n_tiles = triton.cdiv(n, block_n)
    per_sm = 4 if per_program_sums else 32
    programs = per_sm * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    tiles_per_program = max(1, triton.cdiv(n_tiles, programs))
    return block_n, triton.cdiv(n_tiles, tiles_per_program), tiles_per_program
