"""The exact mode's bound settings, A/B in one process on the same rows: rows re-checked, the exact
pass's GPU time and its largest kernels, labels against float64 on sampled rows, and (``--lloyd``)
per Lloyd iteration as ``bench_lloyd`` times it.

Settings (environment switches, each applied around its own passes):
  tf32-bound   ``TORCHKM_HALF_ROW_BOUND=0 TORCHKM_PAIR_BOUND=0``: fp32 rows as fp16 operands bounded
               with tf32's operand error, one score at a time (before 2026-12-04)
  half-bound   ``TORCHKM_PAIR_BOUND=0 TORCHKM_PAIR_CANDIDATES=0``: fp16's rounding, one score at a time
  pair-floor   ``TORCHKM_PAIR_CANDIDATES=0``: and the epilogue's pairwise floor (``assign._pair_floor``)
  default      and the candidate plan's pairwise threshold (``assign._candidate_pair_top``), and (with
               ``--offset mean``) the Hopper search rounding fp32 rows less the offset
  tl.dot       ``TORCHKM_HOPPER_SEARCH=0``: the tl.dot searches (what GPUs other than Hopper run)
  tl.dot-single  the same with ``TORCHKM_PAIR_BOUND=0``: no pairwise floor over their records
  raw-operands the default with ``TORCHKM_CENTRED_OPERANDS=0``: the Hopper search rounds the raw fp32
               rows (the default before 2026-12-04's fourteenth session; H200: 8.0 % of over-split
               rows re-checked from random centroids against 3.4 % centred)
  row-second   the default and ``TORCHKM_HOPPER_ROW_SECOND=0``: the packed record without its per-row
               second slot (H200, 2026-12-04: the same rows deferred, the search 0.5 ms slower)

Rows: ``mixed`` (``bench_lloyd --data mixed``: over-split) or ``normal`` (N(0, 1)); centroids as
bench_lloyd starts them (random distinct rows, "c0") and after two Lloyd iterations ("it2").
Passes in the coordinates a fit's passes use (``--offset mean``, the default: rows centred on their
mean, ``bench_lloyd.centred_view``) or raw (``--offset none``: as this tool measured before
2026-12-04's thirteenth session, and as ``bench_lloyd``'s ``rechk%`` column does).

    python scripts/diag_exact_settings.py [--settings half-bound default] [--data mixed normal]
        [--size 1000000 128 4096] [--dtype float32] [--offset mean] [--lloyd] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
sys.path.insert(0, os.path.dirname(__file__))
import torchkm._kernels.assign as assign_kernels  # noqa: E402
from bench_lloyd import centred_view, distinct_rows, graph_ms, lloyd_per_iteration, mixed_rows, torchkm_lloyd  # noqa: E402
from diag_init import gpu_seconds  # noqa: E402

import torchkm  # noqa: E402

SETTINGS = {
    "tf32-bound": {"TORCHKM_HALF_ROW_BOUND": "0", "TORCHKM_PAIR_BOUND": "0", "TORCHKM_PAIR_CANDIDATES": "0"},
    "half-bound": {"TORCHKM_PAIR_BOUND": "0", "TORCHKM_PAIR_CANDIDATES": "0"},
    "pair-floor": {"TORCHKM_PAIR_CANDIDATES": "0"},
    "default": {},
    "tl.dot": {"TORCHKM_HOPPER_SEARCH": "0"},
    "tl.dot-single": {"TORCHKM_HOPPER_SEARCH": "0", "TORCHKM_PAIR_BOUND": "0"},
    "row-second": {"TORCHKM_HOPPER_ROW_SECOND": "0"},
    "raw-operands": {"TORCHKM_CENTRED_OPERANDS": "0"},
}


class Setting:
    """The environment of one setting, restored on exit (passes are built per call, so each setting's
    passes take its switches)."""

    def __init__(self, name: str):
        self.env = SETTINGS[name]

    def __enter__(self):
        self.saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def off_float64(x: torch.Tensor, c: torch.Tensor, labels: torch.Tensor, g: torch.Generator) -> tuple[int, int]:
    """Sampled rows (20,000) whose label is farther than float64's nearest: by more than 1e-6 of the
    distance, and by more than the tie tolerance of the tests (1e-5 (||x||^2 + max ||c||^2))."""
    rows = torch.randperm(x.shape[0], device=x.device, generator=g)[:20_000]
    xs, cs = x[rows].double(), c.double()
    dist = torch.cdist(xs, cs) ** 2
    best = dist.min(1).values
    got = dist.gather(1, labels[rows].long()[:, None])[:, 0]
    tol = 1e-5 * ((xs * xs).sum(1) + (cs * cs).sum(1).max())
    return int((got - best > 1e-6 * best.clamp_min(1e-30)).sum()), int((got - best > tol).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["half-bound", "pair-floor", "default"], choices=list(SETTINGS))
    parser.add_argument("--data", nargs="+", default=["mixed", "normal"], choices=["mixed", "normal"])
    parser.add_argument("--size", nargs=3, type=int, default=[1_000_000, 128, 4096], metavar=("N", "D", "K"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--offset", default="mean", choices=["mean", "none"],
                        help="the passes' coordinates: a fit's (rows centred on their mean) or raw")
    parser.add_argument("--lloyd", action="store_true", help="also time Lloyd iterations (two rounds a setting)")
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    n, d, k = args.size
    dtype = getattr(torch, args.dtype)
    print({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "size": args.size, "dtype": args.dtype,
           "offset": args.offset})
    results = []
    for data in args.data:
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        x32 = mixed_rows(n, d, k, g) if data == "mixed" else torch.randn(n, d, device="cuda", generator=g)
        c0 = distinct_rows(x32, k, g)
        x = x32.to(dtype)
        del x32
        norms = x.float().norm(dim=1)
        offset = centred_view(x)[1] if args.offset == "mean" else None
        c2 = torchkm.fit(x, k, init=c0, max_iter=2, tol=0.0).centroids.float()
        for start, c in (("c0", c0), ("it2", c2)):
            for name in args.settings:
                with Setting(name):
                    c_pass = c if offset is None else c - offset

                    def run():
                        return assign_kernels.assign(x, c_pass, precision="exact", offset=offset, raw_norms=norms)
                    out = run()
                    off = off_float64(x, c, out.labels, g)
                    ms = graph_ms(run, calls=10)
                    _, by_kernel = gpu_seconds(run)
                top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:6]
                row = {"data": data, "start": start, "setting": name, "offset": args.offset, "pass_ms": round(ms, 4),
                       "rechecked_pct": round(100 * int(out.rechecked) / n, 3), "off_float64": off,
                       "kernels_us": {kernel: round(sec * 1e6) for kernel, sec in top}}
                results.append(row)
                print(json.dumps(row), flush=True)
        if args.lloyd:
            for rnd in range(2):
                for name in args.settings:
                    with Setting(name):
                        timing, block = lloyd_per_iteration(lambda m: torchkm_lloyd(x, c0, m, "exact"), 10)
                    row = {"data": data, "setting": name, "round": rnd, "lloyd_ms": round(timing.ms, 4), "block": block}
                    results.append(row)
                    print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
