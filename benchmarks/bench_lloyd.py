"""Time per Lloyd iteration on the GPU: torchkm's kernels vs a torch dense baseline, flash-kmeans and the floor.

Correctness first: on every workload (fresh random data each run) the fused pass of the exact mode
runs into a poisoned label buffer, then its labels are checked against a float64 argmin on 8192
sampled rows and its per-cluster sums against torch's ``index_add_`` of those labels; only then
is anything timed.

Per iteration means one assignment of every row plus the centroid update (and for torchkm the
statistics and its host sync per graph block), measured differentially: (time of 1 + B + R
iterations - time of 1 + B iterations) / R, B the Lloyd loop's graph block (8) for torchkm and 1
for the others, so set-up costs (flash-kmeans' ||x||^2 pass, torchkm's final assignment and graph
capture) cancel. Where a fit converges inside the timed iterations (no label changed; in any
repeat of either run, at its last iteration too), the time is the longer run's whole time over the
iterations it ran (an upper bound: set-up, capture and
the host's work on empty clusters included), marked ``*`` in the table (``converged_at`` in the
JSON); ``scripts/diag_hopper_search.py`` times the pass alone. torchkm's dense fits are then timed
again with smaller graph blocks, whose runs end before the fit converges (``lloyd_per_iteration``;
the block in the JSON as ``ours_exact_block``, marked ``b`` in the table).
``algorithm="pruned"`` is timed the same way where it has an engine: the box engine (d <= 3, after
``check_pruned``) and the bounds engine (d > 8 and n k d < 1e12, after ``check_bounds``: each of 12
passes' labels against float64). Its time per iteration is an average over the timed iterations,
whose cost falls as rows settle.
All runs start from the same centroids (rows of x). Floors: 2 n k d FLOPs at the measured tf32 /
bf16 GEMM rate, or reading x once at the measured copy bandwidth, whichever is larger.

    python benchmarks/bench_lloyd.py --json out/bench_lloyd.json [--only NAME ...] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from typing import NamedTuple

import torch
import triton
from torchkm._kernels.assign import assign as kernel_assign
from triton.testing import do_bench

from torchkm import _loop, _ops
from torchkm._distributed import Comm
from torchkm._reference import DataView

WORKLOADS = [  # (name, n, d, k): DESIGN.md section 4, plus the vocabulary-scale case of issue 3
    ("seed000-A", 245_760, 32, 32),
    ("seed000-B", 245_760, 32, 1024),
    ("seed000-A16", 3_932_160, 32, 32),  # seed 000's groups at 16x the points (issue 4's benchmark sizes)
    ("seed000-B16", 3_932_160, 32, 1024),
    ("100Mx2", 100_000_000, 2, 32),
    ("SIFT-like", 1_000_000, 128, 4096),
    ("embeddings", 1_000_000, 768, 8192),
    ("VQ-batch", 32_768, 256, 8192),
    ("vocab-64k", 10_000_000, 128, 65_536),
]


def select_workloads(only: list[str] | None, extra: list[str]) -> list[tuple[str, int, int, int]]:
    """The workloads a run takes: ``WORKLOADS`` named in ``only`` (all of them when ``only`` is None
    and there are no extras), then each ``extra`` spec ``NAME=n,d,k``."""
    extras = []
    for spec in extra:
        name, _, dims = spec.partition("=")
        n, d, k = (int(v) for v in dims.split(","))
        extras.append((name, n, d, k))
    named = WORKLOADS if only is None and not extras else [w for w in WORKLOADS if w[0] in (only or [])]
    return list(named) + extras


def ms(fn) -> float:
    return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))


def ceilings() -> dict[str, float]:
    x = torch.randn(256 * 2**20, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    copy_tbs = 2 * x.numel() * 4 / (ms(lambda: y.copy_(x)) * 1e-3) / 1e12
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    flops = 2 * 8192**3
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = flops / (ms(lambda: a @ b) * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    fp32 = flops / (ms(lambda: a @ b) * 1e-3) / 1e12
    ah, bh = a.bfloat16(), b.bfloat16()
    bf16 = flops / (ms(lambda: ah @ bh) * 1e-3) / 1e12
    return {"copy_TBps": copy_tbs, "fp32_TFLOPs": fp32, "tf32_TFLOPs": tf32, "bf16_TFLOPs": bf16}


class Timing(NamedTuple):
    ms: float  # per iteration
    converged_at: int | None  # the fit stopped at this iteration, inside the timed run (see per_iteration)


def per_iteration(run, iters: int, block: int = 1) -> Timing:
    """Differential time of one iteration: run(n) performs up to n iterations (synchronised inside)
    and returns None (it ran n) or ``(ran, converged)``: how many it ran and whether it met a
    stopping rule. The two timed runs take 1 + block and 1 + block (1 + m) iterations, m * block >=
    iters: with ``block`` the Lloyd loop's graph block, both capture the same graphs (the first
    iteration runs eagerly, then whole blocks), so capture cancels.

    A fit that converges inside a timed run stops there, and one that converges at its last
    iteration skips the final assignment the others run: a difference would then mix frozen or
    missing work into it. So where any repeat of either run converged, the time is the longer run's
    whole time over the iterations it ran (an upper bound), and ``converged_at`` says where.
    """
    def timed(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        done = run(n)
        torch.cuda.synchronize()
        ran, converged = (n, False) if done is None else done
        return time.perf_counter() - t0, ran, converged
    timed(2)  # compile / autotune / warm caches
    first = timed(2)[0]
    # Best of several: short runs (32,768 rows: a few ms) differ by tens of microseconds between
    # repeats, as much as the differences measured. (Repeats of one run can converge at different
    # iterations: the sums' float atomics move the centroids by roundings.)
    repeats = 15 if first < 0.1 else 5 if first < 0.5 else 2 if first < 2.0 else 1
    n_base = 1 + block
    n_full = n_base + block * -(-iters // block)
    base_runs = [timed(n_base) for _ in range(repeats)]
    full_runs = [timed(n_full) for _ in range(repeats)]
    if any(converged for _, _, converged in base_runs + full_runs):
        return Timing(min(t / r for t, r, _ in full_runs) * 1e3, min(r for _, r, _ in full_runs))
    return Timing((min(full_runs)[0] - min(base_runs)[0]) / (n_full - n_base) * 1e3, None)


def lloyd_per_iteration(run, iters: int) -> tuple[Timing, int]:
    """``per_iteration`` of a torchkm fit at the Lloyd loop's graph block; where the fit converges
    inside the longer run, again with half the block (its runs take 1 + b and 1 + b (1 + m)
    iterations), down to the largest block whose longer run ends two iterations before that fit
    converged, so that the time is a difference of iterations that ran (each block's host sync
    shared by fewer of them: if anything, more per iteration). Returns the timing and the block."""
    block = saved = _loop._GRAPH_BLOCK
    timing = per_iteration(run, iters, block)
    try:
        while timing.converged_at is not None and block > 1:
            block //= 2
            room = (timing.converged_at - 3 - block) // block  # m: 1 + b (1 + m) <= converged_at - 2
            if room < 1:
                continue
            _loop._GRAPH_BLOCK = block
            timing = per_iteration(run, min(iters, room * block), block)
    finally:
        _loop._GRAPH_BLOCK = saved
    return timing, block


def torch_dense(x: torch.Tensor, c0: torch.Tensor, n_iter: int) -> None:
    """The plain torch Lloyd iteration users write: chunked GEMM + argmin, index_add_, divide."""
    c = c0.clone()
    k, d = c.shape
    chunk = max(1, (1 << 28) // k)
    for _ in range(n_iter):
        cm = c.to(x.dtype)
        c_sq = (cm.float() ** 2).sum(1)
        labels = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
        for s in range(0, x.shape[0], chunk):
            # tf32 GEMM for fp32 input (allow_tf32 is set by the caller), native bf16 GEMM for bf16.
            labels[s:s + chunk] = (c_sq - 2 * (x[s:s + chunk] @ cm.T).float()).argmin(1)
        sums = torch.zeros(k, d, device=x.device).index_add_(0, labels, x.float())
        counts = torch.bincount(labels, minlength=k).float()
        c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
        float(counts[0])  # the host sync a convergence check costs


def centred_view(x: torch.Tensor, precision: str = "exact") -> tuple[DataView, torch.Tensor]:
    """The view ``fit`` makes of ``x`` (rows centred on their mean, float32 arithmetic) and that
    offset (``_loop.coarse_offset``: for 16-bit rows the mean on a grid)."""
    mean, variance = _loop._data_mean(DataView(x, torch.float32), None, Comm(), with_variance=True)
    offset = _loop.coarse_offset(mean, variance, x.dtype)
    return DataView(x, torch.float32, offset, False, precision), offset


def default_tol(data: DataView) -> float:
    """``fit``'s default ``tol`` (1e-4) scaled as ``fit`` scales it: by the mean feature variance."""
    return 1e-4 * _loop._feature_variance_mean(data, None, Comm())


