"""A/B of the empty-cluster relocation in fits on the kernels: on the device (``engine.relocate``:
a few launches, one sync for the shift) against the torch ops (``_loop._relocate_empty`` and
``new_centroids``: about 35 launches and two syncs), for the dense and the bounds engine.
Alternating fits on the same data and start (seed 000's generator, random rows as the start, so
some clusters empty in the first passes); prints each variant's median fit time, the median of the
paired ratios, its relocations, and whether both variants' fits agree (labels, iteration counts).

(Until 2026-12-05 this script compared the bounds engine's own distances against an extra
assignment pass as what the farthest rows are ranked by; the engine's own distances won.)

    python scripts/diag_relocation.py [--n 245760] [--k 1024] [--sigma2 0.0125 0.05] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_prune import run, seed000_data
from torchkm._kernels import lloyd, prune


def _on_device(value: bool) -> None:
    lloyd.LloydEngine.relocates_on_device = value
    prune.BoundsEngine.relocates_on_device = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05])
    parser.add_argument("--algorithms", nargs="+", default=["lloyd", "pruned"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    variants = {"device": True, "torch ops": False}
    results = []
    for s2 in args.sigma2:
        x = seed000_data(args.n, 32, args.k, s2, 7)
        c0 = x[torch.randperm(args.n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))[:args.k]]
        for algorithm in args.algorithms:
            times: dict[str, list[float]] = {name: [] for name in variants}
            fits = {}
            for rep in range(args.repeats + 1):
                for name, value in (variants.items() if rep % 2 else reversed(variants.items())):
                    _on_device(value)
                    out, ms = run(x, c0, algorithm, 100)
                    if rep:  # the first round compiles
                        times[name].append(ms)
                    fits[name] = out
            _on_device(True)
            a, b = fits.values()
            same = a.n_iter == b.n_iter and bool(torch.equal(a.labels, b.labels))
            relocations = [(h.iteration, h.empty_clusters) for h in a.history if h.empty_clusters]
            paired = statistics.median(t / u for t, u in zip(times["device"], times["torch ops"]))
            row = {"n": args.n, "k": args.k, "sigma2": s2, "algorithm": algorithm, "iterations": a.n_iter,
                   "relocations": relocations, "same_fits": same, "paired_device_over_torch": paired,
                   **{f"{name}_ms": statistics.median(t) for name, t in times.items()},
                   **{f"{name}_ms_runs": t for name, t in times.items()}}
            results.append(row)
            print(f"n={args.n} k={args.k} s2={s2} {algorithm}: " + ", ".join(
                f"{name} {statistics.median(t):.3f} ms (min {min(t):.3f})" for name, t in times.items())
                + f" | paired device/torch {paired:.3f} | {a.n_iter} iterations, relocations {relocations}, "
                f"same fits {same}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
