"""Dense Lloyd fits with fresh fp32 sums against float64 moves (``TORCHKM_DENSE_MOVES``), whole fits
from the same start, in turns in one process: what the moves cost where rows are wide and many
labels change early (``torchkm._kernels.configs.dense_moves``' open question).

Each workload: rows as bench_lloyd's (N(0, 1), or ``--data mixed``: over-split blobs), starting
centroids from random distinct rows, ``--iters`` iterations (``tol=-1``: a fit stops early only when
no label changes), one untimed fit of each setting (compiles), then ``--repeats`` rounds of both in
alternating order. Prints per setting the median fit time, iterations, inertia, and the paired
ratio moves / fp32 sums; writes JSON.

    python scripts/diag_dense_moves.py --json out/dense_moves.json [--only embeddings VQ-batch] [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import WORKLOADS, centred_view, mixed_rows

from torchkm import _loop


def fit(x: torch.Tensor, c0: torch.Tensor, iters: int, moves: bool) -> tuple[float, _loop.KMeansResult]:
    data, offset = centred_view(x)
    with mock.patch.dict(os.environ, {"TORCHKM_DENSE_MOVES": "1" if moves else "0"}):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=iters, tol=-1.0, algorithm="lloyd")
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="out/dense_moves.json")
    parser.add_argument("--only", nargs="*", default=["SIFT-like", "embeddings", "VQ-batch", "seed000-B16"])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--data", choices=["normal", "mixed"], default="normal")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name, n, d, k in WORKLOADS:
        if name not in args.only:
            continue
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            seed = int(time.time() * 1000) % (1 << 31)
            g = torch.Generator(device="cuda")
            g.manual_seed(seed)
            x = (mixed_rows(n, d, k, g) if args.data == "mixed" else torch.randn(n, d, device="cuda", generator=g)).to(dtype)
            c0 = x[torch.randperm(n, device=x.device)[:k]].float()
            times: dict[bool, list[float]] = {False: [], True: []}
            outs: dict[bool, _loop.KMeansResult] = {}
            for moves in (False, True):
                fit(x, c0, args.iters, moves)  # compiles
            for r in range(args.repeats):
                for moves in ((False, True) if r % 2 == 0 else (True, False)):
                    ms, outs[moves] = fit(x, c0, args.iters, moves)
                    times[moves].append(ms)
            ratio = statistics.median(m / s for s, m in zip(times[False], times[True]))
            row = {"workload": name, "n": n, "d": d, "k": k, "dtype": dtype_name, "data": args.data, "seed": seed,
                   "sums_ms": times[False], "moves_ms": times[True], "paired_moves_over_sums": round(ratio, 4),
                   "iterations": [outs[False].n_iter, outs[True].n_iter],
                   "inertia": [float(outs[False].inertia), float(outs[True].inertia)],
                   "labels_differ": int((outs[False].labels != outs[True].labels).sum())}
            rows.append(row)
            print(f"{name:<11} {dtype_name:<8} sums {statistics.median(times[False]):9.2f} ms  "
                  f"moves {statistics.median(times[True]):9.2f} ms  paired {ratio:.3f}  "
                  f"iters {row['iterations']}  inertia {row['inertia'][0]:.6g} / {row['inertia'][1]:.6g}  "
                  f"labels off {row['labels_differ']}", flush=True)
            del x
            torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
