"""A fit's timeline: for each phase, when the host entered and left it, and where the GPU stood then.

Wraps the phases of a fit (engine set-up, the bounds engine's full and settle passes, graph
capture, each replay, each host sync, the final assignment) with a host clock and a CUDA event at
entry and exit (no synchronisation added; events are skipped inside a capture). After the fit,
prints each phase's host start and duration and the GPU's clock at the same points, both in ms from
the fit's start. Where the GPU's clock at an entry equals the host's, the GPU had been idle
waiting for the host; a summary adds up the host time per phase and the GPU's idle time (the
difference between a sync's exit and the GPU's last work before it is the host's turn-around).

    python scripts/diag_timeline.py [--n 245760] [--k 1024] [--sigma2 0.0125] [--algorithm pruned] [--cprofile 40]
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import run, seed000_data
from torchkm._kernels import lloyd, prune

from torchkm import _ops

RECORDS: list[tuple[str, str, float, torch.cuda.Event | None]] = []


def _mark(label: str, what: str) -> None:
    event = None
    if not torch.cuda.is_current_stream_capturing():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
    RECORDS.append((label, what, time.perf_counter(), event))


def wrap(owner, name: str, label: str | None = None) -> None:
    fn = getattr(owner, name)
    label = label or name

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        _mark(label, "enter")
        try:
            return fn(*args, **kwargs)
        finally:
            _mark(label, "exit")

    setattr(owner, name, wrapped)


def instrument() -> None:
    wrap(_ops, "pruned_engine")
    wrap(_ops, "lloyd_engine")
    wrap(_ops, "assign", "final assign")
    wrap(prune.BoundsEngine, "_full_pass", "full pass")
    wrap(prune.BoundsEngine, "_settle_pass", "settle pass (eager)")
    wrap(prune.BoundsEngine, "read", "read (sync)")
    wrap(lloyd.LloydEngine, "read", "read (sync)")
    wrap(lloyd, "capture")
    wrap(lloyd.ReplayedPass, "__call__", "pass")


def report(t0: float, start: torch.cuda.Event) -> None:
    torch.cuda.synchronize()
    print(f"{'phase':>22} {'what':>5} {'host ms':>9} {'gpu ms':>9} {'gpu-host':>9}")
    host_in: dict[str, list[float]] = collections.defaultdict(list)
    open_at: dict[str, float] = {}
    gpu_idle = 0.0
    last_gpu = 0.0
    for label, what, host, event in RECORDS:
        h = (host - t0) * 1e3
        g = start.elapsed_time(event) if event is not None else float("nan")
        print(f"{label:>22} {what:>5} {h:9.3f} {g:9.3f} {g - h:9.3f}")
        if what == "enter":
            open_at[label] = h
        elif label in open_at:
            host_in[label].append(h - open_at.pop(label))
        if event is not None and not math.isnan(g):
            # An event the GPU reached at the host's own time: the GPU waited for the host since
            # its previous event.
            if g - h > -0.005:
                gpu_idle += max(0.0, g - last_gpu)
            last_gpu = max(last_gpu, g)
    print("host ms per phase (count, total, mean):")
    for label, spans in host_in.items():
        print(f"  {label:>22} {len(spans):4d} {sum(spans):8.3f} {sum(spans) / len(spans):8.3f}")
    print(f"GPU time spent waiting for the host (upper estimate from the marks): {gpu_idle:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, default=0.0125)
    parser.add_argument("--algorithm", default="pruned")
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="then print the N functions with the most cumulative host time over 10 fits (cProfile)")
    parser.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"],
                        help="the cProfile listing's order")
    args = parser.parse_args()
    x = seed000_data(args.n, 32, args.k, args.sigma2, 1234)
    g = torch.Generator(device="cuda").manual_seed(1235)
    c0 = x[torch.randperm(args.n, device="cuda", generator=g)[: args.k]].clone()
    for _ in range(2):  # compile, then a warm fit
        out, wall = run(x, c0, args.algorithm, args.max_iter)
    print(f"{args.algorithm}: warm fit {wall:.2f} ms, {out.n_iter} iterations")
    instrument()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    out, wall = run(x, c0, args.algorithm, args.max_iter)
    print(f"instrumented fit {wall:.2f} ms, {out.n_iter} iterations")
    report(t0, start)
    if args.cprofile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            run(x, c0, args.algorithm, args.max_iter)
        profiler.disable()
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.cprofile)


if __name__ == "__main__":
    main()
