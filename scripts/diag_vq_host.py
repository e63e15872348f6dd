"""Where the host time of the VQ layer's training step goes once the step is replayed as a CUDA
graph (the layer's default on CUDA), at 32,768 x 256, 8192 codes: the forward alone, forward plus
backward, the input gradient's launch alone against the torch expression, and cProfile of whole
steps (functions by own time, then by cumulative time).

    python scripts/diag_vq_host.py [--precision exact] [--dtype float32]
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_vq import host_and_wall_ms, make_layer, step_fn  # noqa: E402

from torchkm import _ops, _reference  # noqa: E402


def timed(fn, reps: int = 100) -> str:
    host, wall = host_and_wall_ms(fn, reps, warmup=5)
    return f"host {host * 1e3:.0f} us, wall {wall * 1e3:.0f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", default="exact")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--top", type=int, default=22)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    layer = make_layer(f"torchkm-{args.precision}", torch.randn(8192, 256, device="cuda"))
    x = torch.randn(args.n, 256, device="cuda", dtype=dtype).requires_grad_(True)
    step = step_fn(layer, x, dtype)
    originals = _ops.straight_through_grad

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            layer(x)

    print("step (forward + backward):", timed(step))
    print("forward alone:            ", timed(forward))
    grad = torch.randn_like(x)
    for name, fn in (("kernel", _ops.straight_through_grad), ("torch", _reference.straight_through_grad)):
        _ops.straight_through_grad = fn
        fwd_us, bwd_us = [], []
        for i in range(60):
            torch.cuda.synchronize()  # each part starts on an idle GPU: its host time alone
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                quantized, _, loss = layer(x)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            torch.autograd.backward((quantized, loss), (grad.to(quantized.dtype), torch.ones_like(loss)))
            t3 = time.perf_counter()
            x.grad = None
            if i >= 10:
                fwd_us.append((t1 - t0) * 1e6)
                bwd_us.append((t3 - t2) * 1e6)
        _ops.straight_through_grad = originals
        print(f"host alone, input gradient by {name}: forward {statistics.median(fwd_us):.0f} us, "
              f"backward {statistics.median(bwd_us):.0f} us (medians)")
    g, codes = torch.randn_like(x), torch.randn(x.shape, device="cuda")
    one = torch.ones((), device="cuda")
    with torch.no_grad():
        print("input gradient, kernel:   ", timed(lambda: _ops.straight_through_grad(g, x, codes, one, one, 0.25)))
        print("input gradient, torch:    ", timed(lambda: _reference.straight_through_grad(g, x, codes, one, one, 0.25)))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(50):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
