"""Command line: ``torchkm fit`` / ``torchkm predict`` on ``.npy`` and ``.fvecs`` files.

Examples::

    python -m torchkm fit data.npy -k 1024 --centroids centroids.npy --labels labels.npy
    python -m torchkm predict queries.fvecs --centroids centroids.npy --labels labels.npy
    torchrun --nproc_per_node=4 -m torchkm fit big.npy -k 16384 --distributed --init "k-means||"

A ``.npy`` file is memory-mapped: ``fit`` streams it to the GPU chunk by chunk when it does not fit
there (``--streaming``), and with ``--distributed`` every rank reads only its own contiguous share
of the rows.
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

from ._validation import check_device
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
    try:
        return check_device(name, advice="Pass --device cpu or --device auto")
    except RuntimeError as err:  # a GPU this machine lacks: a usage error here, not a crash
        raise ValueError(str(err)) from err


def int_or_auto(value: str) -> int | str:
    return value if value == "auto" else int(value)


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
    p.add_argument("--init", default="auto", choices=["auto", "k-means++", "random", "k-means||"],
                   help="auto (default): k-means|| for many clusters over many rows, greedy k-means++ otherwise")
    p.add_argument("--n-init", type=int_or_auto, default=1,
                   help="runs from different seeds, the best kept (default 1); auto: 10 for --init random, else 1")
    p.add_argument("--max-iter", type=int, default=300)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--metric", default="euclidean", choices=["euclidean", "cosine"])
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--algorithm", default="auto", choices=["auto", "lloyd", "pruned", "triangle"],
                   help="the measured hybrid (default), dense Lloyd, pruned with bounds, or seed 000's triangle scan")
    p.add_argument("--max-points-per-centroid", type=int, default=None,
                   help="iterate on a uniform sample of at most this many rows per cluster (faiss uses 256)")
    p.add_argument("--streaming", default="auto", choices=["auto", "on", "off"],
                   help="stream host rows to the GPU each pass: when they do not fit (auto), always, or never")
    p.add_argument("--distributed", action="store_true",
                   help="one rank of a torchrun launch: NCCL on GPUs (gloo on CPUs), each rank fits its share")

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
    if summary:  # the other ranks of a distributed fit leave the report to rank 0
        print(json.dumps(summary))
    return 0


def _start_distributed(device: torch.device) -> tuple[int, int, torch.device]:
    """Join the torchrun launch: (rank, world size, this rank's device)."""
    import os

    import torch.distributed as dist

    if "RANK" not in os.environ:
        raise ValueError("--distributed needs a torchrun launch (torchrun --nproc_per_node=N -m torchkm fit ...)")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def _fit(args: argparse.Namespace, device: torch.device) -> dict:
    rows = read_vectors(args.data)
    if rows.dtype.kind != "f":
        rows = rows.astype(np.float32)
    rank, world = 0, 1
    if args.distributed:
        rank, world, device = _start_distributed(device)
    n = rows.shape[0]
    start, stop = rank * n // world, (rank + 1) * n // world
    t0 = time.perf_counter()
    result = fit(
        rows[start:stop], args.n_clusters, init=args.init, n_init=args.n_init, max_iter=args.max_iter, tol=args.tol,
        metric=args.metric, random_state=args.seed, algorithm=args.algorithm, verbose=args.verbose,
        progress=not args.no_progress, max_points_per_centroid=args.max_points_per_centroid, device=device,
        streaming={"auto": None, "on": True, "off": False}[args.streaming], distributed=args.distributed,
    )
    seconds = time.perf_counter() - t0
    if args.labels:
        if args.distributed:
            import torch.distributed as dist

            # One file for every rank: rank 0 creates it, each rank writes its rows.
            if rank == 0:
                np.lib.format.open_memmap(args.labels, mode="w+", dtype=np.int64, shape=(n,)).flush()
            dist.barrier()
            out = np.lib.format.open_memmap(args.labels, mode="r+")
            out[start:stop] = result.labels.cpu().numpy()
            out.flush()
            dist.barrier()
        else:
            np.save(args.labels, result.labels.cpu().numpy())
    if rank == 0:
        np.save(args.centroids, result.centroids.cpu().numpy())
    if args.distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {
        "n_samples": n, "n_features": rows.shape[1], "n_clusters": args.n_clusters,
        "inertia": result.inertia, "n_iter": result.n_iter, "converged": result.converged,
        "seconds": round(seconds, 4), "device": str(device), "processes": world,
        "centroids": args.centroids, "labels": args.labels,
    } if rank == 0 else {}


def _run(args: argparse.Namespace) -> dict:
    device = _device(args.device)
    if args.command == "fit":
        return _fit(args, device)
    x = _load(args.data, device)
    t0 = time.perf_counter()
    centroids = torch.from_numpy(np.load(args.centroids)).to(device)
    labels, dist = assign(x, centroids, metric=args.metric)
    np.save(args.labels, labels.cpu().numpy())
    return {
        "n_samples": x.shape[0], "inertia": float(dist.double().sum()),
        "seconds": round(time.perf_counter() - t0, 4), "device": str(device), "labels": args.labels,
    }

if __name__ == "__main__":
    sys.exit(main())
