"""Where the box engine's once-per-fit set-up spends its time, and when ``auto`` hands a fit to it.

For each size: seed 000's generator (k centres in the unit square, sigma^2 = 0.05), the set-up's
steps timed one by one on the GPU (the unfused ones as the engine ran them before ``sorted_tiles``, and that) (synchronised, median of 3), the dense pass's GPU time for
scale, the set-up's estimate (``boxes.setup_seconds``), then fits from the same k-means++ start with ``algorithm="lloyd"``, ``"pruned"`` and
``"auto"`` (wall time, iterations, and for ``auto`` the iteration each engine started at).

    python scripts/diag_box_setup.py --json out/box_setup.json [--rows 1000000 100000000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, default_tol  # noqa: E402
from bench_prune import seed000_data  # noqa: E402
from torchkm._kernels import boxes  # noqa: E402
from torchkm._kernels.boxes import (  # noqa: E402
    BoxEngine,
    _key_grid,
    box_launch,
    curve_keys,
    setup_seconds,
    sorted_tiles,
    tile_boxes,
    tile_moments,
)

from torchkm import _loop  # noqa: E402
from torchkm.init import kmeans_plusplus  # noqa: E402


def timed(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def setup_steps(x: torch.Tensor, offset: torch.Tensor, c0: torch.Tensor, variants: bool = False) -> dict[str, float]:
    n = x.shape[0]
    out = {"key_grid": timed(lambda: _key_grid(x, offset, None))}
    out["curve_keys"] = timed(lambda: curve_keys(x, offset))
    keys = curve_keys(x, offset)
    out["argsort"] = timed(lambda: torch.argsort(keys))
    order = torch.argsort(keys)
    out["gather_rows"] = timed(lambda: x.index_select(0, order).sub_(offset))
    rows = x.index_select(0, order).sub_(offset)
    block_n, _ = box_launch(n, x.device)
    out["tile_boxes"] = timed(lambda: tile_boxes(rows, block_n))
    out["tile_moments"] = timed(lambda: tile_moments(rows, block_n))
    labels = torch.zeros(n, dtype=torch.int32, device=x.device)
    out["gather_labels"] = timed(lambda: labels.index_select(0, order))
    order32 = order.to(torch.int32)
    out["sorted_tiles"] = timed(lambda: sorted_tiles(x, order32, block_n, offset=offset, labels=labels))
    if variants:
        default_keys, default_warps = boxes.CURVE_KEYS_LAUNCH, boxes.SORTED_TILES_WARPS
        try:
            for launch in ((256, 2), (1024, 4), (1024, 8), (2048, 8)):
                boxes.CURVE_KEYS_LAUNCH = launch
                out[f"curve_keys {launch}"] = timed(lambda: curve_keys(x, offset))
            for warps in (1, 2, 8):
                boxes.SORTED_TILES_WARPS = warps
                out[f"sorted_tiles warps={warps}"] = timed(
                    lambda: sorted_tiles(x, order32, block_n, offset=offset, labels=labels))
        finally:
            boxes.CURVE_KEYS_LAUNCH, boxes.SORTED_TILES_WARPS = default_keys, default_warps
    out["engine_total"] = timed(lambda: BoxEngine(x, c0 - offset, labels, offset=offset, row_scale=None,
                                                  sample_weight=None, normalize=False, tol=-1.0))
    t0 = time.perf_counter()
    out["estimate"] = setup_seconds(n, x.shape[1], x.device) * 1e3
    out["estimate_first_call"] = (time.perf_counter() - t0) * 1e3
    return out


def fits(x: torch.Tensor, c0: torch.Tensor, max_iter: int) -> dict[str, dict]:
    data, offset = centred_view(x)
    tol = default_tol(data)
    out = {}
    for algorithm in ("lloyd", "pruned", "auto", "lloyd", "pruned", "auto"):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=max_iter, tol=tol, algorithm=algorithm)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        switches = [h.iteration for i, h in enumerate(res.history) if i and h.kernel != res.history[i - 1].kernel]
        out[algorithm] = {"ms": ms, "n_iter": res.n_iter, "switches": switches, "inertia": res.inertia,
                          "shifts": [h.center_shift for h in res.history]}
        print(f"  {algorithm:7s} {ms:9.2f} ms  {res.n_iter} iterations  engine changes at {switches}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--d", type=int, default=2)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--variants", action="store_true", help="time other launches of the two set-up kernels")
    parser.add_argument("--no-fits", action="store_true")
    parser.add_argument("--log", action="store_true", help="torchkm's DEBUG log (the hybrid's decisions)")
    args = parser.parse_args()
    if args.log:
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("torchkm").setLevel(logging.DEBUG)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    for n in args.rows:
        x = seed000_data(n, args.d, args.k, 0.05, int(time.time()))
        data, offset = centred_view(x)
        c0 = kmeans_plusplus(data, args.k, torch.Generator().manual_seed(0)) + offset
        print(f"{n} x {args.d}, k = {args.k}", flush=True)
        res = {"setup_ms": setup_steps(x, offset, c0, args.variants)}
        print("  set-up ms:", {a: round(b, 3) for a, b in res["setup_ms"].items()}, flush=True)
        if not args.no_fits:
            res["fits"] = fits(x, c0, args.max_iter)
        results[f"{n}x{args.d}x{args.k}"] = res
        del x
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