def torchkm_lloyd(x: torch.Tensor, c0: torch.Tensor, n_iter: int, precision: str,
                  algorithm: str = "lloyd") -> tuple[int, bool]:
    """A fit of at most ``n_iter`` Lloyd iterations from ``c0`` (``tol=-1``: it stops early only
    when no label changes): (iterations run, whether it converged)."""
    data, offset = centred_view(x, precision)
    out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=n_iter, tol=-1.0, algorithm=algorithm)
    return out.n_iter, out.converged


def labels_off(xs: torch.Tensor, cs: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """Percent of the sampled rows ``xs`` (float64) whose label ``got`` is not the float64 argmin over
    ``cs``, and percent off by more than a tie (the two distances within 1e-5 of the norms)."""
    dist = (xs * xs).sum(1, keepdim=True) - 2 * xs @ cs.T + (cs * cs).sum(1)
    true = dist.argmin(1)
    gap = dist.gather(1, got[:, None]).squeeze(1) - dist.gather(1, true[:, None]).squeeze(1)
    tie = 1e-5 * ((xs * xs).sum(1) + (cs * cs).sum(1).max())
    off = got != true
    return 100 * float(off.double().mean()), 100 * float((off & (gap > tie)).double().mean())


def check_pruned(x: torch.Tensor, c: torch.Tensor) -> dict:
    """The box engine (``algorithm="pruned"``, d <= 3) on its own: its set-up time (curve order,
    sorted copy, tile boxes), then one pass into poisoned labels, checked against a float64 argmin
    on sampled rows and its sums against float64 ``index_add_`` of its labels."""
    from torchkm._kernels.boxes import BoxEngine

    data, offset = centred_view(x)
    n, k = x.shape[0], c.shape[0]
    labels = torch.full((n,), -7, dtype=torch.int32, device=x.device)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    engine = BoxEngine(x, c - offset, labels, offset=offset, row_scale=None, sample_weight=None, normalize=False,
                       tol=-1.0)
    sync()
    setup_ms = (time.perf_counter() - t0) * 1e3
    engine.iterate(has_prev=False)
    (inertia, _, changed, _), = engine.read(1)
    got = engine.labels.long()
    assert int(got.min()) >= 0 and int(got.max()) < k, "box engine labels not all written"
    idx = torch.randint(0, n, (8192,), device=x.device)
    _, off_beyond_ties = labels_off(x[idx].double(), c.double(), got[idx])
    xt = x.float() - offset
    ref_sums = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device)
    for s in range(0, n, 1 << 24):
        ref_sums.index_add_(0, got[s:s + (1 << 24)], xt[s:s + (1 << 24)].double())
    sum_err = float((engine.sums.double() - ref_sums).abs().max() / ref_sums.abs().max().clamp_min(1e-30))
    count_err = float((engine.counts.double() - torch.bincount(got, minlength=k).double()).abs().max())
    info = engine.info
    return {"pruned_setup_ms": setup_ms, "pruned_labels_off_beyond_ties_pct": off_beyond_ties,
            "pruned_sums_rel_err": sum_err, "pruned_counts_abs_err": count_err, "pruned_changed_first": changed,
            "pruned_skipped_first": info.skipped if info is not None else float("nan")}


