"""Command line: ``torchkm fit`` / ``torchkm predict`` on ``.npy`` and ``.fvecs`` files.

Examples::

    python -m torchkm fit data.npy -k 1024 --centroids centroids.npy --labels labels.npy
    python -m torchkm predict queries.fvecs --centroids centroids.npy --labels labels.npy
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .functional import assign, fit

__all__ = ["main", "read_vectors"]


def read_vectors(path: str | Path) -> np.ndarray:
    """Read a (n, d) float matrix from ``.npy`` (memory-mapped) or ``.fvecs`` (faiss/TEXMEX format)."""
    path = Path(path)
    if path.suffix == ".npy":
        return np.load(path, mmap_mode="r")
    if path.suffix == ".fvecs":
        raw = np.fromfile(path, dtype=np.int32)
        if raw.size == 0:
            raise ValueError(f"{path} is empty")
        d = int(raw[0])
        if d <= 0 or raw.size % (d + 1) != 0:
            raise ValueError(f"{path} is not a valid .fvecs file (first dimension {d}, {raw.size} words)")
        rows = raw.reshape(-1, d + 1)
        if not np.all(rows[:, 0] == d):
            raise ValueError(f"{path}: rows of different dimensions; .fvecs needs one dimension throughout")
        return rows[:, 1:].view(np.float32)
    raise ValueError(f"unsupported file type {path.suffix!r} for {path}; use .npy or .fvecs")


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _load(path: str, device: torch.device) -> torch.Tensor:
    array = read_vectors(path)
    if array.dtype.kind != "f":
        array = array.astype(np.float32)
    return torch.from_numpy(np.array(array)).to(device)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchkm", description="k-means clustering on the GPU or CPU with torchkm")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="cluster the rows of a .npy or .fvecs file")
    p.add_argument("data", help="input vectors: .npy (n, d) float array or .fvecs")
    p.add_argument("-k", "--n-clusters", type=int, required=True, help="number of clusters")
    p.add_argument("--centroids", default="centroids.npy", help="where to write the (k, d) centroids (.npy)")
    p.add_argument("--labels", default=None, help="where to write the (n,) int64 labels (.npy); omitted if not given")
    p.add_argument("--init", default="k-means++", choices=["k-means++", "random"])
    p.add_argument("--n-init", type=int, default=1)
    p.add_argument("--max-iter", type=int, default=300)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--metric", default="euclidean", choices=["euclidean", "cosine"])
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--algorithm", default="lloyd", choices=["lloyd", "pruned", "triangle", "auto"],
                   help="dense Lloyd (default), pruned with bounds, seed 000's triangle scan, or the hybrid")

    q = sub.add_parser("predict", help="label the rows of a file against saved centroids")
    q.add_argument("data", help="input vectors: .npy or .fvecs")
    q.add_argument("--centroids", required=True, help="(k, d) centroids written by `torchkm fit`")
    q.add_argument("--labels", required=True, help="where to write the (n,) int64 labels (.npy)")
    q.add_argument("--metric", default="euclidean", choices=["euclidean", "cosine"])

    for s in (p, q):
        s.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (default)")
        s.add_argument("--no-progress", action="store_true", help="no progress bar")
        s.add_argument("-v", "--verbose", action="store_true", help="log every iteration")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = _run(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"torchkm: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def _run(args: argparse.Namespace) -> dict:
    device = _device(args.device)
    x = _load(args.data, device)
    t0 = time.perf_counter()
    if args.command == "fit":
        result = fit(
            x, args.n_clusters, init=args.init, n_init=args.n_init, max_iter=args.max_iter, tol=args.tol,
            metric=args.metric, random_state=args.seed, algorithm=args.algorithm, verbose=args.verbose,
            progress=not args.no_progress,
        )
        np.save(args.centroids, result.centroids.cpu().numpy())
        if args.labels:
            np.save(args.labels, result.labels.cpu().numpy())
        summary = {
            "n_samples": x.shape[0], "n_features": x.shape[1], "n_clusters": args.n_clusters,
            "inertia": result.inertia, "n_iter": result.n_iter, "converged": result.converged,
            "seconds": round(time.perf_counter() - t0, 4), "device": str(device),
            "centroids": args.centroids, "labels": args.labels,
        }
    else:
        centroids = torch.from_numpy(np.load(args.centroids)).to(device)
        labels, dist = assign(x, centroids, metric=args.metric)
        np.save(args.labels, labels.cpu().numpy())
        summary = {
            "n_samples": x.shape[0], "inertia": float(dist.double().sum()),
            "seconds": round(time.perf_counter() - t0, 4), "device": str(device), "labels": args.labels,
        }
    return summary


if __name__ == "__main__":
    sys.exit(main())
