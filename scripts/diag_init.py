"""What initialisation costs a fit on the GPU: k-means++ (the default), k-means|| and random rows,
next to the Lloyd iterations that follow, at issue 3's workload sizes.

Per workload (fresh random blobs each run): the wall time of ``kmeans_plusplus`` alone and per
chosen centroid, its GPU kernel time per centroid (torch.profiler over a short run) and the floor
of one step (reading the rows once at the measured copy rate), next to the same greedy k-means++
as a plain torch loop (``TORCHKM_ENGINE=torch``: a GEMM of the rows against each step's
candidates, and a host sync per step for the best; ``--torch-baseline`` picks the workloads); then
whole ``torchkm.fit`` calls with each ``init``, split into initialisation, Lloyd iterations and the
rest; and flash-kmeans' own fit (random rows, its defaults) when installed. Prints a table and
writes JSON.

    python scripts/diag_init.py [--only 245760x32x1024 ...] [--json out/diag_init.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import mixed_rows  # noqa: E402  (the benchmarks' generator of over-split rows)

import torchkm
from torchkm import _loop, _ops
from torchkm._reference import DataView
from torchkm.init import kmeans_plusplus

# name -> (n, d, k, dtype)
WORKLOADS = {
    "245760x32x32": (245_760, 32, 32, torch.float32),
    "245760x32x1024": (245_760, 32, 1024, torch.float32),
    "32768x256x8192": (32_768, 256, 8192, torch.float32),
    "1Mx128x4096": (1_000_000, 128, 4096, torch.float32),
    "1Mx768x8192-bf16": (1_000_000, 768, 8192, torch.bfloat16),
    # Fewer natural clusters than centroids, of unequal spread ("mixed"): harder for any init.
    "245760x32x1024-mixed": (245_760, 32, 1024, torch.float32),
    "1Mx128x4096-mixed": (1_000_000, 128, 4096, torch.float32),
}


def blobs(n: int, d: int, k: int, dtype: torch.dtype, seed: int, mixed: bool = False) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    if mixed:
        return mixed_rows(n, d, k, g).to(dtype)  # k / 4 centres of their own spreads and shares
    centres = torch.rand(k, d, device="cuda", generator=g)
    x = centres[torch.randint(0, k, (n,), device="cuda", generator=g)]
    return (x + 0.05 * torch.randn(n, d, device="cuda", generator=g)).to(dtype)


def copy_rate() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB."""
    a = torch.empty(1 << 28, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * a.numel() * 4 * 10 / (time.perf_counter() - t0)


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def gpu_seconds(fn) -> tuple[float, dict[str, float]]:
    """GPU seconds of ``fn``'s launches, in all and by kernel."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_kernel = {}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        seconds = (us if us is not None else getattr(event, "self_cuda_time_total", 0.0)) * 1e-6
        if seconds > 0:
            by_kernel[event.key] = by_kernel.get(event.key, 0.0) + seconds
    return sum(by_kernel.values()), by_kernel


@_ops.eager_launches  # as the fit launches them: no wrap_triton dispatch on the host
def sweep_tiles(names: list[str], seed: int) -> list[dict]:
    """GPU microseconds of each launch of a k-means++ step (``--tiles``), by tile choice."""
    from torchkm._kernels.seeding import PlusPlus

    out = []
    for name in names:
        n, d, k, dtype = WORKLOADS[name]
        x = blobs(n, d, k, dtype, seed)
        trials = 2 + int(math.log(k))
        uniforms = torch.rand(64, trials, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        for block_rows in (64, 256, 1024, None):
            for block_n in (16, 32, 64, 128):
                for warps in (4, 8):
                    if block_rows is not None and block_n > block_rows:
                        continue
                    state = PlusPlus(x, 64, uniforms, block_rows=block_rows, block_n=block_n)
                    state.num_warps = warps
                    state.start(torch.zeros(1, dtype=torch.int64, device="cuda"))
                    state.steps(2)
                    times = {}
                    for part, fn in (("score", lambda: state._score(trials, True)), ("step", lambda: state.steps(1))):
                        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        for _ in range(20):
                            fn()
                        stop.record()
                        torch.cuda.synchronize()
                        times[part] = start.elapsed_time(stop) / 20 * 1e3
                    row = {"workload": name, "block_rows": state.block_rows, "block_n": state.block_n,
                           "num_warps": warps, **{f"{p}_us": t for p, t in times.items()}}
                    out.append(row)
                    print(f"{name:18s} rows {state.block_rows:5d} tile {state.block_n:4d} "
                          f"warps {warps}: score {times['score']:8.1f} us, step {times['step']:8.1f} us")
    return out


@contextlib.contextmanager
def recorded_state():
    """The ``PlusPlus`` state of the k-means++ runs inside, in ``["state"]`` (its ``listed`` counts)."""
    from torchkm._kernels import seeding

    last: dict = {}
    original = seeding.PlusPlus

    class Recorded(original):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            last["state"] = self

    seeding.PlusPlus = Recorded
    try:
        yield last
    finally:
        seeding.PlusPlus = original


@_ops.eager_launches
def sweep_configs(names: list[str], seed: int) -> list[dict]:
    """Wall time of whole k-means++ runs (CUDA graphs, as a fit) by tile choice (``--configs``)."""
    from torchkm._kernels.seeding import kmeans_plusplus as device_plusplus

    out = []
    for name in names:
        n, d, k, dtype = WORKLOADS[name]
        x = blobs(n, d, k, dtype, seed)
        trials = 2 + int(math.log(k))
        uniforms = torch.rand(k, trials, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        first = torch.zeros(1, dtype=torch.int64, device="cuda")
        for screen, block_n in ((False, 32), (True, 16), (True, 32), (True, 64)):
            kw = dict(block_n=block_n, graphs=True, screen=screen, offset=x.float().mean(0))  # centred, as a fit
            device_plusplus(x, 40, first, uniforms[:40], **kw)
            with recorded_state() as last:
                _, seconds = timed(lambda: device_plusplus(x, k, first, uniforms, **kw))
            state = last["state"]
            row = {"workload": name, "block_rows": state.block_rows, "block_n": state.block_n, "screen": screen,
                   "ms": seconds * 1e3, "rows_read_fraction": state.rows_read() / (n * (k - 1)),
                   "rows_recomputed_fraction": state.rows_recomputed() / (n * (k - 1))}
            out.append(row)
            print(f"{name:18s} screen {screen:d} rows {state.block_rows:5d} tile {state.block_n:4d}: k-means++ "
                  f"{seconds * 1e3:9.1f} ms ({seconds * 1e6 / (k - 1):7.1f} us a step), rows read "
                  f"{row['rows_read_fraction']:.3f}, recomputed {row['rows_recomputed_fraction']:.3f}")
    return out


def flash_fit(x: torch.Tensor, k: int) -> dict | None:
    """flash-kmeans' fit with its defaults (random rows, up to 100 iterations), timed after a
    short untimed one, and the inertia of its centroids; None where it is not installed."""
    try:
        from flash_kmeans import batch_kmeans_Euclid
    except ImportError:
        return None
    batch_kmeans_Euclid(x[None], k, max_iters=2)
    (_, centroids, n_iter), seconds = timed(lambda: batch_kmeans_Euclid(x[None], k))
    inertia = float(torchkm.assign(x, centroids[0].float())[1].double().sum())
    print(f"  flash-kmeans fit (random init): {seconds * 1e3:9.1f} ms ({n_iter} it); inertia {inertia:.6g}")
    return {"total_ms": seconds * 1e3, "n_iter": n_iter, "inertia": inertia}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--inits", nargs="*", default=["auto", "k-means++", "k-means||", "random"])
    parser.add_argument("--profile-steps", type=int, default=64)
    parser.add_argument("--torch-baseline", nargs="*", default=[w for w in WORKLOADS if not w.startswith("1Mx768")],
                        help="workloads that also time the plain torch loop (seconds to minutes each)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--tiles", action="store_true", help="only time each step's launches by tile choice")
    parser.add_argument("--configs", action="store_true", help="only time whole k-means++ runs by tile choice")
    parser.add_argument("--json", default="out/diag_init.json")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    rate = copy_rate()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "copy_bytes_per_s": rate, "seed": seed}
    print(env)
    if args.tiles or args.configs:
        sweep = sweep_tiles if args.tiles else sweep_configs
        with open(args.json, "w") as f:
            json.dump({"env": env, "tiles" if args.tiles else "configs": sweep(args.only, seed)}, f, indent=1)
        return
    rows = []
    for name in args.only:
        n, d, k, dtype = WORKLOADS[name]
        x = blobs(n, d, k, dtype, seed, mixed=name.endswith("-mixed"))
        offset = _loop._data_mean(DataView(x, torch.float32), None, _loop.Comm())[0]
        data = DataView(x, torch.float32, offset)
        # Compiles the kernels for this k's number of trials, 2 + int(log k), on fewer centroids.
        kmeans_plusplus(data, max(2, math.ceil(math.exp(int(math.log(k))))), torch.Generator().manual_seed(0))
        with recorded_state() as last:
            _, wall = timed(lambda: kmeans_plusplus(data, k, torch.Generator().manual_seed(seed)))
        listed = last["state"].rows_read() / (n * max(1, k - 1))
        recomputed = last["state"].rows_recomputed() / (n * max(1, k - 1))
        steps = min(k, args.profile_steps + 1)
        gpu, by_kernel = gpu_seconds(lambda: kmeans_plusplus(data, steps, torch.Generator().manual_seed(seed)))
        floor = x.numel() * x.element_size() / rate
        torch_ms = None
        if name in args.torch_baseline:
            os.environ["TORCHKM_ENGINE"] = "torch"
            try:
                _, torch_s = timed(lambda: kmeans_plusplus(data, k, torch.Generator().manual_seed(seed)))
            finally:
                del os.environ["TORCHKM_ENGINE"]
            torch_ms = torch_s * 1e3
        row = {"workload": name, "n": n, "d": d, "k": k, "dtype": str(dtype).replace("torch.", ""),
               "kmeans_pp_ms": wall * 1e3, "rows_read_fraction": listed, "rows_recomputed_fraction": recomputed,
               "first_steps_gpu_us_by_kernel": {name: 1e6 * t / max(1, steps - 1) for name, t in by_kernel.items()},
               "per_step_ms": wall * 1e3 / max(1, k - 1),
               "gpu_per_step_ms": gpu * 1e3 / max(1, steps - 1), "floor_per_step_ms": floor * 1e3, "torch_loop_ms": torch_ms, "fits": {}}
        print(f"{name}: k-means++ {wall * 1e3:.1f} ms, {row['per_step_ms'] * 1e3:.1f} us per centroid "
              f"(GPU {row['gpu_per_step_ms'] * 1e3:.1f} us, floor {floor * 1e6:.1f} us); rows read {listed:.3f}, recomputed {recomputed:.3f}; torch loop "
              + ("-" if torch_ms is None else f"{torch_ms:.1f} ms"))
        print("  first steps, GPU us a step: " + ", ".join(
            f"{name[:28]} {us:.1f}" for name, us in sorted(row["first_steps_gpu_us_by_kernel"].items(), key=lambda kv: -kv[1])[:6]))
        for init in args.inits:
            # The same fit, untimed, compiles this path: ``algorithm="auto"``'s trial of the bounds
            # engine included (a fit of 2 iterations left that to the timed fit: 10 s at 1M x 128),
            # and kernels that specialise on sizes that differ by seed (k-means||'s candidates).
            torchkm.fit(x, k, init=init, random_state=seed)
            t_init = []
            orig = _loop._initial_centroids

            def spy(*a, **kw):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = orig(*a, **kw)
                torch.cuda.synchronize()
                t_init.append(time.perf_counter() - t0)
                return out

            _loop._initial_centroids = spy
            try:
                out, total = timed(lambda: torchkm.fit(x, k, init=init, random_state=seed))
            finally:
                _loop._initial_centroids = orig
            lloyd = sum(s.seconds for s in out.history)
            empties = [s.empty_clusters for s in out.history]
            fit = {"total_ms": total * 1e3, "init_ms": t_init[0] * 1e3, "lloyd_ms": lloyd * 1e3, "n_iter": out.n_iter,
                   "inertia": out.inertia, "empty_clusters": sum(empties),
                   "iterations_with_empty": sum(1 for e in empties if e)}
            row["fits"][init] = fit
            print(f"  fit init={init:10s}: {total * 1e3:9.1f} ms = init {t_init[0] * 1e3:8.1f} + Lloyd {lloyd * 1e3:7.1f} "
                  f"({out.n_iter} it) + rest {(total - t_init[0] - lloyd) * 1e3:6.1f}; inertia {out.inertia:.6g}; "
                  f"empty clusters {fit['empty_clusters']} in {fit['iterations_with_empty']} iterations")
        row["flash_kmeans_fit"] = flash_fit(x, k)
        rows.append(row)
    with open(args.json, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
