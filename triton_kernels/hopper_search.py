"""Nearest-centroid search on Hopper (sm_90) with the running minimum overlapping the next product.

The ``tl.dot`` searches in ``assign.py`` issue a centroid tile's product, wait for it, then take the
running minimum on the CUDA cores while the tensor cores idle: on an H200 the minimum added 22-31 %
to the products alone (1M x 128, k = 4096, ``scripts/diag_overlap.py``), and Triton 3.6 keeps the
next product asynchronous over it only in narrow cases (ptxas then serialises it anyway, C7514).
This kernel, written in Gluon, states the overlap explicitly: two accumulators, the product of tile
j + 1 issued asynchronously (``warpgroup_mma(is_async=True)``) before waiting on tile j's
(``warpgroup_mma_wait(num_outstanding=1)``), so tile j's minimum runs while the tensor cores work
on tile j + 1. Centroid tiles stream through a ring of shared-memory stages filled by TMA; the row
tile is loaded once.

It computes only the search, as the fused pass's would: per row the best score and its index, and
(``CHECK``) the second best with its index, a third candidate with its index and lower bounds on
the scores of the others, with the same conventions
(score ``bias_j - 2 x.c~_j`` from the prepared centroids, lowest index on ties, strict comparisons
across tiles). ``assign._tile`` then runs its epilogue (direct distances, the exact mode's
settling and deferral, sums) from these instead of searching (``SEARCHED``).

Packed (``packed``: fp32 and bf16 rows, up to 1,024 centroid tiles), the running minimum takes two
instructions a score instead of four (six instead of four with ``CHECK``). A second, small product
per tile adds each centroid's bias and each row's centred squared norm, so the accumulator holds a
squared distance (not negative, but for rounding); the tile's number replaces the score's lowest
bits, and one float minimum keeps each slot's best score with its tile. H200, 1M x 128, k = 4096,
search alone: fp32 3.75 -> 3.44 ms fast, 4.78 -> 3.97 exact; bf16 2.50 -> 2.19 and 3.44 -> 2.70.
The record's values are then lowered by what the cleared bits and the row term's sum may hide.

fp16 operands (``half_scale``, fp32 rows of a multiple of 8 features, see ``assign.py``): each
program loads its fp32 row tile itself, scales it by the pass's power of two and stores it as fp16
in shared memory, once, before the centroid tiles stream past it. The products then run at the
16-bit rate; the record is in the scaled units, which the epilogue scales back. Packed there too:
the bias and the row term, too large for fp16, enter as four fp16 parts each against powers of two
(``HALF_PART_SCALES``) on the other side. H200, fused pass (search + sums), 1M x 128, k = 4096,
unpacked -> packed: fast 3.63 -> 2.47 ms (the fast mode took packed tf32 before), exact 4.08 ->
3.40; 1M x 64: 1.97 -> 1.53 and 3.21 -> 2.39 (2026-11-27).

16-bit rows of more than 256 features (``streamed``): a row tile no longer fits beside whole
centroid tiles. The default there (``TORCHKM_HOPPER_STREAMED=ring``) is the ring search
(``_ring_kernel``) for the fast mode: rows and centroids both stream in chunks of 64 features, a
chunk of each a stage, through one ring of TMA stages that runs on across the centroid tiles, one
asynchronous 128 x 256 product a stage, and each tile's fold reduced per row at once. What it
fixes (ncu, H100, 1M x 768 x 8,192 bf16, 2026-12-07): the tl.dot search kept the tensor pipe 55 %
busy, its loads restarting at every centroid tile and its fold overlapping nothing, with L2 at
4.2 TB/s of the 9.7 measured (so not L2); the ring search keeps it 83 % busy, as cuBLAS's own
product. The search alone 18.8 ms against cuBLAS's 20.7 and a floor of 16.6; the fast pass with
sums 26.17 -> 22.00 ms. Its exact record (``TORCHKM_HOPPER_RING_EXACT=1``: the runner-up with its
index and the third best, per row and tile) costs 5 ms more and the pass came out level with the
tl.dot search's (29.63 against 29.24), so the exact mode keeps that one. It folds keys
(``ring_packed``): each score's column in its 8 lowest bits, so one float minimum a score finds the
tile's best with its column, and the exact record's runner-up and third each take a mask and a
minimum; the record's values then move by the cleared bits (``RING_KEY_SLACK``) so that they
still bound the scores. H100, the search alone, scores -> keys: fast 19.59 -> 18.65 ms, exact
26.90 -> 22.97; the passes then fast 22.13, exact 29.00 against the tl.dot search's 28.64
(its pass time is now mostly outside the search: the epilogue and the re-searched rows). With the
exact record's chunk minima (``search_chunk_mins``: the candidate re-search then skips the chunks
that cannot hold a winner, 3.80 -> 0.86 ms) the exact mode takes the ring search too, by default:
H100, 1M x 768 x 8,192 bf16, Lloyd iteration 29.80 -> 27.20 ms (two processes, one machine).

The resident-row search (``_streamed_kernel``, ``TORCHKM_HOPPER_STREAMED=1``): the row tile stays
in shared memory as chunks of 64 features (128 rows of 768 bf16 features: 192 KiB) and the
centroid tiles stream past it chunk by chunk. Slower than the tl.dot search in both modes: H100,
1M x 768, k = 8192, bf16, fused pass with sums replayed (scripts/diag_resident_search.py,
2026-12-07), tl.dot / resident: fast 27.15 / 28.18 ms, exact 28.41 / 30.20. ncu: its tensor pipe
53-60 % busy, its warps waiting on their few small stages (the rows leave room for 4 of 8 KiB).

GPU-only: Gluon does not run under ``TRITON_INTERPRET=1``. ``supported`` says when the launcher
applies; everything else takes the ``tl.dot`` search.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # Gluon is experimental: its absence, or another API, leaves the tl.dot search in place.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Names that Gluon changed after Triton 3.6 (the device image's), so that the search compiles
    # on 3.9 as well (CI's; checked by scripts/compile_sm90.py): the TMA load, ``async_load`` from
    # 3.9 (where ``async_copy_global_to_shared`` raises), with the same arguments.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    # The CTA's barrier: ``thread_barrier`` in 3.6, ``barrier`` from 3.9.
    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed Triton
    gluon = None

__all__ = ["available", "chunk_rows", "mode", "packed", "record_rows", "ring_shape", "search", "search_in_graph",
           "search_chunk_mins", "search_operands", "search_operands_reference", "search_reference", "streamed",
           "streamed_checks", "streamed_shape", "supported", "traced", "in_traced_passes"]

# Tile shapes: (rows, centroids, stages, warps, group). Rows are the wgmma's M (16 per warp),
# centroids its N; the row tile stays in shared memory beside the centroid stages; ``group``:
# centroid tiles per loop iteration (see ``_search_rows``; larger groups hide more of the folds,
# but ptxas spills at 8, and at 4 with CHECK on 64-row programs). Stages 0: as many as let two
# programs share an SM (at most 4), else as many as fit (``_stages``). H200, search alone, ms
# (scripts/diag_hopper_search.py --configs, 2026-11-22; default before -> now):
# - fast: 128 rows (two warpgroups); groups of 2 where rows are short (<= 256 bytes), 4 where
#   they are 512 bytes: 1M x 64 fp32 2.03 -> 1.85, bf16 1.49 -> 1.29; 1M x 128 bf16 2.17 ->
#   1.98. At 512 bytes groups of 2 are slower (1M x 128 fp32 3.44 against 3.35, 32,768 x 256
#   bf16 0.213 against 0.206).
# - exact (CHECK: a second register a slot; since 2026-11-28 one a row and thread): 64 rows,
#   two programs an SM: 1M x 64 fp32 2.63 -> 2.43, bf16 2.16 -> 1.86 (2 stages; 1.91 at 4);
#   32,768 x 256 bf16 0.253 -> 0.234; 1M x 128 fp32 3.89 -> 3.86 and bf16 2.66 -> 2.62 (as good;
#   3 stages, one program an SM: 4.27).
#   Three programs an SM where each has room for three stages (16-bit operands up to 128
#   features), with registers capped at 168 (ptxas fits the search without spilling; uncapped it
#   takes 183-194): search alone 1M x 128 exact fp32 (fp16 operands) 3.88-3.96 -> 3.75-3.86 ms,
#   bf16 2.61-2.62 -> 2.50; exact pass 3.32-3.35 -> 3.14-3.18, 3.02-3.05 -> 2.92 (2026-11-28).
# - rows of more than 512 bytes (fp32, 129-256 features): a 128-row tile leaves room for one
#   64-centroid stage only, so 64 rows and two stages, groups of 2 (32,768 x 256, k = 8192: fast
#   0.497, exact 0.506; groups of 4 0.560 / 0.618 and spills with CHECK; 128 rows and
#   32-centroid tiles 0.654 / 0.673).
# - fp32 rows as packed fp16 operands (2026-11-27, fused pass at 1M x 128, k = 4096, fast / exact):
#   the defaults 2.48 / 3.40 ms; every pass on 64-row programs in groups of 4 (253 registers with
#   CHECK) 2.66 / 3.47; on 128-row programs in groups of 2 (one an SM with CHECK) 2.47 / 3.57.
_FAST_CONFIG = {False: (128, 64, 3, 8, 2), True: (128, 64, 3, 8, 4)}  # by rows of 512 bytes
_ONE_WARPGROUP_CONFIG = (64, 64, 0, 4, 2)
# The exact search over 16-bit operands of 128 (padded) features: programs of two warpgroups, two
# an SM (four stages each, registers capped at 128: ptxas spills 16 bytes). H200, 1M x 128 x 4,096,
# exact pass replayed, two processes each (2026-12-02, scripts/diag_second_sums.py): fp32 3.198 ->
# 3.073 ms, bf16 2.874 -> 2.821, against three one-warpgroup programs; one such program an SM
# (three stages, 148 registers) was slower, 3.334 and 3.081.
_TWO_WARPGROUP_CHECK_CONFIG = (128, 64, 0, 8, 2)
_SHARED_BYTES = 226 * 1024  # of the 227 KiB an sm_90 block may use, some left for the barriers
# Operand rows are padded to a multiple of this (any config's centroid tile divides it).
_OPERAND_ROWS = 128


def _config(size: int, d_pad: int = 128, check: bool = False) -> tuple[int, int, int, int, int]:
    """The tile shapes for rows of ``d_pad`` (padded) features of ``size`` bytes. The centroid tile
    (``[1]``) must not depend on ``check``: ``tile_bits`` and the packed operands assume it."""
    # TORCHKM_HOPPER_CONFIG=BLOCK_N,BLOCK_K,STAGES,num_warps[,GROUP] (experiments)
    spec = os.environ.get("TORCHKM_HOPPER_CONFIG")
    if check and size == 2 and d_pad == 128:
        base = _TWO_WARPGROUP_CHECK_CONFIG
    elif check or size * d_pad > 512:
        base = _ONE_WARPGROUP_CONFIG
    else:
        base = _FAST_CONFIG[size * d_pad >= 512]
    if spec:
        values = [int(v) for v in spec.split(",")]
        return (*values[:4], values[4] if len(values) > 4 else base[4])
    return base


def _padded(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _occupancy(size: int, d_pad: int, extra: int, config: tuple[int, int, int, int, int]) -> tuple[int, int]:
    """(centroid stages beside the row tile in shared memory, programs an SM). The config's
    stages, at most what fits, one program an SM assumed; for 0 (the exact search's programs),
    three programs an SM where each then has room for three stages (its registers capped to fit,
    ``search``; ``TORCHKM_HOPPER_PROGRAMS=2``: never, experiments), else two with as many stages
    as fit (at most 4), else one with as many as fit."""
    block_n, block_k, stages = config[:3]
    row_tile = block_n * (d_pad + extra) * size
    stage = block_k * (d_pad + extra) * size
    fit = (_SHARED_BYTES - row_tile) // stage
    if stages == 0:
        if os.environ.get("TORCHKM_HOPPER_PROGRAMS", "3") != "2" and (_SHARED_BYTES // 3 - row_tile) // stage >= 3:
            return 3, 3
        shared = (_SHARED_BYTES // 2 - row_tile) // stage
        return (min(4, shared), 2) if shared >= 2 else (fit, 1)
    return min(stages, fit), 1


# The streamed search (rows of more than 256 padded features, ``_streamed_kernel``): features a
# chunk, centroids a tile, tiles a group (their folds but the last overlap the next tile's first
# chunk), and at most this many stages. TORCHKM_HOPPER_STREAMED_CONFIG=BLOCK_K,BLOCK_D,STAGES,GROUP
# (experiments; STAGES 0: as many as fit).
_STREAMED_CONFIG = (64, 64, 8, 2)


def streamed_shape(d: int, size: int = 2) -> tuple[int, int, int, int, int, int] | None:
    """(rows, centroids, features a chunk, chunks, stages, group) of the streamed search over rows of
    ``d`` features of ``size`` bytes, or None where no resident row tile leaves room for three
    stages: 128 rows (two warpgroups) where they fit, else 64."""
    block_k, block_d, max_stages, group = _STREAMED_CONFIG
    spec = os.environ.get("TORCHKM_HOPPER_STREAMED_CONFIG")
    if spec:
        block_k, block_d, max_stages, group = (int(v) for v in spec.split(","))
        max_stages = max_stages or 64
    chunks = triton.cdiv(d, block_d)
    for block_n in (128, 64):
        stages = min(max_stages, (_SHARED_BYTES - block_n * chunks * block_d * size) // (block_k * block_d * size))
        if stages >= 3:
            return block_n, block_k, block_d, chunks, stages, group
    return None


# The ring search (``_ring_kernel``): (centroids a tile, features a chunk, stages at most: the fast
# mode's, the exact mode's); 128 rows a program. H100, 1M x 768 x 8,192 bf16, the search alone
# (scripts/diag_resident_search.py, 2026-12-07), folding keys: fast 18.65 ms with three stages,
# 19.18 with four; exact 24.96 and 22.97 (its third best dropped, TORCHKM_HOPPER_RING_THIRD=0:
# 22.55 and 23.27, kept). TORCHKM_HOPPER_RING_CONFIG=BLOCK_K,BLOCK_D,STAGES (both modes; experiments).
_RING_CONFIG = (256, 64, 3, 4)


def ring_shape(d: int, size: int = 2, check: bool = False) -> tuple[int, int, int, int, int]:
    """(rows, centroids, features a chunk, chunks, stages) of the ring search over rows of ``d``
    features of ``size`` bytes (``check``: the exact mode's record): each stage holds a chunk of the
    row tile and of a centroid tile."""
    block_k, block_d, fast_stages, check_stages = _RING_CONFIG
    max_stages = check_stages if check else fast_stages
    spec = os.environ.get("TORCHKM_HOPPER_RING_CONFIG")
    if spec:
        block_k, block_d, max_stages = (int(v) for v in spec.split(","))
    block_n = 128
    stages = min(max_stages, _SHARED_BYTES // ((block_n + block_k) * block_d * size))
    return block_n, block_k, block_d, triton.cdiv(d, block_d), stages


# Which search 16-bit rows of more than 256 padded features take (``TORCHKM_HOPPER_STREAMED``):
# "ring" (the default) the ring search in both modes (``TORCHKM_HOPPER_RING_EXACT=0``: the tl.dot
# search in the exact mode; Lloyd iteration at 1M x 768 x 8,192 bf16 on an H100, bench_lloyd
# 2026-12-07, with the chunk minima: 27.20 ms against 29.80); "1" the resident-row search in both;
# "0" the tl.dot search in both. H100, 1M x 768 x 8,192 bf16, fused pass with sums replayed
# (scripts/diag_resident_search.py, 2026-12-07), tl.dot / ring search: fast 26.17 / 22.00 ms, exact
# 29.24 / 29.63 (its record's runner-up and third cost the ring search 5 ms); folding keys
# (``ring_packed``, later the same day) fast 26.67 / 22.13, exact 28.64 / 29.00; the resident-row
# search was slower than the tl.dot search in both modes (the module's docstring).
STREAMED_DEFAULT = "ring"


# The ring search's fold over keys (``_ring_kernel``, PACKED): each score's column in its lowest 8
# bits, so one float minimum a score finds the tile's best and its column (sm_90 SASS a tile and
# thread: 1,192 -> 1,136 instructions fast, 2,344 -> 2,088 exact; H100, 1M x 768 x 8,192 bf16, the
# search alone: fast 19.59 -> 18.65 ms, exact 26.90 -> 22.97, 2026-12-07).
# TORCHKM_HOPPER_RING_PACKED=0: the scores as they are (A/B).
def ring_packed() -> bool:
    """Whether the ring search folds packed keys (``TORCHKM_HOPPER_RING_PACKED``, default on)."""
    return os.environ.get("TORCHKM_HOPPER_RING_PACKED", "1") != "0"


def search_chunk_mins(x: torch.Tensor, chunk: int, *, check: bool, half: bool = False) -> bool:
    """Whether ``search`` over rows ``x`` writes chunk minima (its ``chunk_mins``) of ``chunk``
    centroids: the ring search's exact record (``check``; 16-bit rows read as they are, of more than
    256 padded features, under ``TORCHKM_HOPPER_STREAMED=ring``), in chunks of whole centroid tiles."""
    if not check or half or x.dtype not in (torch.float16, torch.bfloat16) or x.dim() != 2:
        return False
    if _padded(x.shape[1]) <= 256 or _streamed_setting() != "ring":
        return False
    return chunk > 0 and chunk % ring_shape(x.shape[1], x.element_size(), check)[1] == 0


def _streamed_setting() -> str:
    return os.environ.get("TORCHKM_HOPPER_STREAMED", STREAMED_DEFAULT)


def streamed_checks(x: torch.Tensor) -> bool:
    """Whether the exact mode over ``x`` takes the streamed search too (where ``streamed``): yes, the
    ring search's exact record with its chunk minima (``search_chunk_mins``), unless
    ``TORCHKM_HOPPER_RING_EXACT=0`` (the tl.dot search, A/B)."""
    return _streamed_setting() != "ring" or os.environ.get("TORCHKM_HOPPER_RING_EXACT", "1") != "0"


def streamed(x: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether ``search`` takes ``x``'s rows through a streamed search (the ring search, or the
    resident-row one under ``TORCHKM_HOPPER_STREAMED=1``): 16-bit rows (read as they are) of more
    than 256 padded features, up to the 1,600 that ``streamed_shape`` fits; not under
    ``TORCHKM_HOPPER_STREAMED=0`` (those rows then keep the tl.dot search). In the exact mode the
    passes take it only where ``streamed_checks``."""
    if _streamed_setting() not in ("1", "ring"):
        return False
    dtype = dtype or x.dtype
    return (dtype == x.dtype and dtype in (torch.float16, torch.bfloat16) and _padded(x.shape[-1]) > 256
            and streamed_shape(x.shape[-1], dtype.itemsize) is not None)


def available() -> bool:
    """Whether this process can run the kernel: Gluon imported, a CUDA device of compute capability 9.x,
    and not the interpreter."""
    if gluon is None or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def mode() -> str | None:
    """How the assignment pass searches the rows this module supports: ``"kernel"`` where ``available``,
    else ``None`` (the ``tl.dot`` search). ``TORCHKM_HOPPER_SEARCH=0`` turns it off;
    ``TORCHKM_HOPPER_SEARCH=reference`` takes ``search_reference`` instead, on any device (tests of
    the pass's epilogue under the interpreter)."""
    setting = os.environ.get("TORCHKM_HOPPER_SEARCH", "1")
    if setting == "0":
        return None
    if setting == "reference":
        return "reference"
    return "kernel" if available() else None


def supported(x: torch.Tensor, k: int, *, scaled: bool, split: bool, row_list: bool,
              dtype: torch.dtype | None = None) -> bool:
    """Whether ``search`` takes rows ``x`` and ``k`` centroids: 16- or 32-bit rows read as they are (no
    scale, no hi + lo centroids, no row list), contiguous and 16-byte aligned as TMA needs, the
    padded row of 64 to 256 features (one tile in shared memory) or 16-bit rows that ``streamed``
    takes, and more
    than one centroid tile (one leaves nothing to overlap). The prepared centroids are contiguous
    (k, d) in x's dtype. ``dtype``: the search converts x's rows to that dtype as it loads them
    (fp16 operands for fp32 rows, ``search``'s ``half_scale``), so x's own layout does not matter."""
    if scaled or split or row_list or x.dim() != 2:
        return False
    dtype = dtype or x.dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    n, d = x.shape
    size = dtype.itemsize
    d_pad = _padded(d)
    # From 64 padded features. (16-bit rows of 17-32 features took it from 2026-11-22, when it beat
    # the tl.dot search: H200, 245,760 x 32, k = 1024, bf16, exact Lloyd iteration 0.245 against
    # 0.290-0.318 ms. Since that search's packed keys and three stages, the exact fused pass there
    # takes 0.193 ms against the Hopper search's 0.201, and 2.60 against 2.85 at 3.9M rows, H200,
    # 2026-11-29; fp32 rows converted to fp16 were slower there too, kernels v20.)
    if d_pad < 64 or (d * size) % 16 or (d_pad > 256 and not streamed(x, dtype)):
        return False
    if dtype == x.dtype and (x.stride(1) != 1 or (x.stride(0) * size) % 16 or not _aligned(x)):
        return False
    if d_pad > 256:
        return n > 0 and k > streamed_shape(d, size)[1]
    config = _config(size, d_pad)
    if min(_occupancy(size, d_pad, 16, _config(size, d_pad, check))[0] for check in (False, True)) < 2:
        return False  # an experiment's config that leaves no room for two stages
    return n > 0 and k > config[1]


def traced(x: torch.Tensor) -> bool:
    """Whether ``x`` is being traced (``torch.compile``, ``make_fx``: a fake or functional tensor)
    rather than computed on: a traced pass calls the search through ``search_in_graph``."""
    return type(x) not in (torch.Tensor, torch.nn.Parameter) or torch.compiler.is_compiling()


def in_traced_passes() -> bool:
    """Whether traced passes (torch.compile) take the search, through ``search_in_graph``:
    ``TORCHKM_HOPPER_TRACED=1`` (experiments; off by default). H200, VQ layer step at 32,768 x 256,
    8192 codes (scripts/diag_vq_graphs.py, 2026-11-22, two runs each): without CUDA graphs the op costs
    the host more than it saves the GPU (fp32 fast 1.45 ms against 1.03-1.15 with the tl.dot
    search); as CUDA graphs (mode="reduce-overhead") the step is still bound by the host and the runs
    disagree (fp32 exact 1.23 against 1.49 in both, fast 0.79-1.00 against 0.93-0.97, bf16 exact
    1.01-1.31 against 0.97-1.17). Inductor's caches do not key on this switch: give a run that flips
    it its own ``TORCHINDUCTOR_CACHE_DIR``."""
    return os.environ.get("TORCHKM_HOPPER_TRACED", "0") == "1"


def _aligned(x: torch.Tensor) -> bool:
    # A traced tensor has no address: its storage offset is what the graph fixes (allocations are
    # aligned), and the op's implementation copies a row block that arrives misaligned anyway.
    if traced(x):
        return (x.storage_offset() * x.element_size()) % 16 == 0
    return x.data_ptr() % 16 == 0


def chunk_rows(n: int, step: int, device: torch.device) -> int:
    """Rows per search launch of a pass over ``n`` rows: the pass searches and runs its epilogue one
    chunk at a time, so that the record is O(chunk) rather than O(n) (7 x 4 bytes a row: 2.8 GB at
    100M rows). 8 waves of the search's programs (one per SM, as its shared memory allows; 3.8 MB
    of record on an H200), rounded up to a multiple of ``step`` (the epilogue's rows per program); at most n rounded up. ``TORCHKM_HOPPER_CHUNK_ROWS``
    sets the rows (tests, experiments). (32 waves for the exact mode, H200, 1M x 128 x 4,096: its
    pass 1.3-1.6 % faster, not seen per Lloyd iteration, the fp32 fast pass up to 18 % slower, and
    a bf16 fit's peak memory over ``tests/test_cuda.py``'s bound; BENCHMARKS.md 2026-12-02.)"""
    spec = os.environ.get("TORCHKM_HOPPER_CHUNK_ROWS")
    if spec:
        rows = int(spec)
    else:
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        rows = 8 * sms * max(config[0] for config in _FAST_CONFIG.values())
    step = max(step, 1)
    rows = triton.cdiv(max(rows, 1), step) * step
    return min(rows, triton.cdiv(max(n, 1), step) * step)


def record_rows(check: bool) -> int:
    """Rows of ``search``'s record: best score and index; with ``check`` also the second best, its
    index, a bound on the other scores, a third candidate's index and a bound on the rest."""
    return 7 if check else 2


# Packed search (see ``packed``): the row term's margin over the row's squared norm, and the bound on
# the error of its fp32 sum into the product, relative to it.
ROW_MARGIN_VALUE = 2.0 ** -5
ROW_SLACK_VALUE = 2.0 ** -17
# The exact fold's given-up scores by additions (``_fold_tile``); ``TORCHKM_SECOND_SUMS=0``: by a
# maximum (A/B; read at import).
SECOND_SUMS_VALUE = os.environ.get("TORCHKM_SECOND_SUMS", "1") != "0"
# fp16 operands cannot hold the bias or the row term (up to 2^29 in the products' units, see
# ``centroids.HALF_TOP_EXPONENT``), so each enters as four fp16 parts, each against one of these
# powers of two on the other side: v = sum(part_i * HALF_PART_SCALES[i]), to within 2^-44 |v| + 2^-39.
HALF_PART_SCALES = (2.0 ** 15, 2.0 ** 4, 2.0 ** -7, 2.0 ** -14)
# fp16 padding centroids: the first part at fp16's largest value, a bias of about 2^31.
_HALF_PAD_PART = 65504.0
# The same as constants of the kernels (Gluon's constexpr is Triton's).
_HALF_P0, _HALF_P1, _HALF_P2, _HALF_P3 = (tl.constexpr(v) for v in HALF_PART_SCALES)
_HALF_PAD_PART_TL = tl.constexpr(_HALF_PAD_PART)


@triton.jit
def _split3(v, TF32: tl.constexpr):
    # v = hi + mid + lo exactly, each part exact in the products' operand type (tf32: 11
    # significant bits, bf16: 8), by truncation.
    keep: tl.constexpr = -8192 if TF32 else -65536
    hi = (v.to(tl.int32, bitcast=True) & keep).to(tl.float32, bitcast=True)
    rest = v - hi
    mid = (rest.to(tl.int32, bitcast=True) & keep).to(tl.float32, bitcast=True)
    return hi, mid, rest - mid


@triton.jit
def _half_part(r, scale: tl.constexpr):
    # The remainder r to fp16 in units of ``scale`` (as fp32), and what is left of it (exact).
    part = (r * (1.0 / scale)).to(tl.float16).to(tl.float32)
    return part, r - part * scale


if gluon is not None:
    ROW_MARGIN = gl.constexpr(ROW_MARGIN_VALUE)
    ROW_SLACK = gl.constexpr(ROW_SLACK_VALUE)
    SECOND_SUMS = gl.constexpr(SECOND_SUMS_VALUE)

    @gluon.jit
    def _thread_min(v):
        """Per row, the minimum of the columns one thread holds in the products' layout, as a
        (rows x 4) tensor (the 4 lanes that share a row): a thread holds adjacent pairs of columns
        and columns that differ in their high bits, so these splits move no data."""
        N: gl.constexpr = v.shape[0]
        W: gl.constexpr = v.shape[1]
        a, b = gl.split(gl.reshape(v, (N, W // 2, 2)))
        v = gl.minimum(a, b)
        for _ in gl.static_range(8):
            if v.shape[1] > 4:
                a, b = gl.split(gl.permute(gl.reshape(v, (N, 2, v.shape[1] // 2)), (0, 2, 1)))
                v = gl.minimum(a, b)
        return v

    @gluon.jit
    def _fold_tile(acc, bias, t, best_t, tile_t, second_t, CHECK: gl.constexpr, PACKED: gl.constexpr,
                   TILE_BITS: gl.constexpr):
        # The running minimum per slot (row, column of the tile) and the tile it came from: element-
        # wise work only, so its instructions are independent (a per-row reduction after every tile
        # is a chain of dependent ones, which eight warps cannot hide). Strictly better only: an
        # equal score in a later tile keeps the lower index.
        if PACKED:
            # The product already holds the bias and the row's term, so scores are distances (>= 0
            # but for rounding): the tile's number goes into their lowest bits, and one float minimum
            # keeps the slot's best with its tile, ties to the lower tile. Two instructions a score
            # instead of four; with CHECK, four instead of six.
            key = ((acc.to(gl.int32, bitcast=True) & -(1 << TILE_BITS)) | t).to(gl.float32, bitcast=True)
            new_best = gl.minimum(best_t, key)
            if CHECK:
                if SECOND_SUMS:
                    # The score the slot gives up, max(best, key), as (best - new best) + key: two
                    # additions on the FMA pipe, which the exact fold leaves idle, instead of a maximum
                    # on the ALU pipe, which it keeps busy (ncu, BENCHMARKS.md 2026-11-29). At least
                    # the new best (the rounding is monotone), exact if key >= best or key >= best / 2,
                    # else within 2^-23 of best (``_key_floor``'s EVICTED margin); a bound only, its
                    # tile bits are not read. Keys are finite, so inf - key + key stays inf. H200,
                    # exact pass replayed, means of three processes a setting (2026-12-02,
                    # scripts/diag_second_sums.py): 32,768 x 256, k = 8192, fp32 0.364 -> 0.350 ms,
                    # bf16 0.329 -> 0.311; 1M x 128, k = 4096, level (3.199 -> 3.210, 2.881 -> 2.897).
                    # (The lazy tl.dot search's fold was slower with it: 245,760 x 32, k = 1024, bf16
                    # 0.178 -> 0.191 ms; it keeps the maximum.)
                    evicted = (best_t - new_best) + key
                else:
                    evicted = gl.maximum(best_t, key)
                if CHECK == 2:
                    # One second-lowest per row over the slots this thread holds (``_thread_min``), not
                    # one a slot: the record is the same (see ``_search_rows``), in 30 registers fewer.
                    second_t = gl.minimum(second_t, _thread_min(evicted))
                else:
                    second_t = gl.minimum(second_t, evicted)
            best_t = new_best
        else:
            score = acc + gl.expand_dims(bias, 0)
            better = score < best_t
            if CHECK:  # each slot's second-lowest score too (its index is not kept)
                second_t = gl.where(better, best_t, gl.minimum(second_t, score))
            best_t = gl.where(better, score, best_t)
            tile_t = gl.where(better, t, tile_t)
        return best_t, tile_t, second_t

    @gluon.jit
    def _issue(x_op, c_smem, e_smem, ce_smem, ready, zero, t, STAGES: gl.constexpr, PACKED: gl.constexpr):
        # Tile t's product, asynchronous, once its stage is filled; packed, a second product adds
        # each centroid's bias and each row's term (parts times ones: exact terms, one fp32 sum).
        s = t % STAGES
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        acc = warpgroup_mma(x_op, c_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        if PACKED:
            acc = warpgroup_mma(e_smem, ce_smem.index(s).permute((1, 0)), acc, use_acc=True, is_async=True)
        return acc

    @gluon.jit
    def _refill(c_desc, e_desc, c_smem, ce_smem, ready, s, tile, pred, BLOCK_K: gl.constexpr, PACKED: gl.constexpr):
        if PACKED:
            mbarrier.expect(ready.index(s), c_desc.block_type.nbytes + e_desc.block_type.nbytes, pred=pred)
            _tma_load(e_desc, [tile * BLOCK_K, 0], ready.index(s), ce_smem.index(s), pred=pred)
        else:
            mbarrier.expect(ready.index(s), c_desc.block_type.nbytes, pred=pred)
        _tma_load(c_desc, [tile * BLOCK_K, 0], ready.index(s), c_smem.index(s), pred=pred)

    @gluon.jit
    def _retire(pending, c_desc, e_desc, c_smem, ce_smem, ready, bias_ptr, t, n_tiles, k, best_t, tile_t, second_t,
                OUTSTANDING: gl.constexpr, STAGES: gl.constexpr, BLOCK_K: gl.constexpr, CHECK: gl.constexpr,
                PACKED: gl.constexpr, TILE_BITS: gl.constexpr, layout: gl.constexpr):
        # Wait for tile t's product (leaving OUTSTANDING later tiles' in flight), refill its stage with
        # tile t + STAGES, and fold it in. The bias is loaded before the wait, to hide its latency.
        tile_cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
        if PACKED:
            bias = tile_cols  # unused: the product holds it
            acc = warpgroup_mma_wait(num_outstanding=2 * OUTSTANDING, deps=(pending,))
        else:
            bias = gl.load(bias_ptr + t * BLOCK_K + tile_cols, mask=t * BLOCK_K + tile_cols < k, other=float("inf"))
            acc = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=(pending,))
        # Both warpgroups' products of the stage are done before it is overwritten.
        _thread_barrier()
        refill = t + STAGES
        _refill(c_desc, e_desc, c_smem, ce_smem, ready, t % STAGES, refill, refill < n_tiles, BLOCK_K, PACKED)
        return _fold_tile(acc, bias, t, best_t, tile_t, second_t, CHECK, PACKED, TILE_BITS)

    @gluon.jit
    def _row_term(x_smem, e_smem, offset_ptr, half_ptr, d, BLOCK_N: gl.constexpr, DP: gl.constexpr,
                  EXTRA_K: gl.constexpr, HAS_OFFSET: gl.constexpr, TF32: gl.constexpr, HALF: gl.constexpr,
                  num_warps: gl.constexpr, layout: gl.constexpr):
        # The row tile's extra operand: ones against the centroids' three bias parts, then the row's
        # squared norm (centred) in three parts against their ones. With it a score is the squared
        # distance (a little more: ROW_MARGIN keeps the rounding of near-zero distances above zero,
        # where the float order of the keys would reverse). Returns the row term as added, in the
        # products' row layout. HALF (fp16 operands, the rows scaled by s): four parts each way,
        # against the powers of two HALF_PART_SCALES, in the products' s^2 units.
        rows_layout: gl.constexpr = gl.BlockedLayout([1, DP // 32], [1, 32], [num_warps, 1], [1, 0])
        xt = x_smem.load(rows_layout).to(gl.float32)
        if HAS_OFFSET:
            dims = gl.arange(0, DP, layout=gl.SliceLayout(0, rows_layout))
            mean = gl.load(offset_ptr + dims, mask=dims < d, other=0.0)
            if HALF:
                mean = mean * gl.load(half_ptr)
            xt = gl.where(gl.expand_dims(dims < d, 0), xt - gl.expand_dims(mean, 0), 0.0)
        term = gl.sum(xt * xt, axis=1)
        term = term + term * ROW_MARGIN
        e_layout: gl.constexpr = gl.BlockedLayout([1, EXTRA_K], [32, 1], [num_warps, 1], [1, 0])
        term_e = gl.convert_layout(term, gl.SliceLayout(1, e_layout))
        cols = gl.expand_dims(gl.arange(0, EXTRA_K, layout=gl.SliceLayout(0, e_layout)), 0)
        if HALF:
            p0, p1, p2, p3, added = _split_half(term_e)
            scales = gl.where(cols == 0, _HALF_P0, gl.where(cols == 1, _HALF_P1, gl.where(cols == 2, _HALF_P2,
                                                                                         gl.where(cols == 3, _HALF_P3, 0.0))))
            extra = gl.where(cols == 4, gl.expand_dims(p0, 1),
                             gl.where(cols == 5, gl.expand_dims(p1, 1),
                                      gl.where(cols == 6, gl.expand_dims(p2, 1),
                                               gl.where(cols == 7, gl.expand_dims(p3, 1), scales))))
        else:
            hi, mid, lo = _split3(term_e, TF32)
            added = hi + mid + lo
            ones = gl.where(cols < 3, 1.0, 0.0)
            extra = gl.where(cols == 3, gl.expand_dims(hi, 1),
                             gl.where(cols == 4, gl.expand_dims(mid, 1), gl.where(cols == 5, gl.expand_dims(lo, 1),
                                                                                  ones)))
        e_smem.store(extra.to(e_smem.dtype))
        fence_async_shared()
        _thread_barrier()
        return gl.convert_layout(added, gl.SliceLayout(1, layout))

    @gluon.jit
    def _split_half(v):
        # v as four fp16 parts of HALF_PART_SCALES (each the remainder so far, rounded to fp16; the
        # remainders are exact in fp32), as fp32 values, and their sum as the products add it.
        p0, r = _half_part(v, _HALF_P0)
        p1, r = _half_part(r, _HALF_P1)
        p2, r = _half_part(r, _HALF_P2)
        p3, r = _half_part(r, _HALF_P3)
        return p0, p1, p2, p3, ((p0 * _HALF_P0 + p1 * _HALF_P1) + p2 * _HALF_P2) + p3 * _HALF_P3

    @gluon.jit
    def _search_kernel(x_desc, c_desc, e_desc, x_ptr, stride_xn, stride_xd, half_ptr, bias_ptr, offset_ptr, best_ptr,
                       label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr, fourth_ptr, control_ptr, n, k, d,
                       BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, CHECK: gl.constexpr,
                       INSTR_K: gl.constexpr, GROUP: gl.constexpr, HAS_CONTROL: gl.constexpr,
                       PACKED: gl.constexpr, TILE_BITS: gl.constexpr, HAS_OFFSET: gl.constexpr, HALF: gl.constexpr,
                       CENTRED: gl.constexpr, num_warps: gl.constexpr):
        if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
            if gl.load(control_ptr) == 0:
                _search_rows(x_desc, c_desc, e_desc, x_ptr, stride_xn, stride_xd, half_ptr, bias_ptr, offset_ptr,
                             best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr, fourth_ptr, n, k, d,
                             BLOCK_N, BLOCK_K, STAGES, CHECK, INSTR_K, GROUP, PACKED, TILE_BITS, HAS_OFFSET, HALF,
                             CENTRED, num_warps)
        else:
            _search_rows(x_desc, c_desc, e_desc, x_ptr, stride_xn, stride_xd, half_ptr, bias_ptr, offset_ptr, best_ptr,
                         label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr, fourth_ptr, n, k, d, BLOCK_N,
                         BLOCK_K, STAGES, CHECK, INSTR_K, GROUP, PACKED, TILE_BITS, HAS_OFFSET, HALF, CENTRED,
                         num_warps)

    @gluon.jit
    def _half_rows(x_ptr, stride_xn, stride_xd, half_ptr, offset_ptr, x_smem, row0, n, d, BLOCK_N: gl.constexpr,
                   DP: gl.constexpr, CENTRED: gl.constexpr, num_warps: gl.constexpr):
        # fp32 rows times the pass's scale s, into the fp16 row tile (fp16 operands, see ``search``):
        # the tile stays resident for every centroid tile, so this is one read of the rows.
        # CENTRED: (x - offset) s, the fp32 difference the epilogue's direct distances take too, so
        # that fp16 rounds a row by its centred norm (``search(centred=True)``).
        rows_layout: gl.constexpr = gl.BlockedLayout([1, DP // 32], [1, 32], [num_warps, 1], [1, 0])
        rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rows_layout))
        dims = gl.arange(0, DP, layout=gl.SliceLayout(0, rows_layout))
        mask = gl.expand_dims(rows < n, 1) & gl.expand_dims(dims < d, 0)
        offsets = gl.expand_dims(rows.to(gl.int64) * stride_xn, 1) + gl.expand_dims(dims.to(gl.int64) * stride_xd, 0)
        values = gl.load(x_ptr + offsets, mask=mask, other=0.0)
        if CENTRED:
            mean = gl.load(offset_ptr + dims, mask=dims < d, other=0.0)
            values = gl.where(mask, values - gl.expand_dims(mean, 0), 0.0)
        x_smem.store((values * gl.load(half_ptr)).to(gl.float16))
        fence_async_shared()
        _thread_barrier()

    @gluon.jit
    def _search_rows(x_desc, c_desc, e_desc, x_ptr, stride_xn, stride_xd, half_ptr, bias_ptr, offset_ptr, best_ptr,
                     label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr, fourth_ptr, n, k, d,
                     BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, CHECK: gl.constexpr,
                     INSTR_K: gl.constexpr, GROUP: gl.constexpr, PACKED: gl.constexpr, TILE_BITS: gl.constexpr,
                     HAS_OFFSET: gl.constexpr, HALF: gl.constexpr, CENTRED: gl.constexpr, num_warps: gl.constexpr):
        # HALF: fp32 rows (``x_ptr``) multiplied as fp16 (``_half_rows``); ``x_desc`` is unused.
        # CENTRED (with HALF): the rows less the offset, already in the tile the row term reads.
        DP: gl.constexpr = c_desc.block_type.shape[1]
        EXTRA_K: gl.constexpr = e_desc.block_type.shape[1]
        SUBTRACT: gl.constexpr = HAS_OFFSET and not CENTRED  # the row term's centring
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_K, INSTR_K])
        row0 = gl.program_id(0) * BLOCK_N
        n_tiles = gl.cdiv(k, BLOCK_K)

        if HALF:
            x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, DP], c_desc.dtype)
            x_smem = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_N, DP], x_layout)
        else:
            x_smem = gl.allocate_shared_memory(x_desc.dtype, [BLOCK_N, DP], x_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [STAGES, BLOCK_K, DP], c_desc.layout)
        if PACKED:
            e_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, EXTRA_K], x_desc.dtype)
            e_smem = gl.allocate_shared_memory(x_desc.dtype, [BLOCK_N, EXTRA_K], e_layout)
            ce_smem = gl.allocate_shared_memory(e_desc.dtype, [STAGES, BLOCK_K, EXTRA_K], e_desc.layout)
        else:
            e_smem = x_smem
            ce_smem = c_smem
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        x_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(x_ready, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        if not HALF:
            mbarrier.expect(x_ready, x_desc.block_type.nbytes)
            _tma_load(x_desc, [row0, 0], x_ready, x_smem)
        for s in gl.static_range(STAGES):
            _refill(c_desc, e_desc, c_smem, ce_smem, ready, s, s, s < n_tiles, BLOCK_K, PACKED)
        if HALF:  # while the first centroid tiles load
            _half_rows(x_ptr, stride_xn, stride_xd, half_ptr, offset_ptr, x_smem, row0, n, d, BLOCK_N, DP, CENTRED,
                       num_warps)

        best_t = gl.full([BLOCK_N, BLOCK_K], float("inf"), gl.float32, layout)
        tile_t = gl.full([BLOCK_N, BLOCK_K], 0, gl.int32, layout)
        second_t = gl.full([BLOCK_N, BLOCK_K], float("inf"), gl.float32, layout)
        if CHECK == 2 and PACKED:
            second_t = _thread_min(second_t)
        # Tiles in groups of GROUP (>= 2): the first two issued; then each retired (the next in
        # flight) and the one after it issued; the last two retired. Each fold but the group's last
        # runs while the next product is in flight. No product is in flight across the loop's
        # back edge: a carried one would be copied at the loop's phi, reading registers a product
        # in flight writes, and ptxas then serialises every product (C7514). Each product starts
        # from ``zero`` (fresh registers).
        zero = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, layout)
        if not HALF:
            mbarrier.wait(x_ready, 0)
        if PACKED:
            row_term = _row_term(x_smem, e_smem, offset_ptr, half_ptr, d, BLOCK_N, DP, EXTRA_K, SUBTRACT,
                                 x_desc.dtype == gl.float32, HALF, num_warps, layout)
        else:
            row_term = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(1, layout))
        for p in range(n_tiles // GROUP):
            j = GROUP * p
            pending_a = _issue(x_smem, c_smem, e_smem, ce_smem, ready, zero, j, STAGES, PACKED)
            pending_b = _issue(x_smem, c_smem, e_smem, ce_smem, ready, zero, j + 1, STAGES, PACKED)
            for i in gl.static_range(GROUP - 2):
                best_t, tile_t, second_t = _retire(pending_a, c_desc, e_desc, c_smem, ce_smem, ready, bias_ptr, j + i,
                                                   n_tiles, k, best_t, tile_t, second_t, 1, STAGES, BLOCK_K, CHECK,
                                                   PACKED, TILE_BITS, layout)
                pending_a = pending_b
                pending_b = _issue(x_smem, c_smem, e_smem, ce_smem, ready, zero, j + i + 2, STAGES, PACKED)
            best_t, tile_t, second_t = _retire(pending_a, c_desc, e_desc, c_smem, ce_smem, ready, bias_ptr,
                                               j + GROUP - 2, n_tiles, k, best_t, tile_t, second_t, 1, STAGES,
                                               BLOCK_K, CHECK, PACKED, TILE_BITS, layout)
            best_t, tile_t, second_t = _retire(pending_b, c_desc, e_desc, c_smem, ce_smem, ready, bias_ptr,
                                               j + GROUP - 1, n_tiles, k, best_t, tile_t, second_t, 0, STAGES,
                                               BLOCK_K, CHECK, PACKED, TILE_BITS, layout)
        for t in range(n_tiles - n_tiles % GROUP, n_tiles):  # the last tiles, one at a time
            pending = _issue(x_smem, c_smem, e_smem, ce_smem, ready, zero, t, STAGES, PACKED)
            best_t, tile_t, second_t = _retire(pending, c_desc, e_desc, c_smem, ce_smem, ready, bias_ptr, t, n_tiles,
                                               k, best_t, tile_t, second_t, 0, STAGES, BLOCK_K, CHECK, PACKED,
                                               TILE_BITS, layout)
        mbarrier.invalidate(x_ready)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))

        if PACKED:
            # Keys back to scores (bias - 2 x.c~, the record's unit) and tiles, lowered by what the
            # keys' low bits and the row term's sum may have hidden (``_key_floor``).
            tile_t = best_t.to(gl.int32, bitcast=True) & ((1 << TILE_BITS) - 1)
            # (One floor for the best and the seconds, so that a second never falls below its slot's
            # best: the record stays the same with a second a slot or a row, see below.)
            if CHECK:
                best_t = _key_floor(best_t, row_term, TILE_BITS, SECOND_SUMS)
            else:
                best_t = _key_floor(best_t, row_term, TILE_BITS, False)
            if CHECK == 2:
                # The row's second-lowest over its slots stands for every slot's: each expression of the
                # record is a minimum over a row's slots of one value per slot, that slot's best or
                # its second, and another slot's second is never below what that slot adds itself
                # (its best, at most its second). So the record is the one per-slot seconds give.
                row_second = gl.convert_layout(gl.min(second_t, axis=1), gl.SliceLayout(1, layout))
                second_t = gl.expand_dims(row_second, 1) + gl.zeros([BLOCK_N, BLOCK_K], gl.float32, layout)
                second_t = _key_floor(second_t, row_term, TILE_BITS, SECOND_SUMS)
            elif CHECK:
                second_t = _key_floor(second_t, row_term, TILE_BITS, SECOND_SUMS)
        _store_record(best_t, tile_t, second_t, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                      fourth_ptr, row0, n, BLOCK_N, BLOCK_K, CHECK, layout)

    @gluon.jit
    def _key_floor(key_t, row_term, TILE_BITS: gl.constexpr, EVICTED: gl.constexpr):
        # A lower bound on the score a key came from (inf stays inf): the key's value without its
        # tile bits, less 2^(TILE_BITS - 22) of it (those bits, and the subtraction's rounding) and
        # ROW_SLACK of the row term (its fp32 sum into the product), less the row term. EVICTED:
        # 2^-21 of it less too, for a record whose seconds ``_fold_tile`` added up (SECOND_SUMS);
        # its bests take the same floor, so that no second falls below its slot's best.
        value = (key_t.to(gl.int32, bitcast=True) & -(1 << TILE_BITS)).to(gl.float32, bitcast=True)
        term = gl.expand_dims(row_term, 1)
        magnitude = gl.minimum(gl.abs(value), 1.0e38)
        slack = magnitude * (2.0 ** (TILE_BITS - 22)) + term * ROW_SLACK
        if EVICTED:
            slack = slack + magnitude * (2.0 ** -21)
        return value - term - slack

    @gluon.jit
    def _store_record(best_t, tile_t, second_t, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                      fourth_ptr, row0, n, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, CHECK: gl.constexpr,
                      layout: gl.constexpr):
        # Per row over the slots, as assign._tile's lazy searches: the lowest score, ties to the
        # lowest index; with CHECK the runner-up among the other slots (with its index), a lower
        # bound on everything else (third), and the best of the remaining slots (label3) with a
        # lower bound on everything but the three (fourth). A candidate that shares a slot with a
        # better one has no index: it only lowers the bounds, so the pass compares it by a
        # re-search.
        best = gl.min(best_t, axis=1)
        cols = gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout)), 0)
        index_t = tile_t * BLOCK_K + cols
        label = gl.min(gl.where(best_t == gl.expand_dims(best, 1), index_t, 2147483647), axis=1)
        rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        row_mask = rows < n
        gl.store(best_ptr + rows, best, mask=row_mask)
        gl.store(label_ptr + rows, label, mask=row_mask)
        if CHECK:
            at_best = index_t == gl.expand_dims(label, 1)
            others = gl.where(at_best, float("inf"), best_t)
            second = gl.min(others, axis=1)
            label2 = gl.min(gl.where(others == gl.expand_dims(second, 1), index_t, 2147483647), axis=1)
            at_second = index_t == gl.expand_dims(label2, 1)
            third = gl.min(gl.where(at_best | at_second, second_t, best_t), axis=1)
            second = gl.minimum(second, gl.min(gl.where(at_best, second_t, float("inf")), axis=1))
            rest = gl.where(at_best | at_second, float("inf"), best_t)
            third_best = gl.min(rest, axis=1)
            label3 = gl.min(gl.where(rest == gl.expand_dims(third_best, 1), index_t, 2147483647), axis=1)
            at_third = index_t == gl.expand_dims(label3, 1)
            fourth = gl.min(gl.where(at_best | at_second | at_third, second_t, best_t), axis=1)
            gl.store(second_ptr + rows, second, mask=row_mask)
            gl.store(label2_ptr + rows, label2, mask=row_mask)
            gl.store(third_ptr + rows, third, mask=row_mask)
            gl.store(label3_ptr + rows, gl.where(third_best < float("inf"), label3, -1), mask=row_mask)
            gl.store(fourth_ptr + rows, fourth, mask=row_mask)


    # Rows too wide for one tile in shared memory beside whole centroid tiles (16-bit rows of more
    # than 256 features): the row tile stays resident as ND chunks of BLOCK_D features, and the
    # centroid tiles stream past it chunk by chunk through a ring of STAGES (centroids x chunk)
    # stages, one product a chunk into the tile's accumulator. Why: the tl.dot search streams rows
    # and centroids alike, and at 768 features its L2 traffic set its pace (configs.assign_config);
    # a resident tile of 128 rows reads only the centroids, 1/128 operand bytes a product against
    # 1/128 + 1/256 for the tl.dot search's 128 x 256 tiles. ``streamed_shape`` sizes it.
    @gluon.jit
    def _stream_fill(c_desc, c_smem, ready, s, step, pred, ND: gl.constexpr):
        # Step ``step`` of the centroid stream (centroid tile step // ND, feature chunk step % ND).
        BLOCK_K: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_D: gl.constexpr = c_desc.block_type.shape[1]
        mbarrier.expect(ready.index(s), c_desc.block_type.nbytes, pred=pred)
        _tma_load(c_desc, [(step // ND) * BLOCK_K, (step % ND) * BLOCK_D], ready.index(s), c_smem.index(s),
                  pred=pred)

    @gluon.jit
    def _stream_issue(x_op, c_smem, ready, acc, t, use_acc, STAGES: gl.constexpr):
        # Stream step t's product of the rows' chunk ``x_op`` (shared memory), asynchronous, once the
        # step's stage is filled (the resident-row search's and the ring search's).
        s = t % STAGES
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        return warpgroup_mma(x_op, c_smem.index(s).permute((1, 0)), acc, use_acc=use_acc, is_async=True)

    @gluon.jit
    def _stream_refill(c_desc, c_smem, ready, t, steps, ND: gl.constexpr, STAGES: gl.constexpr):
        # Step t's stage, once both warpgroups' products of it are done, with step t + STAGES.
        _thread_barrier()
        _stream_fill(c_desc, c_smem, ready, t % STAGES, t + STAGES, t + STAGES < steps, ND)

    @gluon.jit
    def _stream_first(x_smem, c_smem, ready, zero, j, ND: gl.constexpr, STAGES: gl.constexpr):
        # Tile j's first chunk, issued; as a tensor (a wait that leaves it in flight): the type the
        # chunk loop carries.
        pending = _stream_issue(x_smem.index(0), c_smem, ready, zero, j * ND, False, STAGES)
        return warpgroup_mma_wait(num_outstanding=1, deps=(pending,))

    @gluon.jit
    def _stream_rest(acc, x_smem, c_desc, c_smem, ready, j, steps, ND: gl.constexpr, STAGES: gl.constexpr):
        # Chunks 1 .. ND - 1 of tile j onto its first chunk's product (in flight), each issued before
        # the previous one is retired; returns with the last one in flight. A loop, not unrolled:
        # unrolled, ptxas kept every chunk's descriptors live (255 registers and spills).
        for q in range(1, ND):
            t = j * ND + q
            acc = _stream_issue(x_smem.index(q), c_smem, ready, acc, t, True, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            _stream_refill(c_desc, c_smem, ready, t - 1, steps, ND, STAGES)
        return acc

    @gluon.jit
    def _streamed_kernel(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr,
                         label3_ptr, fourth_ptr, control_ptr, n, k, ND: gl.constexpr, STAGES: gl.constexpr,
                         GROUP: gl.constexpr, CHECK: gl.constexpr, HAS_CONTROL: gl.constexpr,
                         num_warps: gl.constexpr):
        if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
            if gl.load(control_ptr) == 0:
                _streamed_rows(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr,
                               label3_ptr, fourth_ptr, n, k, ND, STAGES, GROUP, CHECK, num_warps)
        else:
            _streamed_rows(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr,
                           label3_ptr, fourth_ptr, n, k, ND, STAGES, GROUP, CHECK, num_warps)

    @gluon.jit
    def _streamed_rows(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                       fourth_ptr, n, k, ND: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                       CHECK: gl.constexpr, num_warps: gl.constexpr):
        BLOCK_N: gl.constexpr = x_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_D: gl.constexpr = c_desc.block_type.shape[1]
        INSTR_K: gl.constexpr = 16  # 16-bit operands only
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_K, INSTR_K])
        row0 = gl.program_id(0) * BLOCK_N
        n_tiles = gl.cdiv(k, BLOCK_K)
        steps = n_tiles * ND
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [ND, BLOCK_N, BLOCK_D], x_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [STAGES, BLOCK_K, BLOCK_D], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        x_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(x_ready, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        mbarrier.expect(x_ready, ND * x_desc.block_type.nbytes)
        for q in gl.static_range(ND):
            _tma_load(x_desc, [row0, q * BLOCK_D], x_ready, x_smem.index(q))
        for s in gl.static_range(STAGES):
            _stream_fill(c_desc, c_smem, ready, s, s, s < steps, ND)

        cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout))
        best_t = gl.full([BLOCK_N, BLOCK_K], float("inf"), gl.float32, layout)
        tile_t = gl.full([BLOCK_N, BLOCK_K], 0, gl.int32, layout)
        second_t = gl.full([BLOCK_N, BLOCK_K], float("inf"), gl.float32, layout)
        zero = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, layout)
        mbarrier.wait(x_ready, 0)
        # Tiles in groups of GROUP: within a group, tile i's fold runs while tile i + 1's first chunk
        # is in flight (the group's last fold does not overlap). No product is in flight across the
        # outer loop's back edge (C7514, see ``_search_rows``).
        for p in range(n_tiles // GROUP):
            j = GROUP * p
            pending = _stream_first(x_smem, c_smem, ready, zero, j, ND, STAGES)
            for i in gl.static_range(GROUP):
                # The bias before the products, so that its latency hides behind them.
                bias = gl.load(bias_ptr + (j + i) * BLOCK_K + cols, mask=(j + i) * BLOCK_K + cols < k,
                               other=float("inf"))
                pending = _stream_rest(pending, x_smem, c_desc, c_smem, ready, j + i, steps, ND, STAGES)
                last = (j + i) * ND + ND - 1
                if i < GROUP - 1:
                    following = _stream_issue(x_smem.index(0), c_smem, ready, zero, (j + i + 1) * ND, False, STAGES)
                    acc, following = warpgroup_mma_wait(num_outstanding=1, deps=(pending, following))
                    _stream_refill(c_desc, c_smem, ready, last, steps, ND, STAGES)
                    best_t, tile_t, second_t = _fold_tile(acc, bias, j + i, best_t, tile_t, second_t, CHECK, False,
                                                          1)
                    pending = following
                else:
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(pending,))
                    _stream_refill(c_desc, c_smem, ready, last, steps, ND, STAGES)
                    best_t, tile_t, second_t = _fold_tile(acc, bias, j + i, best_t, tile_t, second_t, CHECK, False,
                                                          1)
        for j in range(n_tiles - n_tiles % GROUP, n_tiles):  # the last tiles, one at a time
            bias = gl.load(bias_ptr + j * BLOCK_K + cols, mask=j * BLOCK_K + cols < k, other=float("inf"))
            pending = _stream_first(x_smem, c_smem, ready, zero, j, ND, STAGES)
            pending = _stream_rest(pending, x_smem, c_desc, c_smem, ready, j, steps, ND, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(pending,))
            _stream_refill(c_desc, c_smem, ready, j * ND + ND - 1, steps, ND, STAGES)
            best_t, tile_t, second_t = _fold_tile(acc, bias, j, best_t, tile_t, second_t, CHECK, False, 1)
        mbarrier.invalidate(x_ready)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
        _store_record(best_t, tile_t, second_t, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                      fourth_ptr, row0, n, BLOCK_N, BLOCK_K, CHECK, layout)


    # The ring search (``TORCHKM_HOPPER_STREAMED=ring``): rows and centroids both
    # stream, a (rows x chunk, centroids x chunk) pair a stage, through one ring of stages that runs
    # on across centroid tiles, so the next tile's first chunks are loading while this tile's last
    # product and its fold run. ncu (H100, 1M x 768 x 8,192 bf16, 2026-12-07): the tl.dot search keeps
    # the tensor pipe 55 % busy (its loads restart at every centroid tile and nothing overlaps its
    # fold) and moves 4.2 TB/s from L2 against 9.7 measured; the resident-row search 53-60 %, waiting
    # on its few small stages. Here 128 x 256 products of 64 features a stage, as cuBLAS's tiles
    # (83 % busy there), three stages (144 KiB) for the fast mode, four for the exact. The fold is
    # eager (each tile's best per row, then the running best): a slot's running state would not
    # fit beside the 128-register product.
    # With CHECK the exact record's runner-up exactly (its index too) and the third best as the
    # bound on the rest, no third candidate (label3 -1).
    @gluon.jit
    def _ring_fill(x_desc, c_desc, x_smem, c_smem, ready, s, step, row0, pred, ND: gl.constexpr):
        # Step ``step``: centroid tile step // ND, feature chunk step % ND, and the rows' same chunk.
        BLOCK_K: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_D: gl.constexpr = c_desc.block_type.shape[1]
        mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + c_desc.block_type.nbytes, pred=pred)
        _tma_load(x_desc, [row0, (step % ND) * BLOCK_D], ready.index(s), x_smem.index(s), pred=pred)
        _tma_load(c_desc, [(step // ND) * BLOCK_K, (step % ND) * BLOCK_D], ready.index(s), c_smem.index(s),
                  pred=pred)

    @gluon.jit
    def _ring_refill(x_desc, c_desc, x_smem, c_smem, ready, t, steps, row0, ND: gl.constexpr, STAGES: gl.constexpr):
        # Step t's stage, once both warpgroups' products of it are done, with step t + STAGES.
        _thread_barrier()
        _ring_fill(x_desc, c_desc, x_smem, c_smem, ready, t % STAGES, t + STAGES, row0, t + STAGES < steps, ND)

    @gluon.jit
    def _with_columns(v, cols, BLOCK_K: gl.constexpr):
        # ``v`` with its lowest bits replaced by the column (``ring_packed``'s keys).
        return ((v.to(gl.int32, bitcast=True) & -BLOCK_K) | cols).to(gl.float32, bitcast=True)

    @gluon.jit
    def _key_slack(v):
        # How far a key may be from its score (``RING_KEY_SLACK``), from the key.
        return gl.abs(v) * _KEY_SLACK + 1.0e-30

    @gluon.jit
    def _ring_key_floor(v):
        # A key lowered by its slack (a bound under its score); the padding's keys become "none".
        return gl.where(v < 0.5 * _PAD_BIAS_TL, v - _key_slack(v), float("inf"))

    @gluon.jit
    def _ring_kernel(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                     fourth_ptr, min_ptr, n_mins, control_ptr, n, k, ND: gl.constexpr, STAGES: gl.constexpr,
                     CHECK: gl.constexpr, THIRD: gl.constexpr, PACKED: gl.constexpr, MIN_TILES: gl.constexpr,
                     HAS_CONTROL: gl.constexpr, num_warps: gl.constexpr):
        if HAS_CONTROL:  # a frozen iteration of a replayed block (see centroids.prepare_centroids)
            if gl.load(control_ptr) == 0:
                _ring_rows(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr,
                           label3_ptr, fourth_ptr, min_ptr, n_mins, n, k, ND, STAGES, CHECK, THIRD, PACKED,
                           MIN_TILES, num_warps)
        else:
            _ring_rows(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                       fourth_ptr, min_ptr, n_mins, n, k, ND, STAGES, CHECK, THIRD, PACKED, MIN_TILES, num_warps)

    @gluon.jit
    def _ring_rows(x_desc, c_desc, bias_ptr, best_ptr, label_ptr, second_ptr, label2_ptr, third_ptr, label3_ptr,
                   fourth_ptr, min_ptr, n_mins, n, k, ND: gl.constexpr, STAGES: gl.constexpr, CHECK: gl.constexpr,
                   THIRD: gl.constexpr, PACKED: gl.constexpr, MIN_TILES: gl.constexpr, num_warps: gl.constexpr):
        BLOCK_N: gl.constexpr = x_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_D: gl.constexpr = c_desc.block_type.shape[1]
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_K, 16])
        row0 = gl.program_id(0) * BLOCK_N
        n_tiles = gl.cdiv(k, BLOCK_K)
        steps = n_tiles * ND
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_N, BLOCK_D], x_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [STAGES, BLOCK_K, BLOCK_D], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
        for s in gl.static_range(STAGES):
            _ring_fill(x_desc, c_desc, x_smem, c_smem, ready, s, s, row0, s < steps, ND)
        cols = gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout)), 0)
        best = gl.full([BLOCK_N], float("inf"), gl.float32, gl.SliceLayout(1, layout))
        label = gl.full([BLOCK_N], 0, gl.int32, gl.SliceLayout(1, layout))
        second = best
        third = best
        label2 = label
        acc = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, layout)
        PAD: gl.constexpr = _PAD_BIAS_TL if PACKED else float("inf")
        if MIN_TILES:
            gl.static_assert(CHECK, "chunk minima: the exact record's")
            chunk_best = best
        for j in range(n_tiles):
            # The bias before the products, so that its latency hides behind them. Packed, the
            # padding centroids' scores must stay finite (an inf key's low bits would make a NaN).
            bias = gl.load(bias_ptr + j * BLOCK_K + cols, mask=j * BLOCK_K + cols < k, other=PAD)
            if PACKED and not CHECK:
                bias = _with_columns(bias, cols, BLOCK_K)
            acc = _stream_issue(x_smem.index((j * ND) % STAGES), c_smem, ready, acc, j * ND, False, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # in flight still: the loop's type
            for q in range(1, ND):
                t = j * ND + q
                acc = _stream_issue(x_smem.index(t % STAGES), c_smem, ready, acc, t, True, STAGES)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                _ring_refill(x_desc, c_desc, x_smem, c_smem, ready, t - 1, steps, row0, ND, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _ring_refill(x_desc, c_desc, x_smem, c_smem, ready, j * ND + ND - 1, steps, row0, ND, STAGES)
            # The tile's best per row (lowest column on ties), then the running best: strictly
            # better only, so an equal score in a later tile keeps the lower index. The scores
            # overwrite the product, whose registers the next tile's first product takes over.
            acc = acc + bias
            if PACKED:
                # The column in the score's lowest bits: one float minimum a score finds both.
                # Fast mode: one bitwise select a score, the column taken from the bias's low bits
                # (set once a tile; its value moves by under 2^-15 of itself, far inside the
                # centroids' bf16 rounding). Exact: the bias as it is, the column set in two steps.
                if CHECK:
                    acc = _with_columns(acc, cols, BLOCK_K)
                else:  # (asm: the compiler would see through the bias to the columns, two steps again)
                    acc = gl.inline_asm_elementwise("lop3.b32 $0, $1, $2, 0xFFFFFF00, 0xE4;", "=r,r,r",
                                                    [acc, bias], dtype=gl.float32, is_pure=True, pack=1)
                m1 = gl.min(acc, axis=1)
                i1 = m1.to(gl.int32, bitcast=True) & (BLOCK_K - 1)
            else:
                m1 = gl.min(acc, axis=1)
                i1 = gl.min(gl.where(acc == gl.expand_dims(m1, 1), cols, 2147483647), axis=1)
            new = m1 < best
            if MIN_TILES:
                # Each row's lowest score in every MIN_TILES tiles (``search``'s ``chunk_mins``), so
                # that the candidate re-search scores a deferred row again only in the chunks that
                # could hold a winner. A key is lowered by its slack: a minimum bounds its scores.
                chunk_best = gl.minimum(chunk_best, m1)
                if (j + 1) % MIN_TILES == 0 or j == n_tiles - 1:
                    if PACKED:
                        chunk_best = _ring_key_floor(chunk_best)
                    min_rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
                    gl.store(min_ptr + min_rows.to(gl.int64) * n_mins + j // MIN_TILES, chunk_best, mask=min_rows < n)
                    chunk_best = gl.full([BLOCK_N], float("inf"), gl.float32, gl.SliceLayout(1, layout))
            if CHECK:
                # The tile's runner-up (with its column) and third best, each with the columns
                # above it masked out; then the running best three (the third as a value only): of
                # two equal contenders the earlier tile's (lower index) ranks first.
                if PACKED:  # keys are distinct within a tile
                    acc = gl.where(acc == gl.expand_dims(m1, 1), float("inf"), acc)
                    m2 = gl.min(acc, axis=1)
                    i2 = m2.to(gl.int32, bitcast=True) & (BLOCK_K - 1)
                    if THIRD:
                        m3 = gl.min(gl.where(acc == gl.expand_dims(m2, 1), float("inf"), acc), axis=1)
                    else:
                        m3 = m2
                else:
                    acc = gl.where(cols == gl.expand_dims(i1, 1), float("inf"), acc)
                    m2 = gl.min(acc, axis=1)
                    i2 = gl.min(gl.where(acc == gl.expand_dims(m2, 1), cols, 2147483647), axis=1)
                    if THIRD:
                        m3 = gl.min(gl.where(cols == gl.expand_dims(i2, 1), float("inf"), acc), axis=1)
                    else:  # the tile's runner-up as the bound on its third: three operations a score fewer
                        m3 = m2
                kept = gl.where(new, best, second)
                kept_label = gl.where(new, label, label2)
                taken = gl.where(new, m2, m1)
                taken_label = j * BLOCK_K + gl.where(new, i2, i1)
                keeps = kept <= taken
                third = gl.where(new, gl.where(keeps, gl.minimum(second, m2), gl.minimum(best, m3)),
                                 gl.where(keeps, gl.minimum(third, m1), gl.minimum(second, m2)))
                second = gl.where(keeps, kept, taken)
                label2 = gl.where(keeps, kept_label, taken_label)
            best = gl.where(new, m1, best)
            label = gl.where(new, j * BLOCK_K + i1, label)
        if PACKED:
            # A key is its score give or take 2^-15 of either (the cleared bits, within one
            # binade): the record's values are moved by that much so that they bound the scores.
            # The fast record's best is lowered (as the packed tl.dot search's); the exact one's
            # raised, the others lowered, so that the epilogue's bounds, which take this record's
            # values as scores (``packed`` is off here: no lowering), hold; the padding's keys
            # become "none".
            if CHECK:
                best = best + _key_slack(best)
                second = _ring_key_floor(second)
                third = _ring_key_floor(third)
            else:
                best = best - _key_slack(best)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
        rows = row0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        row_mask = rows < n
        gl.store(best_ptr + rows, best, mask=row_mask)
        gl.store(label_ptr + rows, label, mask=row_mask)
        if CHECK:
            # No third candidate: the bound on the rest is the third's.
            gl.store(second_ptr + rows, second, mask=row_mask)
            gl.store(label2_ptr + rows, label2, mask=row_mask)
            gl.store(third_ptr + rows, third, mask=row_mask)
            gl.store(label3_ptr + rows, gl.full([BLOCK_N], -1, gl.int32, gl.SliceLayout(1, layout)), mask=row_mask)
            gl.store(fourth_ptr + rows, third, mask=row_mask)


_GL_DTYPE = {}


def _gl_dtype(dtype: torch.dtype):
    if not _GL_DTYPE:
        _GL_DTYPE.update({torch.float32: gl.float32, torch.float16: gl.float16, torch.bfloat16: gl.bfloat16})
    return _GL_DTYPE[dtype]


# Packed search: at most this many bits of a key hold its tile (k <= 65,536 at 64 centroids a tile),
# so the score keeps at least 13 of its 23 fraction bits.
_MAX_TILE_BITS = 10
# The bias of the padding centroids of the last tile (the packed search reads them: they must lose).
_PAD_BIAS = 1.0e30
_PAD_BIAS_TL = tl.constexpr(_PAD_BIAS)
# The ring search's keys (``ring_packed``): a key differs from its score by less than 2^-15 of
# either's magnitude (8 low bits of 23 replaced, same binade); 2^-22 more for the adjustment's own
# rounding (and an absolute 1e-30 for subnormal scores).
RING_KEY_SLACK = 2.0**-15 + 2.0**-22
_KEY_SLACK = tl.constexpr(RING_KEY_SLACK)


def extra_k(dtype: torch.dtype) -> int:
    """Columns of the packed search's extra operands: one product's K (8 tf32, 16 bf16 values)."""
    return 8 if dtype == torch.float32 else 16


def tile_bits(k: int, size: int, d: int = 128) -> int:
    """Bits of a packed key that hold its centroid tile (rows of ``d`` features, ``size`` bytes each)."""
    return max(1, (triton.cdiv(k, _config(size, _padded(d))[1]) - 1).bit_length())


def packed(x: torch.Tensor, k: int, *, half: bool = False) -> bool:
    """Whether ``search`` packs each slot's tile into its score's low bits (``_fold_tile``): float32
    and bfloat16 rows (the bias and row term need an operand type with fp32's range, or, for fp32
    rows multiplied as fp16 (``half``), parts against powers of two), at most 2^10 centroid tiles.
    ``TORCHKM_HOPPER_PACKED=0`` turns it off (A/B); ``TORCHKM_HOPPER_PACKED=no-half`` only for
    fp16 operands.

    The record then differs from the unpacked search's in its values only: each score (and each
    bound) is lowered by at most ``1.5 * 2^(b - 22) |s + t| + 2^-17 t`` (the cleared bits, up to
    ``2^(b - 23) |s + t|``, then ``_key_floor``'s margin for them; ``b = tile_bits``, ``t`` the
    row's term, about ``1.03 ||x - offset||^2``; with ``check`` and ``SECOND_SUMS``, another
    ``2^-21 |s + t|``), and scores that agree to within the cleared bits tie, to the lower index.
    The exact pass's bound counts the extra operands' terms in its fp32 sum
    (``assign.score_bound_coefficients(dtype, d + 8)``)."""
    setting = os.environ.get("TORCHKM_HOPPER_PACKED", "1")
    if setting == "0" or (half and setting == "no-half") or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if half and x.dtype != torch.float32:
        return False
    if _padded(x.shape[-1]) > 256:  # the streamed search folds scores as they are (``_fold_tile``)
        return False
    return tile_bits(k, x.element_size(), x.shape[-1]) <= _MAX_TILE_BITS


@triton.jit
def _operands_kernel(bias_ptr, out_ptr, k, k_pad, EXTRA_K: tl.constexpr, TF32: tl.constexpr, HALF: tl.constexpr,
                     BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, EXTRA_K)[None, :]
    if HALF:
        bias = tl.load(bias_ptr + rows, mask=rows < k, other=0.0)
        p0, r = _half_part(bias, _HALF_P0)
        p1, r = _half_part(r, _HALF_P1)
        p2, r = _half_part(r, _HALF_P2)
        p3, r = _half_part(r, _HALF_P3)
        p0 = tl.where(rows < k, p0, _HALF_PAD_PART_TL)
        scales = tl.where(cols == 4, _HALF_P0, tl.where(cols == 5, _HALF_P1, tl.where(
            cols == 6, _HALF_P2, tl.where(cols == 7, _HALF_P3, 0.0))))
        value = tl.where(cols == 0, p0[:, None], tl.where(cols == 1, p1[:, None], tl.where(
            cols == 2, p2[:, None], tl.where(cols == 3, p3[:, None], scales))))
    else:
        bias = tl.load(bias_ptr + rows, mask=rows < k, other=_PAD_BIAS_TL)
        hi, mid, lo = _split3(bias, TF32)
        value = tl.where(cols == 0, hi[:, None], tl.where(cols == 1, mid[:, None], tl.where(
            cols == 2, lo[:, None], tl.where(cols < 6, 1.0, 0.0))))
    tl.store(out_ptr + rows[:, None] * EXTRA_K + cols, value.to(out_ptr.dtype.element_ty), mask=(rows < k_pad)[:, None])


def search_operands(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The packed search's centroid-side extra operand, (k rounded up to 128, ``extra_k``) in
    ``dtype``: per centroid its fp32 bias in three parts exact in the product's operand type
    (tf32 or bf16: ``hi + mid + lo == bias``), then three ones (against the row term's parts), then
    zeros. Padding centroids (up to a multiple of every config's centroid tile) get ``_PAD_BIAS``.

    float16 (fp16 operands, ``bias`` in their s^2 units, below 2^31 in magnitude): four parts,
    ``bias == sum(part_i * HALF_PART_SCALES[i])`` to within 2^-44 |bias| + 2^-39, then the four
    scales (against the row term's parts); padding centroids get a first part of 65504 (a bias of
    about 2^31, above any real score + row term: below 2^29)."""
    k = bias.shape[0]
    k_pad = triton.cdiv(k, _OPERAND_ROWS) * _OPERAND_ROWS
    out = torch.empty(k_pad, extra_k(dtype), dtype=dtype, device=bias.device)
    block = 64
    _operands_kernel[(triton.cdiv(k_pad, block),)](bias, out, k, k_pad, EXTRA_K=extra_k(dtype),
                                                   TF32=dtype == torch.float32, HALF=dtype == torch.float16,
                                                   BLOCK=block)
    return out


def search_operands_reference(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``search_operands`` in torch."""
    k = bias.shape[0]
    k_pad = -(-k // _OPERAND_ROWS) * _OPERAND_ROWS
    if dtype == torch.float16:
        out = torch.zeros(k_pad, extra_k(dtype), dtype=torch.float32, device=bias.device)
        rest = bias.float()
        for i, scale in enumerate(HALF_PART_SCALES):
            part = (rest * (1.0 / scale)).half().float()
            out[:k, i] = part
            rest = rest - part * scale
            out[:, 4 + i] = scale
        out[k:, 0] = _HALF_PAD_PART
        return out.half()
    full = torch.full((k_pad,), _PAD_BIAS, dtype=torch.float32, device=bias.device)
    full[:k] = bias
    keep = -8192 if dtype == torch.float32 else -65536
    hi = (full.view(torch.int32) & keep).view(torch.float32)
    mid = ((full - hi).view(torch.int32) & keep).view(torch.float32)
    lo = full - hi - mid
    out = torch.zeros(k_pad, extra_k(dtype), dtype=torch.float32, device=bias.device)
    out[:, 0], out[:, 1], out[:, 2] = hi, mid, lo
    out[:, 3:6] = 1.0
    return out.to(dtype)


def search_reference(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, *, check: bool,
                     control: torch.Tensor | None = None, half_scale: torch.Tensor | None = None,
                     offset: torch.Tensor | None = None, centred: bool = False,
                     chunk_mins: torch.Tensor | None = None, min_chunk: int = 0) -> None:
    """``search`` in torch (fp32 products, an (n, k) score matrix: small sizes only); the same record,
    ties to the lowest index, with the scores' own values (as the unpacked search's), and the chunk
    minima where asked for."""
    if control is not None and int(control.reshape(-1)[0]) != 0:
        return
    n = x.shape[0]
    if half_scale is not None:
        x = ((x - offset) * half_scale[0] if centred else x * half_scale[0]).half()
    scores = bias[None, :] + x.float() @ c_mma.float().T
    values, order = torch.sort(scores, dim=1, stable=True)
    labels = out.view(torch.int32)
    out[0, :n] = values[:, 0]
    labels[1, :n] = order[:, 0].to(torch.int32)
    if check:
        out[2, :n] = values[:, 1]
        labels[3, :n] = order[:, 1].to(torch.int32)
        out[4, :n] = values[:, 2]
        labels[5, :n] = torch.where(values[:, 2].isinf(), -1, order[:, 2]).to(torch.int32)
        out[6, :n] = values[:, 3] if values.shape[1] > 3 else float("inf")
    if chunk_mins is not None:
        n_mins = triton.cdiv(scores.shape[1], min_chunk)
        padded = torch.nn.functional.pad(scores, (0, n_mins * min_chunk - scores.shape[1]), value=float("inf"))
        chunk_mins[:n * n_mins] = padded.view(n, n_mins, min_chunk).amin(dim=2).reshape(-1)


def _check_mode(check: bool, is_packed: bool) -> int:
    """``_search_kernel``'s CHECK: 0 none; 2 (packed) one second-lowest per row and thread; 1 one per
    slot (unpacked, or ``TORCHKM_HOPPER_ROW_SECOND=0``: experiments)."""
    if not check:
        return 0
    return 2 if is_packed and os.environ.get("TORCHKM_HOPPER_ROW_SECOND", "1") != "0" else 1


def search(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, *, check: bool,
           control: torch.Tensor | None = None, offset: torch.Tensor | None = None,
           operands: torch.Tensor | None = None, half_scale: torch.Tensor | None = None,
           centred: bool = False, chunk_mins: torch.Tensor | None = None, min_chunk: int = 0) -> None:
    """Write each row's search result into the first n columns of ``out`` (float32, (``record_rows``,
    m >= n), rows contiguous): rows 0-1 are the best score and its index (int32 bits); with
    ``check`` rows 2-6 are the second best and its index, a lower bound on every other score (the
    third best), a third candidate's index (-1: none) and a lower bound on every score but those
    three. ``c_mma``: the prepared (k, d) centroids of the fast pass
    (x's dtype, pre-scaled by -2), ``bias`` their fp32 (k,) bias, ``offset`` the rows' (d,) offset
    folded into it (None: zero). ``control``: an int32 word; the
    launch does nothing unless it is 0 (a frozen iteration of a replayed block). Where ``packed``,
    ``operands`` is ``search_operands(bias, x.dtype)`` (computed here if None) and the values are
    lowered as ``packed`` states. ``half_scale`` (``centroids.Prepared.half_scale``): fp32 rows,
    multiplied as fp16 operands; each program converts its row tile, times ``half_scale[0]``, as it
    loads it (any strides), ``c_mma`` and ``bias`` are the preparation's fp16 ones, and the record
    is in their units (``half_scale[0]^2`` times the scores'), packed as ``packed(x, k, half=True)``.
    ``centred`` (with ``half_scale`` and ``offset``; the exact passes' default, ``TORCHKM_CENTRED_OPERANDS=0`` off):
    each row tile is converted as (x - offset) s, so fp16 rounds a row by its centred norm, and
    ``bias`` is then ``||c~||^2`` alone (``centroids.Prepared.bias_centred``), not ``||c~||^2 + 2 m.c~``. Call only where
    ``supported`` (with ``dtype=torch.float16`` for ``half_scale``). ``chunk_mins`` (where
    ``search_chunk_mins(x, min_chunk, check=check)``): float32, (n, cdiv(k, ``min_chunk``)) row-major,
    receiving a lower bound on each row's scores in every run of ``min_chunk`` centroids, the last
    run shorter (as the eager tl.dot search's ``CHUNK_MINS``, for the candidate re-search). Under
    ``TORCHKM_HOPPER_SEARCH=reference``, ``search_reference``."""
    if out.dim() != 2 or out.shape[0] < record_rows(check) or out.shape[1] < x.shape[0] or out.stride(1) != 1:
        raise ValueError(f"search record: expected ({record_rows(check)}, >= {x.shape[0]}) float32 with contiguous "
                         f"rows, got {tuple(out.shape)}")
    half = half_scale is not None
    if half and (x.dtype != torch.float32 or c_mma.dtype != torch.float16):
        raise ValueError(f"fp16 operands (half_scale) take float32 rows and float16 centroids, got {x.dtype} and "
                         f"{c_mma.dtype}")
    if centred and (not half or offset is None):
        raise ValueError("centred operands are fp16 ones (half_scale) of rows less an offset")
    if chunk_mins is not None:
        n_mins = triton.cdiv(c_mma.shape[0], max(1, min_chunk))
        if not search_chunk_mins(x, min_chunk, check=check, half=half):
            raise ValueError(f"chunk minima of {min_chunk} centroids: only the ring search's exact record (16-bit "
                             f"rows of over 256 padded features, chunks of whole {ring_shape(x.shape[1])[1]}-"
                             f"centroid tiles), got {x.dtype} rows of {x.shape[1]} features, check={check}")
        if chunk_mins.dtype != torch.float32 or not chunk_mins.is_contiguous() or chunk_mins.numel() < x.shape[0] * n_mins:
            raise ValueError(f"chunk minima: expected contiguous float32 of at least {x.shape[0] * n_mins} values, "
                             f"got {chunk_mins.dtype} {tuple(chunk_mins.shape)}")
    if mode() == "reference":
        search_reference(x, c_mma, bias, out, check=check, control=control, half_scale=half_scale, offset=offset,
                         centred=centred, chunk_mins=chunk_mins, min_chunk=min_chunk)
        return
    n, d = x.shape
    k = c_mma.shape[0]
    if not half and _padded(d) > 256:
        if _streamed_setting() == "ring":
            _search_ring(x, c_mma, bias, out, check=check, control=control, chunk_mins=chunk_mins,
                         min_chunk=min_chunk)
        else:
            _search_streamed(x, c_mma, bias, out, check=check, control=control)
        return
    rows_dtype = c_mma.dtype if half else x.dtype
    size = rows_dtype.itemsize
    d_pad = _padded(d)
    config = _config(size, d_pad, check)
    block_n, block_k, _, warps, group = config
    is_packed = packed(x, k, half=half)
    extra = extra_k(rows_dtype) if is_packed else 0
    # As many centroid stages as fit beside the row tile (``supported`` saw that two do).
    stages, programs = _occupancy(size, d_pad, extra, config)
    # Registers capped so that the programs the shared memory was sized for fit an SM: ptxas takes
    # more unless told (183-194 a thread for one warpgroup with CHECK), and the search fits three
    # one-warpgroup programs' 168 without spilling. Two such programs need no cap; two of two
    # warpgroups (``_TWO_WARPGROUP_CHECK_CONFIG``) get 128.
    registers = 65536 // (programs * warps * 32) // 8 * 8
    options = {"maxnreg": registers} if programs > 1 and registers < 255 else {}
    dtype = _gl_dtype(rows_dtype)
    c_layout = gl.NVMMASharedLayout.get_default_for([block_k, d_pad], dtype)
    c_desc = TensorDescriptor(c_mma, list(c_mma.shape), list(c_mma.stride()), [block_k, d_pad], c_layout)
    if half:
        x_desc = c_desc  # unused: the kernel loads the rows itself
    else:
        x_layout = gl.NVMMASharedLayout.get_default_for([block_n, d_pad], dtype)
        x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [block_n, d_pad], x_layout)
    if is_packed:
        if operands is None:
            operands = search_operands(bias, rows_dtype)
        e_layout = gl.NVMMASharedLayout.get_default_for([block_k, extra], dtype)
        e_desc = TensorDescriptor(operands, list(operands.shape), list(operands.stride()), [block_k, extra], e_layout)
    else:
        e_desc = c_desc  # unused
    _search_kernel[(triton.cdiv(n, block_n),)](
        x_desc, c_desc, e_desc, x, x.stride(0), x.stride(1), half_scale if half else bias, bias,
        bias if offset is None else offset, *_record_rows(out, check), bias if control is None else control, n, k, d,
        BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, CHECK=_check_mode(check, is_packed), INSTR_K=32 // size,
        GROUP=group,
        HAS_CONTROL=control is not None, PACKED=is_packed, TILE_BITS=tile_bits(k, size, d) if is_packed else 1,
        HAS_OFFSET=offset is not None and is_packed, HALF=half, CENTRED=centred, num_warps=warps, **options,
    )


def _record_rows(out: torch.Tensor, check: bool) -> tuple[torch.Tensor, ...]:
    """The record's seven rows as the kernels take them (best, label, second, label2, third, label3,
    fourth; labels as int32 bits). Without ``check`` rows 2-6 are never written: those pointers go
    to row 0 (any valid address)."""
    labels = out.view(torch.int32)
    if check:
        return out[0], labels[1], out[2], labels[3], out[4], labels[5], out[6]
    return out[0], labels[1], out[0], labels[0], out[0], labels[0], out[0]


def _search_streamed(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, *, check: bool,
                     control: torch.Tensor | None) -> None:
    """``search`` over 16-bit rows of more than 256 padded features (``_streamed_kernel``)."""
    n, d = x.shape
    block_n, block_k, block_d, chunks, stages, group = streamed_shape(d, x.element_size())
    dtype = _gl_dtype(x.dtype)
    x_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_d], dtype)
    c_layout = gl.NVMMASharedLayout.get_default_for([block_k, block_d], dtype)
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [block_n, block_d], x_layout)
    c_desc = TensorDescriptor(c_mma, list(c_mma.shape), list(c_mma.stride()), [block_k, block_d], c_layout)
    _streamed_kernel[(triton.cdiv(n, block_n),)](
        x_desc, c_desc, bias, *_record_rows(out, check), bias if control is None else control, n, c_mma.shape[0],
        ND=chunks, STAGES=stages, GROUP=group, CHECK=1 if check else 0, HAS_CONTROL=control is not None,
        num_warps=block_n // 16)


def _search_ring(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, *, check: bool,
                 control: torch.Tensor | None, chunk_mins: torch.Tensor | None = None, min_chunk: int = 0) -> None:
    """``search`` over 16-bit rows of more than 256 padded features (``_ring_kernel``)."""
    n, d = x.shape
    block_n, block_k, block_d, chunks, stages = ring_shape(d, x.element_size(), check)
    n_mins = triton.cdiv(c_mma.shape[0], min_chunk) if chunk_mins is not None else 0
    dtype = _gl_dtype(x.dtype)
    x_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_d], dtype)
    c_layout = gl.NVMMASharedLayout.get_default_for([block_k, block_d], dtype)
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [block_n, block_d], x_layout)
    c_desc = TensorDescriptor(c_mma, list(c_mma.shape), list(c_mma.stride()), [block_k, block_d], c_layout)
    _ring_kernel[(triton.cdiv(n, block_n),)](
        x_desc, c_desc, bias, *_record_rows(out, check), bias if chunk_mins is None else chunk_mins, n_mins,
        bias if control is None else control, n, c_mma.shape[0],
        ND=chunks, STAGES=stages, CHECK=check, THIRD=check and os.environ.get("TORCHKM_HOPPER_RING_THIRD") != "0",
        PACKED=ring_packed(), MIN_TILES=min_chunk // block_k if chunk_mins is not None else 0,
        HAS_CONTROL=control is not None, num_warps=block_n // 16)


def _search_op_impl(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, records: torch.Tensor, slot: int,
                    check: bool, control: torch.Tensor | None, offset: torch.Tensor | None) -> None:
    # TMA reads 16-byte aligned rows; a compiled graph may hand over a view it did not align.
    x, c_mma = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, c_mma))
    search(x, c_mma, bias, records[slot], check=check, control=control, offset=offset)


