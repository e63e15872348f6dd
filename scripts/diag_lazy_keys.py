"""Packed keys in the lazy search (``assign._tile``, ``LAZY_BITS``), A/B in one process.

For each shape, dtype and mode, times the fused assignment pass (search + sums, 20 calls replayed
in a CUDA graph, as ``bench_lloyd --sweep``) with ``TORCHKM_LAZY_KEYS=0`` (the running minimum by
compare and select) and ``1`` (the tile's number in the score's low bits, wherever the lazy search takes them: the
default does from 16 centroid tiles), in
alternating rounds, and checks each variant on fresh data first: labels against a float64 argmin
(rows whose best two float64 distances are within 1e-5 relative are not counted; for the fast mode
the count is reported, not required to be 0), sums and counts against float64 ``index_add_``.

    python scripts/diag_lazy_keys.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import graph_ms

SHAPES = [(245_760, 32, 1024), (245_760, 32, 32), (3_932_160, 32, 1024), (1_000_000, 24, 300), (100_000, 64, 1000)]


def build(x, k, precision):
    from torchkm._kernels.assign import AssignPass

    # (The switch is read at each launch: ``run`` sets it.)
    return AssignPass(x, k, precision, update=True)


def run(pass_, x, c32, norms, labels, lazy: bool):
    os.environ["TORCHKM_LAZY_KEYS"] = "1" if lazy else "0"
    pass_(x, c32, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None, labels=labels)


def check(x, c, precision, lazy: bool) -> dict:
    n, k = x.shape[0], c.shape[0]
    labels = torch.full((n,), -1, dtype=torch.int64, device=x.device)
    norms = x.float().norm(dim=1)
    p = build(x, k, precision)
    run(p, x, c.float().contiguous(), norms, labels, lazy)
    rows = torch.randperm(n, device=x.device)[:8192]
    xs = x[rows].double()
    dist = torch.cdist(xs, c.double()) ** 2
    two = dist.topk(2, dim=1, largest=False).values
    clear = (two[:, 1] - two[:, 0]) > 1e-5 * two[:, 0].clamp_min(1e-30)
    off = ((labels[rows] != dist.argmin(1)) & clear).sum().item()
    sums = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device).index_add_(0, labels, x.double())
    counts = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(0, labels, torch.ones(n, dtype=torch.float64, device=x.device))
    got_sums = p.acc_sums.double().sum(0)
    got_counts = p.acc_counts.double().sum(0)
    err = ((got_sums - sums).abs().max() / sums.abs().max().clamp_min(1e-30)).item()
    return {"labels_off": off, "sums_rel_err": err, "counts_equal": bool(torch.equal(got_counts, counts)),
            "rechecked": int(p.flag_count[0]) if precision == "exact" else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = []
    for n, d, k in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(int(time.time()))
            x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
            c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float()
            norms = x.float().norm(dim=1)
            labels = torch.empty(n, dtype=torch.int64, device="cuda")
            c32 = c.contiguous()
            for precision in ("exact", "fast"):
                row = {"n": n, "d": d, "k": k, "dtype": str(dtype).split(".")[-1], "precision": precision}
                for lazy in (False, True):
                    row[f"check_{int(lazy)}"] = check(x, c, precision, lazy)
                times = {False: [], True: []}
                passes = {lazy: build(x, k, precision) for lazy in (False, True)}
                for _ in range(args.rounds):
                    for lazy in (False, True):
                        times[lazy].append(graph_ms(lambda p=passes[lazy], lz=lazy, x=x: run(p, x, c32, norms, labels, lz)))
                row["ms_compare_select"] = sorted(times[False])[len(times[False]) // 2]
                row["ms_packed"] = sorted(times[True])[len(times[True]) // 2]
                row["ms_runs"] = {"compare_select": times[False], "packed": times[True]}
                out.append(row)
                print(f"{n:>9} x {d:<3} k={k:<5} {row['dtype']:<8} {precision:<5} | compare/select "
                      f"{row['ms_compare_select']:.4f} ms  packed {row['ms_packed']:.4f} ms  "
                      f"({row['ms_packed'] / row['ms_compare_select']:.3f}) | checks {row['check_0']} {row['check_1']}",
                      flush=True)
            del x
            torch.cuda.empty_cache()
    os.environ.pop("TORCHKM_LAZY_KEYS", None)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()
