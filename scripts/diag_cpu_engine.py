"""The pure-torch engine (CPU tensors) per Lloyd iteration, at a few chunk sizes, beside
scikit-learn's and faiss-cpu's Lloyd iterations on the same rows and start.

Each setting's time is the best of ``--rounds`` fits of ``--iters`` iterations (``tol=0``, from the
same centroids), the settings alternating round by round: on a shared machine single fits vary by
half their time. ``_reference._CPU_CHUNK_ELEMENTS`` sets how many elements a chunk's distance block
holds.

    python scripts/diag_cpu_engine.py [--threads 2] [--rounds 5] [--chunks 22 20 18]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import torchkm
from torchkm import _reference

SIZES = [(100_000, 32, 64), (50_000, 128, 256), (20_000, 64, 1000), (200_000, 16, 16)]


def _seconds(fit) -> float:
    t0 = time.perf_counter()
    fit()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--chunks", type=int, nargs="+", default=[22, 20, 18], help="log2 of the chunk elements")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    try:
        from sklearn.cluster import KMeans
    except ImportError:
        KMeans = None
    try:
        import faiss
        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        faiss = None
    rng = np.random.default_rng(0)
    saved = _reference._CPU_CHUNK_ELEMENTS
    print(f"torch {torch.__version__}, {args.threads} threads; ms per iteration (best of {args.rounds})")
    for n, d, k in SIZES:
        x = rng.standard_normal((n, d)).astype(np.float32)
        c0 = x[rng.choice(n, k, replace=False)]
        xt, ct = torch.from_numpy(x), torch.from_numpy(c0)
        fits = {}
        for bits in args.chunks:
            def fit(bits=bits):
                _reference._CPU_CHUNK_ELEMENTS = 1 << bits
                torchkm.fit(xt, k, init=ct, max_iter=args.iters, tol=0.0)
            fits[f"torchkm 2^{bits}"] = fit
        if KMeans is not None:
            fits["scikit-learn"] = lambda: KMeans(k, init=c0, n_init=1, max_iter=args.iters, tol=0,
                                                  algorithm="lloyd").fit(x)
        if faiss is not None:
            def faiss_fit():
                km = faiss.Kmeans(d, k, niter=args.iters, seed=0, max_points_per_centroid=n)
                km.train(x, init_centroids=c0)
            fits["faiss-cpu"] = faiss_fit
        best = dict.fromkeys(fits, float("inf"))
        for rnd in range(args.rounds + 1):
            for name, fit in (fits.items() if rnd % 2 else reversed(list(fits.items()))):
                took = _seconds(fit)
                if rnd:  # the first round warms up
                    best[name] = min(best[name], took)
        _reference._CPU_CHUNK_ELEMENTS = saved
        print(f"{n} x {d}, k = {k}: " + ", ".join(f"{name} {t / args.iters * 1e3:.2f}" for name, t in best.items()),
              flush=True)


if __name__ == "__main__":
    main()