# ``torchkm::hopper_search``: the search as an op that torch.compile keeps opaque (Gluon kernels
# cannot be traced as ``wrap_triton`` kernels are), writing ``records[slot]``. The schema is
# spelled out so that it does not depend on how a torch version reads annotations.
_search_op = None
if hasattr(torch.library, "custom_op"):
    _search_op = torch.library.custom_op(
        "torchkm::hopper_search", _search_op_impl, mutates_args=("records",),
        schema="(Tensor x, Tensor c_mma, Tensor bias, Tensor(a!) records, int slot, bool check, Tensor? control, "
               "Tensor? offset) -> ()",
    )
    _search_op.register_fake(lambda *args: None)


def search_in_graph(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, records: torch.Tensor, slot: int, *,
                    check: bool, control: torch.Tensor | None = None, offset: torch.Tensor | None = None) -> None:
    """``search`` into ``records[slot]`` (``records``: float32 (slots, ``record_rows``, m >= n), its own
    tensor, not a view) through ``torch.ops.torchkm.hopper_search``, for passes being traced: the
    op is opaque to ``torch.compile`` and replays in CUDA graphs. ``search_operands`` runs inside it."""
    if _search_op is None:
        raise RuntimeError("the Hopper search needs torch.library.custom_op (torch >= 2.4) to be traced")
    torch.ops.torchkm.hopper_search(x, c_mma, bias, records, slot, check, control, offset)
