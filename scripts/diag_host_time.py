"""Host (Python) time of the kernels' Lloyd iteration: eager iterations, the blocks of a CUDA graph
run (the first holds an eager iteration and the capture of one, later ones replay it); then
cProfile of eager iterations, and the same for ``torchkm.assign`` (the op a VQ layer calls every
step).

    python scripts/diag_host_time.py [--n 245760] [--d 32] [--k 1024]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view
from torchkm._kernels.lloyd import capture

import torchkm
from torchkm import _ops


@_ops.eager_launches  # as the fit loop runs its engines: launches not dispatched through wrap_triton
def engine_times(data, c0: torch.Tensor, labels: torch.Tensor) -> None:
    def engine(graphs: bool, block: int = 8):
        return _ops.lloyd_engine(data, c0, labels, None, 0.0, block, graphs)

    e = engine(False)
    e.iterate(has_prev=False)
    e.run_block(3)
    e.read(3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        e.run_block(1)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"eager iteration (a block of one): host {1e3 * (t1 - t0) / 20:.3f} ms/it, wall {1e3 * (t2 - t0) / 20:.3f} ms/it")
    g = engine(True)
    g.iterate(has_prev=False)
    g.read(1)
    for block in range(3):
        t0 = time.perf_counter()
        g.run_block(8)
        t1 = time.perf_counter()
        g.read(8)
        t2 = time.perf_counter()
        print(f"graph block {block} ({', '.join(g.pass_kinds)}): host {1e3 * (t1 - t0):.2f} ms, wall {1e3 * (t2 - t0):.2f} ms;"
              f" host per pass {', '.join(f'{1e3 * h:.2f}' for h in g.pass_host_seconds)} ms")
    # What a capture of one iteration costs the host, and where (the first block's "capture").
    for _ in range(2):
        t0 = time.perf_counter()
        capture(g._block_iteration, g.x.device)
        print(f"capture of one iteration: host {1e3 * (time.perf_counter() - t0):.2f} ms")
    prof = cProfile.Profile()
    prof.enable()
    capture(g._block_iteration, g.x.device)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        e.run_block(1)
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=1024)
    args = parser.parse_args()
    x = torch.randn(args.n, args.d, device="cuda")
    data, offset = centred_view(x)
    c0 = x[: args.k].clone() - offset
    labels = torch.empty(args.n, dtype=torch.int32, device="cuda")

    engine_times(data, c0, labels)
    # torchkm.assign, as a layer calls it
    xs = torch.randn(32768, 256, device="cuda")
    cb = torch.randn(8192, 256, device="cuda")
    for _ in range(3):
        torchkm.assign(xs, cb)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        torchkm.assign(xs, cb)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"torchkm.assign 32768x256, k=8192: host {1e3 * (t1 - t0) / 20:.3f} ms/call, wall "
          f"{1e3 * (time.perf_counter() - t0) / 20:.3f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        torchkm.assign(xs, cb)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
