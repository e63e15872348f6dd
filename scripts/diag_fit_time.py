"""Where the time of a short fit goes: tol's variance pass, the iterations (as the loop measures
them), and what is left (engine set-up, graph capture, the final assignment). Prints one line per
fit and the per-iteration seconds, for seed 000's data at its size.

    python scripts/diag_fit_time.py [--k 32 1024] [--sigma2 0.05] [--algorithms lloyd pruned auto]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, default_tol
from bench_prune import seed000_data

from torchkm import _loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--k", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.05])
    parser.add_argument("--algorithms", nargs="+", default=["lloyd", "pruned", "auto"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for k in args.k:
        for s2 in args.sigma2:
            x = seed000_data(args.n, 32, k, s2, 1)
            c0 = x[torch.randperm(args.n, device="cuda")[:k]].clone()
            for alg in args.algorithms:
                for rep in range(args.repeats + 1):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    data, offset = centred_view(x)
                    tol = default_tol(data)
                    t1 = time.perf_counter()
                    seconds: list[tuple[float, str]] = []
                    out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=100, tol=tol, algorithm=alg,
                                      on_iteration=lambda s, into=seconds: into.append((s.seconds, s.kernel)))
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    iters = sum(s for s, _ in seconds)
                    kinds = {}
                    for _, kname in seconds:
                        kinds[kname] = kinds.get(kname, 0) + 1
                    print(f"k={k} s2={s2} {alg:7s} rep={rep} total {1e3 * (t2 - t0):7.2f} ms | mean+tol "
                          f"{1e3 * (t1 - t0):6.2f} | iterations {1e3 * iters:7.2f} ({out.n_iter}) | rest "
                          f"{1e3 * (t2 - t1 - iters):6.2f} | {kinds}", flush=True)
                    if rep == args.repeats:
                        print("   per iteration ms:", " ".join(f"{1e3 * s:.2f}{kn[0] if kn else ''}"
                                                           for s, kn in seconds), flush=True)


if __name__ == "__main__":
    main()
