"""A visual vocabulary: SIFT descriptors of real photographs -> k-means codebook -> bag-of-words
histograms -> near-duplicate retrieval.

The photographs ship inside scikit-image and scikit-learn (no download). Each one gets a
near-duplicate: rescaled, rotated, cropped and darkened. The codebook (4,096 visual words by
default) is fitted with ``torchkm`` (``init="k-means||"``) on the SIFT descriptors of the
originals. Every image then becomes a tf-idf weighted histogram of its words, and each
near-duplicate queries the originals by cosine similarity: a working vocabulary puts the image it
came from first.

    python examples/visual_vocabulary.py                      # 4,096 words, all 23 photographs
    python examples/visual_vocabulary.py --device cuda --k 8192
    python examples/visual_vocabulary.py --images 6 --k 256   # a quick look

Writes ``out/visual_vocabulary.png``: each query next to the original it retrieved, and how often
each visual word is used.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import torchkm

# Bundled with scikit-image (skimage/data) and scikit-learn; synthetic and tiny images are left out.
SKIMAGE_PHOTOS = [
    "astronaut", "brick", "camera", "cell", "chelsea", "clock_motion", "coffee", "coins", "grass",
    "gravel", "horse", "hubble_deep_field", "ihc", "microaneurysms", "moon", "motorcycle_left", "motorcycle_right",
    "page", "retina", "rocket", "text",
]


def load_photos(limit: int | None) -> list[tuple[str, np.ndarray]]:
    """Grey-level float images in [0, 1], name first."""
    import skimage
    from skimage import color, io, transform
    from sklearn.datasets import load_sample_images

    folder = Path(skimage.__file__).parent / "data"
    photos = []
    for name in SKIMAGE_PHOTOS:
        path = next(folder.glob(f"{name}.*"))
        photos.append((name, io.imread(path)))
    sample = load_sample_images()
    photos += [(Path(f).stem, im) for f, im in zip(sample.filenames, sample.images)]
    out = []
    for name, im in photos[:limit]:
        im = np.asarray(im)
        if im.ndim == 3:
            im = color.rgb2gray(im[..., :3])
        im = im.astype(np.float64)
        im = im / 255.0 if im.max() > 1.0 else im
        if max(im.shape) > 640:  # keeps SIFT's time per image near a second on a CPU
            im = transform.rescale(im, 640 / max(im.shape), anti_aliasing=True)
        out.append((name, im))
    return out


def near_duplicate(image: np.ndarray, seed: int) -> np.ndarray:
    """Rescaled by 0.8, rotated by a few degrees, cropped by 5 % on each side, darkened."""
    from skimage import transform

    rng = np.random.default_rng(seed)
    dup = transform.rescale(image, 0.8, anti_aliasing=True)
    dup = transform.rotate(dup, rng.uniform(-8, 8), mode="reflect")
    h, w = dup.shape
    dup = dup[int(0.05 * h): int(0.95 * h), int(0.05 * w): int(0.95 * w)]
    return np.clip(0.85 * dup ** 1.1, 0.0, 1.0)


def sift(image: np.ndarray) -> np.ndarray:
    """(m, 128) float32 SIFT descriptors (m may be 0)."""
    from skimage.feature import SIFT

    extractor = SIFT()
    try:
        extractor.detect_and_extract(image)
    except RuntimeError:  # no keypoint found
        return np.zeros((0, 128), np.float32)
    return extractor.descriptors.astype(np.float32)


def bag_of_words(labels: list[torch.Tensor], k: int, idf: torch.Tensor | None = None):
    """tf-idf histograms (images x k), L2-normalised, and the idf weights (from these images if not given)."""
    counts = torch.stack([torch.bincount(lab.cpu(), minlength=k).double() for lab in labels])
    if idf is None:
        idf = torch.log(len(labels) / (1.0 + (counts > 0).sum(0)))
    hist = counts / counts.sum(1, keepdim=True).clamp_min(1) * idf
    return hist / hist.norm(dim=1, keepdim=True).clamp_min(1e-12), idf


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4096, help="visual words (default 4096)")
    parser.add_argument("--images", type=int, default=None, help="use only the first N photographs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="out/visual_vocabulary.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    photos = load_photos(args.images)
    duplicates = [near_duplicate(im, args.seed + i) for i, (_, im) in enumerate(photos)]
    originals_desc = [sift(im) for _, im in tqdm(photos, desc="SIFT, originals", unit="image")]
    queries_desc = [sift(im) for im in tqdm(duplicates, desc="SIFT, near-duplicates", unit="image")]
    train = torch.from_numpy(np.concatenate(originals_desc))
    k = min(args.k, train.shape[0])
    print(f"{len(photos)} photographs, {train.shape[0]} SIFT descriptors; fitting {k} visual words on {args.device}")

    t0 = time.perf_counter()
    vocab = torchkm.KMeans(k, init="k-means||", max_iter=50, random_state=args.seed, device=args.device,
                           progress=True).fit(train)
    seconds = time.perf_counter() - t0
    print(f"codebook: {vocab.n_iter_} iterations in {seconds:.1f} s, inertia {vocab.inertia_:.4g}")

    def words(desc: list[np.ndarray]) -> list[torch.Tensor]:
        return [vocab.predict(torch.from_numpy(d).to(args.device)) if len(d) else torch.zeros(0, dtype=torch.long)
                for d in desc]

    database, idf = bag_of_words(words(originals_desc), k)
    queries, _ = bag_of_words(words(queries_desc), k, idf)
    similarity = queries @ database.T
    found = similarity.argmax(1)
    top1 = float((found == torch.arange(len(photos))).double().mean())
    print(f"near-duplicate retrieval: top-1 accuracy {top1:.3f} ({int(top1 * len(photos))}/{len(photos)})")
    for i in range(len(photos)):
        if int(found[i]) != i:
            print(f"  miss: the copy of {photos[i][0]} found {photos[int(found[i])][0]}")
    usage = torch.bincount(vocab.labels_.cpu(), minlength=k)
    print(f"words used by the training descriptors: {int((usage > 0).sum())} of {k}")
    _plot(args.out, photos, duplicates, found, similarity, usage)
    print(f"wrote {args.out}")
    return {"top1": top1, "k": k, "descriptors": int(train.shape[0]), "seconds": seconds}


def _plot(path: str, photos, duplicates, found, similarity, usage) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Misses first: they are what a person wants to see.
    order = sorted(range(len(photos)), key=lambda i: int(found[i]) == i)[:8]
    shown = len(order)
    fig = plt.figure(figsize=(2.2 * shown, 7.0))
    grid = fig.add_gridspec(3, shown, height_ratios=[1, 1, 1.1])
    for col, i in enumerate(order):
        top = fig.add_subplot(grid[0, col])
        top.imshow(duplicates[i], cmap="gray")
        top.set_title(f"query: copy of\n{photos[i][0]}", fontsize=8)
        top.axis("off")
        bottom = fig.add_subplot(grid[1, col])
        j = int(found[i])
        bottom.imshow(photos[j][1], cmap="gray")
        mark = "✓" if j == i else "✗"
        bottom.set_title(f"{mark} found {photos[j][0]}\ncos {float(similarity[i, j]):.2f}", fontsize=8)
        bottom.axis("off")
    ax = fig.add_subplot(grid[2, :])
    ax.plot(np.sort(usage.numpy())[::-1], lw=1)
    ax.set_yscale("symlog")
    ax.set_xlabel("visual word (by usage)")
    ax.set_ylabel("training descriptors")
    ax.set_title(f"{len(usage)} visual words: {int((usage > 0).sum())} used")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
