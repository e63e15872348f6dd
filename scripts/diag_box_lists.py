"""How long the box engine's candidate lists are, on the CPU with the pure-torch references (no GPU).

Rows N(0, 1) (as bench_lloyd.py draws them), centroids from random rows and then after 1, 5 and 20
Lloyd iterations on a 2M-row sample (as a fit holds them early, midway and late). The rows are
centred, sorted by ``curve_keys_reference``, cut into tiles of ``--block`` rows, and each tile's
candidates counted by ``candidates_reference``: the distances the pass computes, against the dense
pass's n k.

    python scripts/diag_box_lists.py --n 100000000 --d 2 --k 32
"""

from __future__ import annotations

import argparse
import time

import torch
from torchkm._kernels import boxes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000_000)
    parser.add_argument("--d", type=int, default=2)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n, d, k = args.n, args.d, args.k
    torch.manual_seed(args.seed)
    started = time.time()
    x = torch.randn(n, d)
    c = x[torch.randint(0, n, (k,))].clone()
    sample = x[torch.randint(0, n, (min(n, 2_000_000),))]
    stages = {"start": c.clone()}
    for it in range(1, 21):
        labels = torch.cdist(sample, c).argmin(1)
        sums = torch.zeros(k, d).index_add_(0, labels, sample)
        counts = torch.bincount(labels, minlength=k).float()
        c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
        if it in (1, 5, 20):
            stages[f"after {it}"] = c.clone()
    mean = x.mean(0)
    rows = x - mean
    lo, inv = boxes._key_grid(x, mean, None)
    rows = rows[torch.argsort(boxes.curve_keys_reference(rows, lo, inv))]
    tile_lo, tile_hi = boxes.tile_boxes(rows, args.block)
    print(f"{n} x {d}, k = {k}, tiles of {args.block} rows ({tile_lo.shape[0]} tiles); sorted in "
          f"{time.time() - started:.0f} s", flush=True)
    step = 100_000
    for name, centroids in stages.items():
        count = torch.cat([boxes.candidates_reference(tile_lo[s:s + step], tile_hi[s:s + step], centroids - mean).sum(1)
                           for s in range(0, tile_lo.shape[0], step)])
        mean_count = float(count.double().mean())
        print(f"  centroids {name:<9} mean candidates {mean_count:.3f}, tiles with one "
              f"{100 * float((count == 1).double().mean()):.1f} %, with 3 or more {100 * float((count >= 3).double().mean()):.2f} %, "
              f"past the {boxes.MAX_CANDIDATES} slots {100 * float((count > boxes.MAX_CANDIDATES).double().mean()):.4f} %, "
              f"largest {int(count.max())}; distances skipped {1 - mean_count / k:.4f}", flush=True)


if __name__ == "__main__":
    main()
