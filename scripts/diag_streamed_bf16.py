"""Why a streamed bf16 fit can end away from the in-memory one (tests/test_cuda.py's flaky case).

For fresh blobs like the test's (20,011 x 33, k = 40, init = the first 40 rows, 20 iterations,
tol = 0), fits the same rows with each algorithm in GPU memory, twice, and streamed, and compares
each with the first dense fit: iteration count, labels that differ, the largest centroid
difference, the kernels the history names, and whether each result's labels are the float64
argmin of its own centroids (``self_off``: rows whose label is not, beyond a 1e-4 relative gap).

    python scripts/diag_streamed_bf16.py [--seeds 20] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torchkm
from tests.helpers import blobs


def self_off(x64: torch.Tensor, result) -> int:
    c = result.centroids.double().to(x64.device)
    d = torch.cdist(x64, c) ** 2
    best = d.min(dim=1).values
    own = d.gather(1, result.labels.to(x64.device).long().view(-1, 1)).squeeze(1)
    return int((own > best * (1 + 1e-4) + 1e-9).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--warm", action="store_true", help="fit a few times first, as the test file's earlier tests do")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.warm:
        w = torch.from_numpy(blobs(np.random.default_rng(1), 20_011, 33, 40)).cuda()
        for _ in range(3):
            torchkm.fit(w, 40, random_state=0)
            torchkm.fit(w.bfloat16(), 40, random_state=0)
    worst = 0.0
    for seed in range(args.seeds):
        x_cpu = torch.from_numpy(blobs(np.random.default_rng(seed), 20_011, 33, 40))
        init = x_cpu[:40].clone()
        x = x_cpu.to(dtype)
        x64 = x.double().cuda()
        runs = {}
        for name, kw in [("lloyd", {"algorithm": "lloyd"}), ("lloyd2", {"algorithm": "lloyd"}),
                         ("pruned", {"algorithm": "pruned"}), ("pruned2", {"algorithm": "pruned"}),
                         ("auto", {"algorithm": "auto"}), ("auto2", {"algorithm": "auto"})]:
            runs[name] = torchkm.fit(x.cuda(), 40, init=init, max_iter=20, tol=0, **kw)
        runs["streamed"] = torchkm.fit(x, 40, init=init, max_iter=20, tol=0, device="cuda", streaming=True,
                                       chunk_rows=4099)
        ref = runs["lloyd"]
        line = [f"seed {seed:2d}"]
        for name, r in runs.items():
            labels_off = int((r.labels.cpu() != ref.labels.cpu()).sum())
            dc = float((r.centroids.cpu() - ref.centroids.cpu()).abs().max())
            kernels = "".join(h.kernel[0] for h in r.history)
            if name.startswith("streamed"):
                worst = max(worst, dc)
            line.append(f"{name}: it {r.n_iter} off {labels_off} dc {dc:.1e} self {self_off(x64, r)} [{kernels}]")
        print(" | ".join(line), flush=True)
        # Where the first difference appears, iteration by iteration (fit with max_iter = m).
        if float((runs["streamed"].centroids.cpu() - ref.centroids.cpu()).abs().max()) > 1e-3:
            for m in range(1, 21):
                a = torchkm.fit(x.cuda(), 40, init=init, max_iter=m, tol=0, algorithm="lloyd")
                b = torchkm.fit(x, 40, init=init, max_iter=m, tol=0, device="cuda", streaming=True, chunk_rows=4099)
                off = (a.labels.cpu() != b.labels.cpu()).nonzero().flatten()
                dc = float((a.centroids.cpu() - b.centroids.cpu()).abs().max())
                msg = f"   m={m}: labels off {off.numel()} dc {dc:.2e}"
                if off.numel():
                    i = int(off[0])
                    ca, cb = a.centroids.double().cpu(), b.centroids.double().cpu()
                    xi = x64[i].cpu()
                    la, lb = int(a.labels[i]), int(b.labels[i])
                    da = ((xi - ca[[la, lb]]) ** 2).sum(1).tolist()
                    db = ((xi - cb[[la, lb]]) ** 2).sum(1).tolist()
                    msg += f"; row {i}: labels {la}/{lb}, d under dense c {da}, under streamed c {db}"
                print(msg, flush=True)
                if off.numel() or dc > 1e-3:
                    break
    print(f"largest streamed centroid difference over seeds: {worst:.3g}")


if __name__ == "__main__":
    main()