def check_bounds(x: torch.Tensor, k: int, passes: int = 12) -> dict:
    """The bounds engine (``algorithm="pruned"``, d > 8) on its own: ``passes`` Lloyd passes into a
    poisoned label buffer, each pass's labels checked against a float64 argmin over the centroids
    it searched (sampled rows) and its new centroids against float64 means of its labels (largest
    difference relative to the largest mean), and the fraction of distance computations each pass
    skipped. It starts from ``k`` distinct rows (the timed runs' start draws rows with replacement:
    a repeated one leaves a cluster empty in the first pass, where this check would stop, as the
    Lloyd loop relocates it)."""
    data, offset = centred_view(x)
    n = x.shape[0]
    c = x[torch.randperm(n, device=x.device)[:k]].float()
    labels = torch.full((n,), -7, dtype=torch.int32, device=x.device)
    engine = _ops.pruned_engine(data, c - offset, labels, None, -1.0, "pruned", graphs=True, block=_loop._GRAPH_BLOCK)
    idx = torch.randint(0, n, (8192,), device=x.device)
    xs = x[idx].double() - offset.double()
    # The updated centroids against float64 means of the pass's labels: the labels alone missed
    # wrong sums once (2026-12-03, BENCHMARKS.md).
    rows64 = x.double() - offset.double()
    worst, worst_centroids, skipped = 0.0, 0.0, []
    for t in range(passes):
        engine.iterate(has_prev=t > 0)
        (_, _, _, empty), = engine.read(1)
        got = engine.labels[idx].long()
        assert int(got.min()) >= 0 and int(got.max()) < k, "bounds engine labels not all written"
        worst = max(worst, labels_off(xs, engine.c_old.double(), got)[1])
        skipped.append(engine.info.skipped)
        if empty:  # the Lloyd loop would relocate an empty cluster here; the check stops
            break
        pass_labels = engine.labels.long()
        means = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device).index_add_(0, pass_labels, rows64)
        means /= torch.bincount(pass_labels, minlength=k).double()[:, None]
        worst_centroids = max(worst_centroids, float((engine.c.double() - means).abs().max() / means.abs().max()))
    return {"pruned_labels_off_beyond_ties_pct": worst, "pruned_centroids_rel_err": worst_centroids,
            "pruned_passes_checked": len(skipped), "pruned_skipped_by_pass": [round(s, 4) for s in skipped]}


