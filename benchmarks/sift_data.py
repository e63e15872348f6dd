"""Real 128-d SIFT descriptors for the pruning benchmark (issue 4's "SIFT-like real data").

The 23 photographs bundled with scikit-image and scikit-learn (``examples/visual_vocabulary.py``),
each at three scales (1, 1.6 and 2.5 times its size, at most 640 pixels to start with), through
scikit-image's SIFT with a low contrast threshold (``c_dog=0.001``), so that each image gives
thousands of keypoints. SIFT is scale-invariant, but the upscaled images expose finer structure,
so most keypoints of a scale are new ones. That gives about 990,000 descriptors; a uniform sample
of ``--rows`` (default 245,760, seed 000's n) is written as uint8, as scikit-image returns them
(quantised as Lowe's SIFT and the SIFT1M set store them). The device has no scikit-image, so make the
file here and carry it (31 MB):

    python benchmarks/sift_data.py --out .data/sift.npy
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

SCALES = (1.0, 1.6, 2.5)


def descriptors(scales: tuple[float, ...] = SCALES, c_dog: float = 0.001) -> np.ndarray:
    """(m, 128) uint8 descriptors of every photograph at every scale."""
    from skimage import transform
    from skimage.feature import SIFT
    from visual_vocabulary import load_photos

    out = []
    photos = load_photos(None)
    for name, image in tqdm(photos, desc="SIFT", unit="image"):
        for scale in scales:
            im = image if scale == 1.0 else transform.rescale(image, scale, anti_aliasing=False, order=3)
            extractor = SIFT(c_dog=c_dog)
            try:
                extractor.detect_and_extract(np.clip(im, 0.0, 1.0))
            except RuntimeError:  # no keypoint
                continue
            out.append(extractor.descriptors)
    return np.concatenate(out)


def sample(x: np.ndarray, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` rows drawn uniformly without replacement, in their order."""
    pick = np.random.default_rng(seed).choice(x.shape[0], size=min(rows, x.shape[0]), replace=False)
    return x[np.sort(pick)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".data/sift.npy")
    parser.add_argument("--rows", type=int, default=245_760)
    args = parser.parse_args()
    x = sample(descriptors(), args.rows)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    np.save(args.out, x)
    print(f"{x.shape[0]} descriptors of {x.shape[1]} features -> {args.out} ({x.nbytes / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
