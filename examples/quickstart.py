"""Quickstart: cluster real handwritten digits with torchkm, side by side with faiss and scikit-learn.

The data is scikit-learn's bundled copy of the UCI optical digits (1,797 images of 8x8 pixels), so
nothing is downloaded. Prints inertia, time and agreement with the true digit labels for each
library, and writes a picture of the centroids each library found.

    python examples/quickstart.py [--out out/quickstart_digits.png] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import faiss
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import load_digits
from sklearn.metrics import adjusted_rand_score

import torchkm


def best_time(fn, repeats: int = 3):
    """Run ``fn`` ``repeats`` times; return its last result and the fastest wall time."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return result, best


def inertia64(x: np.ndarray, centroids: np.ndarray) -> float:
    """Inertia in float64, computed the same way for every library."""
    d = ((x[:, None, :].astype(np.float64) - centroids[None].astype(np.float64)) ** 2).sum(-1)
    return float(d.min(1).sum())


def run(k: int, x: np.ndarray, y: np.ndarray, device: torch.device, seed: int) -> dict[str, dict]:
    xt = torch.from_numpy(x).to(device)

    def ours():
        r = torchkm.fit(xt, k, random_state=seed)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return r.centroids.cpu().numpy(), r.labels.cpu().numpy()

    def theirs_faiss():
        km = faiss.Kmeans(x.shape[1], k, niter=25, seed=seed, max_points_per_centroid=10**7)
        km.train(x)
        return km.centroids, km.index.search(x, 1)[1][:, 0]

    def theirs_sklearn():
        km = SkKMeans(k, n_init=1, random_state=seed).fit(x)
        return km.cluster_centers_.astype(np.float32), km.labels_

    rows = {}
    for name, fn in [(f"torchkm ({device.type})", ours), ("faiss-cpu", theirs_faiss), ("scikit-learn", theirs_sklearn)]:
        (centroids, labels), seconds = best_time(fn)
        rows[name] = {"centroids": centroids, "inertia": inertia64(x, centroids), "seconds": seconds,
                      "ari": adjusted_rand_score(y, labels), "labels": labels}
    return rows


def draw(rows: dict[str, dict], y: np.ndarray, path: Path) -> None:
    fig, axes = plt.subplots(len(rows), 10, figsize=(10, 1.25 * len(rows) + 0.4))
    for r, (name, row) in enumerate(rows.items()):
        # Order clusters by the digit most of their members are, so rows line up across libraries.
        majority = [np.bincount(y[row["labels"] == j], minlength=10).argmax() if (row["labels"] == j).any() else -1 for j in range(10)]
        for col, j in enumerate(np.argsort(majority, kind="stable")):
            ax = axes[r, col]
            ax.imshow(row["centroids"][j].reshape(8, 8), cmap="gray_r", vmin=0, vmax=16)
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_title(f"mostly {majority[j]}", fontsize=7)
        axes[r, 0].set_ylabel(f"{name}\ninertia {row['inertia'] / 1e6:.3f}M", fontsize=7, rotation=0, ha="right", va="center")
    fig.suptitle("k-means centroids (k=10) of scikit-learn's handwritten digits", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/quickstart_digits.png"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target
    device = torch.device(args.device)
    print(f"torchkm {torchkm.__version__}, torch {torch.__version__}, faiss {faiss.__version__}; "
          f"digits: {x.shape[0]} images x {x.shape[1]} pixels; device {device}")
    print(f"{'k':>4}  {'library':<16} {'inertia':>14} {'seconds':>9} {'ARI vs digits':>14}")
    pictures = None
    for k in (10, 32):
        rows = run(k, x, y, device, args.seed)
        for name, row in rows.items():
            print(f"{k:>4}  {name:<16} {row['inertia']:>14.1f} {row['seconds']:>9.4f} {row['ari']:>14.3f}")
        if k == 10:
            pictures = rows
    draw(pictures, y, args.out)
    print(f"wrote {args.out} (each row: one library's 10 centroids, drawn as 8x8 images)")


if __name__ == "__main__":
    main()