def flash(x: torch.Tensor, c0: torch.Tensor, n_iter: int) -> None:
    from flash_kmeans import batch_kmeans_Euclid

    batch_kmeans_Euclid(x[None], c0.shape[0], max_iters=n_iter, tol=-1.0, init_centroids=c0.to(x.dtype)[None].clone())


def check(x: torch.Tensor, c: torch.Tensor) -> dict:
    """Poisoned labels, labels vs float64 on sampled rows, fused sums vs index_add_ of the labels.

    ``rechecked_pct``: rows the exact pass re-searched, in raw coordinates (no offset), as this
    table has reported it since 2026-11; ``fit_rechecked_pct``: the same from the same centroids in
    the coordinates a fit's passes use (rows centred on their mean, ``centred_view``). Rows far from
    the origin defer more without the offset: over-split rows at 1M x 128 x 4096, 16 % against a
    modelled 8 % (BENCHMARKS.md, 2026-12-04, the CPU entry on the uncentred pass)."""
    n, k = x.shape[0], c.shape[0]
    labels = torch.full((n,), -7, dtype=torch.int64, device=x.device)
    sums = torch.zeros(k, x.shape[1], device=x.device)
    counts = torch.zeros(k, device=x.device)
    xf = x.float()
    norms = torch.cat([xf[s:s + 1 << 22].norm(dim=1) for s in range(0, n, 1 << 22)])
    out = kernel_assign(x, c, precision="exact", raw_norms=norms, labels=labels, sums=sums, counts=counts, store_sq_dist=False)
    assert int(labels.min()) >= 0 and int(labels.max()) < k, "labels not all written"
    idx = torch.randint(0, n, (8192,), device=x.device)
    off, off_beyond_ties = labels_off(xf[idx].double(), c.double(), labels[idx])
    # float64 references: an fp32 index_add_ of millions of rows into one cluster is itself off by ~1e-3.
    ref_sums = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device)
    for s in range(0, n, 1 << 24):
        ref_sums.index_add_(0, labels[s:s + (1 << 24)], xf[s:s + (1 << 24)].double())
    ref_counts = torch.bincount(labels, minlength=k)
    sum_err = float((sums.double() - ref_sums).abs().max() / ref_sums.abs().max().clamp_min(1e-30))
    _, offset = centred_view(x)
    fit_out = kernel_assign(x, c - offset, precision="exact", offset=offset, raw_norms=norms, store_sq_dist=False)
    # fp32 counts are exact integers up to 2^24 per cluster; beyond, within one fp32 rounding.
    count_err = (counts.double() - ref_counts.double()).abs() / ref_counts.double().clamp_min(1)
    if float(count_err.max()) > 2.0**-23:
        print(f"FUSED COUNTS DIFFER: {int((count_err > 2.0**-23).sum())} clusters, largest cluster {int(ref_counts.max())}, "
              f"total {float(counts.double().sum())} vs {n}, rechecked {int(out.rechecked)}", flush=True)
    return {"labels_off_pct": off, "labels_off_beyond_ties_pct": off_beyond_ties,
            "rechecked_pct": 100 * int(out.rechecked) / n, "fit_rechecked_pct": 100 * int(fit_out.rechecked) / n,
            "sums_rel_err": sum_err,
            "counts_rel_err": float(count_err.max())}


