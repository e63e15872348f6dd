"""Where the host time of one eager VQ training step goes: the op through the dispatcher against its
Python body, host-synchronising calls (with their Python stacks), and the profiler's CUDA runtime
calls grouped by stack.

    python scripts/diag_host.py [--n 32768 --d 256 --k 8192]
"""
import argparse
import os
import sys
import traceback
import warnings

import torch
from torch._library.triton import set_wrap_triton_enabled

from torchkm import _ops
from torchkm.nn import VectorQuantizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_vq import host_and_wall_ms

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=32768)
parser.add_argument("--d", type=int, default=256)
parser.add_argument("--k", type=int, default=8192)
args = parser.parse_args()
x = torch.randn(args.n, args.d, device="cuda")
c = torch.randn(args.k, args.d, device="cuda")


def timed(fn, reps: int = 50) -> str:
    host, wall = host_and_wall_ms(fn, reps, warmup=5)
    return f"host {host:.3f} ms, wall {wall:.3f} ms"


def body(precision: str):
    with set_wrap_triton_enabled(False):
        return _ops._assign_and_sum_impl(x, c, precision)


def diagnose(precision: str) -> None:
    print(precision, "op through the dispatcher:", timed(lambda: torch.ops.torchkm.assign_and_sum(x, c, precision)))
    print(precision, "query (eager: direct):    ", timed(lambda: _ops.query_assign_and_sum(x, c, precision)))
    print(precision, "op body alone:            ", timed(lambda: body(precision)))
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        _ops.query_assign_and_sum(x, c, precision)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    vq = VectorQuantizer(args.k, args.d, kmeans_init=False, precision=precision).cuda()
    rows = x.clone().requires_grad_(True)

    def step():
        out = vq(rows)
        (out.quantized.sum() + out.loss).backward()

    print(precision, "VQ step:                  ", timed(step))
    shown = []

    def show(message, category, filename, lineno, file=None, line=None):
        shown.append(f"{message}\n" + "".join(traceback.format_stack(limit=14)[:-2]))

    warnings.showwarning = show
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        step()
    torch.cuda.set_sync_debug_mode("default")
    print(f"{precision}: {len(shown)} synchronising calls in one step")
    for s in shown[:4]:
        print(s)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages(group_by_stack_n=6)
    rows_ = [e for e in table if e.key in ("cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMemsetAsync",
                                           "cudaDeviceSynchronize", "cudaLaunchKernel", "cuLaunchKernelEx")]
    for e in sorted(rows_, key=lambda e: -e.self_cpu_time_total)[:8]:
        print(f"{e.key} x{e.count} self {e.self_cpu_time_total / 5:.0f} us/step")
        print("    " + "\n    ".join(e.stack[:6]))


for precision in ("fast", "exact"):
    diagnose(precision)
