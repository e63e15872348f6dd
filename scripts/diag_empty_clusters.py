"""Where a fit's iterations go when clusters go empty (the VQ regime of ``bench_lloyd --data
mixed`` at 32,768 x 256, k = 8192, where even the fast mode took 4x its N(0, 1) time per iteration,
BENCHMARKS.md 2026-12-04): per iteration its time, labels changed and empty clusters (the fit's
history), and the wall time of the host-side relocation (``_loop._relocate_empty``), of the rows'
distances it ranks (``_ops.labelled_sq_distances``; before 2026-12-04's fourteenth session an
extra assignment pass, ``_ops.assign``, which the fit's final assignment may also call), each timed
with the GPU synchronised around it.

    python scripts/diag_empty_clusters.py [--size 32768 256 8192] [--data mixed normal seed000]
        [--precisions fast exact] [--iters 30] [--algorithms lloyd pruned] [--sigma2 0.0125]

``seed000``: seed 000's blobs (``bench_prune.seed000_data``, σ² from ``--sigma2``), where a
pruned fit at 245,760 x 32 x 1,024 held the host 2.5 ms for one relocation (BENCHMARKS.md
2026-12-03). Each fit starts from distinct random rows (``--seed``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, distinct_rows, mixed_rows  # noqa: E402
from bench_prune import seed000_data  # noqa: E402

from torchkm import _loop, _ops  # noqa: E402


class Timed:
    """Wraps ``owner.name`` so that each call's wall time (GPU synchronised before and after) adds up."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.inner = owner, name, getattr(owner, name)
        self.seconds: list[float] = []

    def __call__(self, *args, **kwargs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - t0)
        return out

    def __enter__(self):
        setattr(self.owner, self.name, self)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.inner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=3, default=[32_768, 256, 8192], metavar=("N", "D", "K"))
    parser.add_argument("--data", nargs="+", choices=["mixed", "normal", "seed000"], default=["mixed", "normal"])
    parser.add_argument("--sigma2", type=float, default=0.0125, help="seed000's cluster variance")
    parser.add_argument("--algorithms", nargs="+", default=["lloyd"], choices=["lloyd", "pruned"])
    parser.add_argument("--precisions", nargs="+", default=["fast", "exact"])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n, d, k = args.size
    print({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "size": args.size}, flush=True)
    for kind in args.data:
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        if kind == "seed000":
            x = seed000_data(n, d, k, args.sigma2, args.seed)
        else:
            x = mixed_rows(n, d, k, g) if kind == "mixed" else torch.randn(n, d, device="cuda", generator=g)
        c0 = distinct_rows(x, k, g)
        for precision, algorithm in [(p, a) for a in args.algorithms for p in args.precisions]:
            for rep in range(2):  # the first compiles and captures
                data, offset = centred_view(x, precision)
                history = []
                with Timed(_loop, "_relocate_empty") as relocate, Timed(_ops, "assign") as extra, \
                        Timed(_ops, "labelled_sq_distances") as labelled:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=args.iters, tol=-1.0,
                                      algorithm=algorithm, on_iteration=history.append)
                    torch.cuda.synchronize()
                    total = time.perf_counter() - t0
                if rep == 0:
                    continue
                with_empty = [s for s in history if s.empty_clusters]
                print(f"{kind:6s} {algorithm:6s} {precision:5s} {out.n_iter} iterations in {1e3 * total:.2f} ms "
                      f"({1e3 * total / out.n_iter:.3f} a iteration); {len(with_empty)} with empty clusters "
                      f"(median {statistics.median([s.empty_clusters for s in with_empty]) if with_empty else 0}); "
                      f"relocations {1e3 * sum(relocate.seconds):.2f} ms in {len(relocate.seconds)}, "
                      f"their distances {1e3 * sum(labelled.seconds):.2f} ms in {len(labelled.seconds)}, "
                      f"assignment passes {1e3 * sum(extra.seconds):.2f} ms in {len(extra.seconds)}", flush=True)
                print("   per iteration ms (empty):", " ".join(f"{1e3 * s.seconds:.2f}({s.empty_clusters})"
                                                          for s in history), flush=True)


if __name__ == "__main__":
    main()
