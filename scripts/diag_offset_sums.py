"""A fit's centroids over 16-bit rows against the float64 means of their clusters, with the rows
centred on their float32 mean (as before ``_loop.coarse_offset``) and on the offset ``fit`` now
takes: the dense (``lloyd``) and bounds (``pruned``) engines run to convergence (no label changed)
from the true centres of blobs (unit-cube centres, N(0, sigma^2) noise), fresh each run.

    python scripts/diag_offset_sums.py [--n 3932160] [--d 32] [--ks 32 128 1024] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    from torchkm import _loop
    from torchkm._reference import DataView

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3_932_160)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--ks", type=int, nargs="*", default=[32, 128, 1024])
    parser.add_argument("--sigma", type=float, default=0.05)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--algorithms", nargs="*", default=["lloyd", "pruned"])
    args = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n, d = args.n, args.d
    for k in args.ks:
        centres = torch.rand(k, d, device=dev)
        which = torch.randint(0, k, (n,), device=dev)
        x = (centres[which] + args.sigma * torch.randn(n, d, device=dev)).to(getattr(torch, args.dtype))
        mean, variance = _loop._data_mean(DataView(x, torch.float32), None, _loop.Comm(), with_variance=True)
        for name, offset in [("float32 mean", mean), ("coarse offset", _loop.coarse_offset(mean, variance, x.dtype))]:
            for algorithm in args.algorithms:
                data = DataView(x, torch.float32, offset, False, "exact")
                out = _loop.lloyd(data, centres - offset, sample_weight=None, max_iter=50, tol=0.0, algorithm=algorithm)
                labels = out.labels.long()
                counts = torch.bincount(labels, minlength=k).double()
                means = torch.zeros(k, d, dtype=torch.float64, device=dev).index_add_(0, labels, x.double())
                means /= counts[:, None].clamp_min(1)
                got = out.centroids.double() + offset.double()
                err = float((got - means).abs().max() / means.abs().max())
                print(f"{n} x {d} x {k} {args.dtype} {algorithm:<6} {name:<13}: {out.n_iter} iterations, converged "
                      f"{out.converged}, centroids off float64 means {err:.2e} relative", flush=True)


if __name__ == "__main__":
    main()
