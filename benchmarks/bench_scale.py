"""Scale-out benchmark (issue 6): 100M x 128, k = 16,384, in GPU memory and streamed from host memory,
on 1, 2 and 4 GPUs, side by side with flash-kmeans' large-N mode, a plain torch iteration and the floors.

Three parts, run by ``benchmarks/bench_scale.sh``:

- ``--part torchkm`` under ``torchrun --nproc_per_node=G``: every rank builds its shard of the same
  data set on its GPU (chunk ``c`` of the data set comes from seed ``c``, so the shards of any G
  concatenate to the same rows), then times ``torchkm.fit(..., distributed=True)`` from the same
  initial centroids: in GPU memory (fp32 and bf16 rows) and streamed from a pinned host copy of
  the shard (fp32 rows by default, bf16 with ``--stream-dtypes``; k = 16,384, and k = 1,024 where
  compute is smaller than the copy). It checks the result first: identical centroids on every
  rank, labels equal to an exact assignment, and the distance to the one-GPU run's centroids. One
  GPU also measures the floors (tf32/bf16 GEMM rate, copy rates) and a plain torch iteration.
- ``--part flash``: flash-kmeans' ``kmeans_largeN`` (rows in pinned host memory, streamed to every
  visible GPU each iteration) on the same rows and initial centroids.
- ``--part report``: one table from the JSON lines of the other parts.

Time per iteration is the median over iterations 2.. of a fit of ``--iters`` iterations, after a
warm-up fit on the first rows has compiled every kernel; ``tol=0`` so that every fit runs them all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

CHUNK = 1 << 20  # rows per generated chunk


def _centres(k_true: int, d: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(1)
    return torch.randn(k_true, d, generator=g, device=device)


def make_chunk(c: int, rows: int, centres: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator(device=centres.device).manual_seed(1000 + c)
    idx = torch.randint(0, centres.shape[0], (rows,), generator=g, device=centres.device)
    x = centres[idx]
    x += 0.35 * torch.randn(x.shape, generator=g, device=centres.device)
    return x.to(dtype)


def chunk_range(n: int, rank: int, world: int) -> range:
    n_chunks = -(-n // CHUNK)
    return range(rank * n_chunks // world, (rank + 1) * n_chunks // world)


def build(n: int, d: int, k_true: int, rank: int, world: int, device, dtype, pinned_host: bool = False) -> torch.Tensor:
    chunks = chunk_range(n, rank, world)
    rows = sum(min(CHUNK, n - c * CHUNK) for c in chunks)
    centres = _centres(k_true, d, device)
    out = torch.empty(rows, d, dtype=dtype, pin_memory=True) if pinned_host else torch.empty(rows, d, dtype=dtype, device=device)
    at = 0
    for c in chunks:
        part = make_chunk(c, min(CHUNK, n - c * CHUNK), centres, dtype)
        out[at: at + part.shape[0]].copy_(part)
        at += part.shape[0]
    torch.cuda.synchronize(device)
    return out


def initial_centroids(k: int, d: int, k_true: int, device) -> torch.Tensor:
    return make_chunk(0, CHUNK, _centres(k_true, d, device), torch.float32)[:k].clone()


def per_iteration(history) -> float:
    times = [h.seconds for h in history[1:]] or [history[0].seconds]
    return statistics.median(times)


def _gemm_rate(dtype: torch.dtype, device) -> float:
    m = 8192
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    torch.backends.cuda.matmul.allow_tf32 = True
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 10 * 2 * m**3 / (time.perf_counter() - t)


def _copy_seconds(src: torch.Tensor, device) -> float:
    """Seconds to copy pinned host rows ``src`` to ``device`` in 256 MiB pieces (what streaming moves)."""
    rows = max(1, (1 << 28) // (src.shape[1] * src.element_size()))
    buf = torch.empty(rows, src.shape[1], dtype=src.dtype, device=device)
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    for start in range(0, src.shape[0], rows):
        part = src[start: start + rows]
        buf[: part.shape[0]].copy_(part, non_blocking=True)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t


def _hbm_rate(device) -> float:
    a = torch.empty(1 << 30, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    torch.cuda.synchronize(device)
    return 5 * 2 * a.numel() * 4 / (time.perf_counter() - t)


def torch_iteration(x: torch.Tensor, c: torch.Tensor) -> float:
    """One plain torch Lloyd iteration (tf32 matmul per chunk, argmin, index_add): the baseline."""
    torch.backends.cuda.matmul.allow_tf32 = True
    k, d = c.shape
    step = 1 << 16

    def run(rows: torch.Tensor) -> None:
        sums = torch.zeros(k, d, device=x.device)
        counts = torch.zeros(k, device=x.device)
        c_sq = (c * c).sum(1)
        for start in range(0, rows.shape[0], step):
            chunk = rows[start: start + step].float()
            labels = torch.addmm(c_sq, chunk, c.T, alpha=-2.0).argmin(1)
            sums.index_add_(0, labels, chunk)
            counts.index_add_(0, labels, torch.ones_like(labels, dtype=torch.float32))

    run(x[: 4 * step])
    torch.cuda.synchronize(x.device)
    t = time.perf_counter()
    run(x)
    torch.cuda.synchronize(x.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    return time.perf_counter() - t


def _emit(path: Path, row: dict) -> None:
    print(json.dumps(row), flush=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def part_torchkm(args) -> None:
    import torch.distributed as dist

    import torchkm

    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    distributed = world > 1
    if distributed:
        dist.init_process_group("nccl", device_id=device)
    rank = dist.get_rank() if distributed else 0
    out = Path(args.out)
    ref_dir = Path(args.ref_dir)
    ref_dir.mkdir(parents=True, exist_ok=True)

    def check(name: str, fit, x_shard: torch.Tensor, k: int) -> dict:
        """Correctness before speed: same centroids on every rank; labels of rank 0's first rows
        equal an exact assignment; distance to the one-GPU centroids."""
        c = fit.centroids
        info = {}
        if distributed:
            gathered = [torch.empty_like(c) for _ in range(world)]
            dist.all_gather(gathered, c)
            info["ranks_identical"] = all(torch.equal(g, c) for g in gathered)
        else:
            info["ranks_identical"] = True
        rows = x_shard[:200_000].to(device)
        labels = fit.labels[:200_000].to(device)
        exact, _ = torchkm.assign(rows, c)  # the exact mode's labels, whatever the fit's precision
        info["labels_match_exact"] = float((exact == labels).float().mean())
        info["inertia"] = fit.inertia
        ref = ref_dir / f"{name}_{args.precision}.pt"
        if world == 1 and rank == 0:
            torch.save({"centroids": c.cpu(), "inertia": fit.inertia}, ref)
        elif ref.exists():
            saved = torch.load(ref)
            r = saved["centroids"].to(device)
            moved = (c - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-12)
            info["median_rel_diff_vs_1gpu"] = float(moved.median())
            info["inertia_rel_diff_vs_1gpu"] = abs(fit.inertia - saved["inertia"]) / saved["inertia"]
        return info

    def warm_up(x: torch.Tensor, k: int, c0: torch.Tensor, **kwargs) -> None:
        # Compile every kernel variant (the second iteration's differs from the first's) before timing.
        torchkm.fit(x, k, init=c0, max_iter=3, tol=0, distributed=distributed, precision=args.precision, **kwargs)

    d, n, iters = args.dim, args.rows, args.iters
    if rank == 0 and world == 1 and not args.skip_floors:
        rates = {"tf32": _gemm_rate(torch.float32, device), "bf16": _gemm_rate(torch.bfloat16, device),
                 "hbm": _hbm_rate(device)}
        _emit(out / "rows.jsonl", {"kind": "floors", **rates, "device": torch.cuda.get_device_name(device),
                                   "torch": torch.__version__})
    for k in args.k:
        c0 = initial_centroids(k, d, args.k_true, device)
        for dtype_name in args.dtypes:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
            x = build(n, d, args.k_true, rank, world, device, dtype)
            warm_up(x[:CHUNK], k, c0)
            fit = torchkm.fit(x, k, init=c0, max_iter=iters, tol=0, distributed=distributed, precision=args.precision)
            row = {"kind": "torchkm", "precision": args.precision, "mode": "memory", "gpus": world, "n": n, "d": d, "k": k, "dtype": dtype_name,
                   "ms_per_iter": 1e3 * per_iteration(fit.history), "iters": fit.n_iter,
                   **check(f"memory_{dtype_name}_{k}", fit, x, k)}
            if rank == 0:
                _emit(out / "rows.jsonl", row)
            if rank == 0 and world == 1 and dtype_name == "fp32" and not args.skip_torch:
                _emit(out / "rows.jsonl", {"kind": "torch", "mode": "memory", "gpus": 1, "n": n, "d": d, "k": k,
                                           "dtype": "fp32", "ms_per_iter": 1e3 * torch_iteration(x, c0)})
            del x, fit
            torch.cuda.empty_cache()
    if args.stream:
        for dtype_name in args.stream_dtypes:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
            host = build(n, d, args.k_true, rank, world, device, dtype, pinned_host=True)
            for k in args.stream_k:
                c0 = initial_centroids(k, d, args.k_true, device)
                if distributed:
                    dist.barrier()
                copy_s = _copy_seconds(host, device)  # every rank at once, as the fit's passes run
                warm_up(host[: 2 * CHUNK], k, c0, device=device, streaming=True)
                fit = torchkm.fit(host, k, init=c0, max_iter=iters, tol=0, distributed=distributed, device=device,
                                  streaming=True, precision=args.precision)
                copy_max = torch.tensor([copy_s], device=device)
                if distributed:
                    dist.all_reduce(copy_max, op=dist.ReduceOp.MAX)
                row = {"kind": "torchkm", "precision": args.precision, "mode": "streamed", "gpus": world, "n": n, "d": d,
                       "k": k, "dtype": dtype_name, "ms_per_iter": 1e3 * per_iteration(fit.history), "iters": fit.n_iter,
                       "copy_ms": 1e3 * float(copy_max[0]), **check(f"streamed_{dtype_name}_{k}", fit, host, k)}
                if rank == 0:
                    _emit(out / "rows.jsonl", row)
                del fit
            del host
    if distributed:
        dist.destroy_process_group()


def part_flash(args) -> None:
    from flash_kmeans.kmeans_large import kmeans_largeN

    gpus = torch.cuda.device_count()
    device = torch.device("cuda", 0)
    out = Path(args.out)
    d, n = args.dim, args.rows
    host = build(n, d, args.k_true, 0, 1, device, torch.float32, pinned_host=True)
    for k in args.flash_k:
        c0 = initial_centroids(k, d, args.k_true, device)
        for dtype_name in args.flash_dtypes:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
            target = None if gpus > 1 else device
            # Warm-up: Triton compiles, and the first full-size call allocates.
            kmeans_largeN(host, k, max_iters=1, tol=-1, init_centroids=c0, device=target, dtype=dtype)
            torch.cuda.synchronize()
            times = []
            for iters in (1, 1 + args.iters):
                t = time.perf_counter()
                kmeans_largeN(host, k, max_iters=iters, tol=-1, init_centroids=c0, device=target, dtype=dtype)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            # The difference of two runs removes set-up and the final copy of the labels.
            _emit(out / "rows.jsonl", {"kind": "flash", "mode": "streamed", "gpus": gpus, "n": n, "d": d, "k": k,
                                       "dtype": dtype_name, "ms_per_iter": 1e3 * (times[1] - times[0]) / args.iters})


def part_report(args) -> None:
    rows = [json.loads(line) for line in (Path(args.out) / "rows.jsonl").read_text().splitlines()]
    floors = next((r for r in rows if r["kind"] == "floors"), None)
    one = {(r["precision"], r["mode"], r["k"], r["dtype"]): r["ms_per_iter"]
           for r in rows if r["kind"] == "torchkm" and r["gpus"] == 1}
    print(f"\n{'who':14} {'mode':9} {'gpus':>4} {'k':>6} {'dtype':5} {'ms/iter':>9} {'speed-up':>8} {'floor ms':>9} "
          f"{'copy ms':>8}  checks")
    for r in rows:
        if r["kind"] == "floors":
            continue
        flops = 2.0 * r["n"] * r["k"] * r["d"]
        floor = ""
        if floors is not None and r["mode"] == "memory":
            rate = floors["bf16" if r["dtype"] == "bf16" else "tf32"]
            floor = f"{1e3 * flops / (rate * r['gpus']):9.1f}"
        who = f"{r['kind']} {r['precision']}" if r["kind"] == "torchkm" else r["kind"]
        base = one.get((r.get("precision"), r["mode"], r["k"], r["dtype"]))
        speedup = f"{base / r['ms_per_iter']:8.2f}" if base and r["kind"] == "torchkm" else ""
        checks = ", ".join(f"{key}={r[key]:.4g}" if isinstance(r[key], float) else f"{key}={r[key]}"
                           for key in ("ranks_identical", "labels_match_exact", "median_rel_diff_vs_1gpu",
                                       "inertia_rel_diff_vs_1gpu") if key in r)
        copy = f"{r['copy_ms']:8.0f}" if "copy_ms" in r else ""
        if "copy_ms" in r:
            checks += f", iteration/copy={r['ms_per_iter'] / r['copy_ms']:.2f}"
        print(f"{who:14} {r['mode']:9} {r['gpus']:4d} {r['k']:6d} {r['dtype']:5} {r['ms_per_iter']:9.1f} "
              f"{speedup:>8} {floor:>9} {copy:>8}  {checks}")
    if floors is not None:
        print(f"\nfloors on {floors['device']}: tf32 {floors['tf32'] / 1e12:.0f} TFLOP/s, bf16 {floors['bf16'] / 1e12:.0f} "
              f"TFLOP/s, device copy {floors['hbm'] / 1e12:.2f} TB/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["torchkm", "flash", "report"], required=True)
    p.add_argument("--out", required=True, help="folder for rows.jsonl")
    p.add_argument("--ref-dir", default="/tmp/torchkm_scale_reference", help="the one-GPU run's centroids")
    p.add_argument("--rows", type=int, default=100_000_000, help="n (named so that torchrun leaves it alone)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--k", type=int, nargs="+", default=[16384])
    p.add_argument("--k-true", type=int, default=16384, help="centres of the generated blobs")
    p.add_argument("--dtypes", nargs="*", default=["fp32", "bf16"], help="in-memory runs (none: streamed only)")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--precision", default="exact", choices=["exact", "fast"], help="torchkm's precision")
    p.add_argument("--stream", action="store_true", help="also time streamed fits")
    p.add_argument("--stream-k", type=int, nargs="+", default=[16384, 1024])
    p.add_argument("--stream-dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                   help="dtype of the pinned host rows that streamed fits read")
    p.add_argument("--flash-k", type=int, nargs="+", default=[16384])
    p.add_argument("--flash-dtypes", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--skip-floors", action="store_true")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    {"torchkm": part_torchkm, "flash": part_flash, "report": part_report}[args.part](args)


if __name__ == "__main__":
    main()