SWEEP = {  # workload: candidate "BLOCK_N,BLOCK_K,BLOCK_D,num_warps,num_stages[,EAGER[,SWAP]]" (few or no spills under ptxas)
    "seed000-A": ["128,32,32,8,2,1", "64,32,32,4,2,1", "128,32,32,8,2,0", "64,32,32,4,2,0", "128,32,32,4,2,0,1",
                  "256,32,32,8,2,0,1", "128,32,32,4,2,0", "256,32,32,8,2,0", "64,32,32,2,2,0", "32,32,32,2,2,0",
                  "128,32,32,4,1,0", "128,32,32,2,2,0", "256,32,32,4,2,0"],
    "seed000-A16": ["128,32,32,4,2,0", "256,32,32,4,2,0", "256,32,32,8,2,0", "128,32,32,8,2,0", "64,32,32,4,2,0",
                    "128,32,32,4,3,0", "256,32,32,8,3,0"],
    "seed000-B": ["128,128,32,8,2,1", "128,128,32,8,2,0", "256,64,32,8,2,0,1", "128,64,32,4,2,0,1",
                  "128,128,32,8,2,0,1", "256,128,32,8,2,0,1", "64,64,32,4,2,0,1", "128,64,32,8,2,0,1",
                  "128,64,32,4,2,0", "64,128,32,4,2,0", "128,64,32,4,3,0,1", "64,64,32,4,2,0", "64,32,32,4,2,0",
                  "128,32,32,4,2,0", "128,64,32,8,2,0", "64,64,32,2,2,0", "128,64,32,4,3,0", "32,64,32,2,2,0",
                  "64,128,32,8,2,0", "128,128,32,4,2,0"],
    # (exact mode: "...,1" is the row-oriented eager search, "...,0" the lazy one, "...,0,1" the transposed one)
    "SIFT-like": ["128,128,128,8,2,1", "128,64,128,8,2,1", "128,64,128,8,3,0,1", "256,64,128,8,3,0,1",
                  "128,64,128,8,2,0", "64,64,128,4,2,0"],
    "embeddings": ["128,128,64,8,3,1", "128,128,32,8,4,1", "128,64,32,8,3,0", "128,64,64,8,3,0", "128,128,32,8,3,0",
                   "64,128,32,4,3,0", "256,64,32,8,3,0"],
    "VQ-batch": ["128,128,32,8,4,1", "128,64,32,8,3,0", "128,64,64,8,3,0", "128,64,32,8,4,0", "128,128,32,8,3,0",
                 "64,128,32,4,3,0", "256,64,32,8,3,0", "128,64,32,4,3,0", "128,64,256,8,3,0,1", "64,64,256,4,3,0,1",
                 "128,32,256,8,3,0,1"],
}

# The exact mode's re-search of deferred rows (tf32x3, every centroid): a few thousand rows make few
# row tiles, so smaller tiles or more centroid chunks occupy more SMs.
# "config/chunks": TORCHKM_RECHECK_CONFIG and TORCHKM_RESEARCH_CHUNKS (centroid chunks of the re-search).
RECHECK_SWEEP = [f"{cfg}/{chunks}" for cfg in ["128,128,32,8,4,1", "64,64,32,4,3,1", "64,128,64,4,3,1"]
                 for chunks in [1, 4, 8, 16]]


def mixed_rows(n: int, d: int, k: int, generator: torch.Generator, device: str = "cuda") -> torch.Tensor:
    """``--data mixed``: n rows of d features around max(1, k // 4) centres in the unit cube, each
    centre with its own spread (log-uniform 0.02-0.2) and share of the rows. With about four
    centroids a natural cluster, many rows lie near a boundary between two centroids, as in a
    vocabulary larger than the data's clusters (N(0, 1) rows, the default, have no such structure)."""
    m = max(1, k // 4)
    centres = torch.rand(m, d, device=device, generator=generator)
    spread = 0.02 * 10 ** torch.rand(m, 1, device=device, generator=generator)
    share = torch.rand(m, device=device, generator=generator) ** 2 + 0.01
    which = torch.multinomial(share, n, replacement=True, generator=generator)
    return centres[which] + spread[which] * torch.randn(n, d, device=device, generator=generator)


def distinct_rows(x: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` distinct rows of ``x``, the fits' initial centroids. (Drawn with replacement, about 940 of
    8,192 repeat at 32,768 rows, and a fit's first iteration then relocates their empty clusters on
    the host.)"""
    return x[torch.randperm(x.shape[0], device=x.device, generator=generator)[:k]].clone()


def graph_ms(fn, calls: int = 20) -> float:
    """GPU time of one call of ``fn``: ``calls`` calls captured in one CUDA graph, replays timed.
    (Timing eager calls would time the host: a pass at 245,760 x 32 takes 0.1 ms on the GPU and
    more than that to launch.)"""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return ms(graph.replay) / calls


def sweep(name, x, c, precision, research=False):
    """GPU time of one fused pass (search + sums, as in a Lloyd iteration; replayed in a CUDA graph)
    for each candidate tile config."""
    from torchkm._kernels.assign import AssignPass
    from torchkm._kernels.configs import assign_config

    n, k = x.shape[0], c.shape[0]
    base = assign_config(n, k, x.shape[1], x.dtype, precision)
    res = {}
    norms = torch.cat([x[s:s + (1 << 22)].float().norm(dim=1) for s in range(0, n, 1 << 22)])
    c32 = c.float().contiguous()
    labels = torch.empty(n, dtype=torch.int64, device=x.device)

    def timed(variables=None, update=True):
        os.environ.update(variables or {})
        try:  # the configs are read when the pass is built
            run = AssignPass(x, k, precision, update=update)
        finally:
            for variable in variables or {}:
                del os.environ[variable]
        return graph_ms(lambda: run(x, c32, offset=None, row_scale=None, raw_norms=norms, sample_weight=None,
                                    prev_labels=None, labels=labels))

    res["default"] = timed()
    res["default, search only"] = timed(update=False)
    if precision == "exact":
        res["rechecked_pct"] = 100 * int(kernel_assign(x, c, precision=precision, raw_norms=norms).rechecked) / n
    # (tf32x3, the re-search's precision, reads its own override)
    override = "TORCHKM_RECHECK_CONFIG" if precision == "tf32x3" else "TORCHKM_ASSIGN_CONFIG"
    candidates = [(f"{key}", {override: key}) for key in SWEEP.get(name, [])]
    if precision == "exact" and research:
        candidates += [(f"re-search {key}", dict(zip(("TORCHKM_RECHECK_CONFIG", "TORCHKM_RESEARCH_CHUNKS"), key.split("/"))))
                       for key in RECHECK_SWEEP]
    candidates.append(("default again", {}))  # the run-to-run spread
    for label, variables in candidates:
        try:
            res[label] = timed(variables)
        except Exception as e:  # out of shared memory / registers: not a candidate
            res[label] = f"{type(e).__name__}"
    return base, res


def profile(x: torch.Tensor, c0: torch.Tensor, precision: str, block: int) -> dict[str, float]:
    """GPU time per Lloyd iteration of each kernel (torch.profiler), by kernel name: where the time
    goes. Differential, as ``per_iteration``: fits of 1 + 2 ``block`` and 1 + ``block`` iterations
    (graph blocks of ``block``, the block the timing used), their kernels' times subtracted and
    divided by ``block``, so that the first iteration, the capture and the final assignment cancel.
    (Kernels of the iterations a fit converged in count too: use a block whose runs end before.)"""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    def kernel_ms(n: int) -> dict[str, float]:
        torch.cuda.synchronize()
        # (CPU activity where torch has no CUDA: the building blocks' test on the CPU)
        with torch_profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
            torchkm_lloyd(x, c0, n, precision)
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            if t > 0:
                out[e.key[:60]] = out.get(e.key[:60], 0.0) + t / 1e3
        return out

    saved = _loop._GRAPH_BLOCK
    _loop._GRAPH_BLOCK = block
    try:
        torchkm_lloyd(x, c0, 1 + 2 * block, precision)  # compile, capture
        base, full = kernel_ms(1 + block), kernel_ms(1 + 2 * block)
    finally:
        _loop._GRAPH_BLOCK = saved
    diff = {key: (full[key] - base.get(key, 0.0)) / block for key in full}
    return dict(sorted(diff.items(), key=lambda kv: -kv[1])[:10])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", nargs="*", default=None, help="workload names to run")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--sweep", action="store_true", help="time the assignment pass over a set of tile configs instead")
    parser.add_argument("--sweep-precisions", nargs="*", default=["fast", "exact"])
    parser.add_argument("--sweep-research", action="store_true", help="the sweep also tries the exact re-search's configs")
    parser.add_argument("--profile", action="store_true",
                        help="also print each kernel's GPU ms per iteration (differential, see profile)")
    parser.add_argument("--no-flash", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--no-pruned", action="store_true", help="leave out algorithm=\"pruned\"")
    parser.add_argument("--extra", nargs="*", default=[], metavar="NAME=N,D,K",
                        help="other workloads, run besides those of --only")
    parser.add_argument("--data", choices=["normal", "mixed"], default="normal",
                        help="rows: N(0, 1) (default), or k/4 blobs of unequal spread (mixed_rows)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    try:
        import flash_kmeans
        info["flash_kmeans"] = flash_kmeans.__version__
    except ImportError:
        if not args.no_flash:
            # Said aloud: a run without the comparison is exploratory (BENCHMARKS.md).
            logging.warning("flash-kmeans is not installed: this run has no flash-kmeans column")
        args.no_flash = True
    ceil = ceilings()
    print(info)
    print({k: round(v, 2) for k, v in ceil.items()}, flush=True)
    rows = []
    for name, n, d, k in select_workloads(args.only, args.extra):
        g = torch.Generator(device="cuda").manual_seed(int(time.time()))
        x32 = mixed_rows(n, d, k, g) if args.data == "mixed" else torch.randn(n, d, device="cuda", generator=g)
        c0 = distinct_rows(x32, k, g)
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            x = x32 if dtype == torch.float32 else x32.to(dtype)
            row = {"workload": name, "n": n, "d": d, "k": k, "dtype": dtype_name, "data": args.data}
            if args.sweep:
                for precision in args.sweep_precisions:
                    base, res = sweep(name, x, c0, precision, args.sweep_research)
                    print(name, dtype_name, precision, "default", base, flush=True)
                    for cfg, t in res.items():
                        unit = "%" if cfg.endswith("pct") else " ms"
                        print(f"   {cfg:<22} {t if isinstance(t, str) else f'{t:.3f}{unit}'}", flush=True)
                    row[f"sweep_{precision}"] = res
                rows.append(row)
                continue
            row.update(check(x, c0))
            # Small problems: many iterations, so that per-fit costs (graph capture) cancel out.
            iters = 100 if n * k * d < 1e10 else 10 if n * k * d < 1e12 else 3
            # (x and c0 bound as defaults: the loop deletes x to free it before the next workload)
            timings = {}
            for precision in ("exact", "fast"):
                timings[f"ours_{precision}"], block = lloyd_per_iteration(
                    lambda m, x=x, c0=c0, p=precision: torchkm_lloyd(x, c0, m, p), iters)
                if block != _loop._GRAPH_BLOCK:
                    row[f"ours_{precision}_block"] = block
            if not args.no_pruned and (d <= _ops.BOX_MAX_D or (_ops.bounds_supported(DataView(x, torch.float32))
                                                               and n * k * d < 1e12)):
                # algorithm="pruned": the box engine at small d, the bounds engine past 8 features
                # (not at 1M x 768 x 8192 and 10M x 128 x 65,536: seconds per pass on N(0, 1) rows,
                # where few rows settle)
                row.update(check_pruned(x, c0) if d <= _ops.BOX_MAX_D else check_bounds(x, k))
                timings["ours_pruned"] = per_iteration(
                    lambda m, x=x, c0=c0: torchkm_lloyd(x, c0, m, "exact", "pruned"), iters, _loop._GRAPH_BLOCK)
            if not args.no_flash:
                timings["flash"] = per_iteration(lambda m, x=x, c0=c0: flash(x, c0, m), iters)
            if not args.no_torch:
                torch.backends.cuda.matmul.allow_tf32 = True
                timings["torch_dense"] = per_iteration(lambda m, x=x, c0=c0: torch_dense(x, c0, m), max(1, iters // 5))
                torch.backends.cuda.matmul.allow_tf32 = False
            for key, timing in timings.items():
                row[key] = timing.ms
                if timing.converged_at is not None:
                    row[f"{key}_converged_at"] = timing.converged_at
            if args.profile:
                for precision in ("exact", "fast"):
                    block = row.get(f"ours_{precision}_block", _loop._GRAPH_BLOCK)
                    row[f"profile_{precision}"] = prof = profile(x, c0, precision, block)
                    print(f"  profile {name} {dtype_name} {precision}: "
                          + ", ".join(f"{key} {v:.3f}" for key, v in prof.items()), flush=True)
            rate = ceil["tf32_TFLOPs"] if dtype == torch.float32 else ceil["bf16_TFLOPs"]
            row["floor"] = max(2.0 * n * k * d / (rate * 1e12), n * d * x.element_size() / (ceil["copy_TBps"] * 1e12)) * 1e3
            rows.append(row)
            print(json.dumps({k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in row.items()}), flush=True)
            del x
            torch.cuda.empty_cache()
        del x32
        torch.cuda.empty_cache()
    if not args.sweep:
        print(f"\n{'workload':<11} {'dtype':<8} | {'torch':>8} {'flash':>8} {'exact':>8} {'fast':>8} {'floor':>7} | {'exact/floor':>11} {'flash/exact':>11} {'exact/fast':>10} | {'rechk%':>6} {'fit%':>6} {'off%':>6}")
        def cell(r, key):
            mark = "*" if f"{key}_converged_at" in r else "b" if f"{key}_block" in r else " "
            return f"{r.get(key, float('nan')):>7.3f}{mark}"

        for r in rows:
            f = r.get("flash", float("nan"))
            print(f"{r['workload']:<11} {r['dtype']:<8} | {cell(r, 'torch_dense')} {cell(r, 'flash')} {cell(r, 'ours_exact')} {cell(r, 'ours_fast')} {r['floor']:>7.3f} | "
                  f"{r['ours_exact'] / r['floor']:>11.2f} {f / r['ours_exact']:>11.2f} {r['ours_exact'] / r['ours_fast']:>10.2f} | {r['rechecked_pct']:>6.2f} {r.get('fit_rechecked_pct', float('nan')):>6.2f} {r['labels_off_beyond_ties_pct']:>6.3f}")
        print("* the fit converged inside the timed iterations: whole-run time over its iterations, an upper bound (see per_iteration)")
        print("b timed with a smaller graph block, so that the timed runs end before the fit converges (see lloyd_per_iteration)")
        print("rechk%: rows the exact pass re-searched without an offset; fit%: with the fit's (rows centred on their mean)")
        for r in rows:
            if "ours_pruned" in r:
                engine = "box engine" if r["d"] <= _ops.BOX_MAX_D else "bounds engine"
                extra = (f"set-up {r['pruned_setup_ms']:.1f} ms, sums err {r['pruned_sums_rel_err']:.2e}" if "pruned_setup_ms" in r
                         else f"centroids err {r['pruned_centroids_rel_err']:.2e}, skipped by pass {r['pruned_skipped_by_pass']}")
                print(f"{r['workload']} {r['dtype']}: pruned ({engine}) {cell(r, 'ours_pruned')} ms per iteration, "
                      f"flash/pruned {r.get('flash', float('nan')) / r['ours_pruned']:.2f}, "
                      f"labels off {r['pruned_labels_off_beyond_ties_pct']:.3f} %, {extra}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"info": info, "ceilings": ceil, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
