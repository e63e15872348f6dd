"""The small-d pass (d <= 8), A/B in one process: the loop over single centroids against centroid chunks.

For each shape and dtype, times the fused assignment pass (search + sums, 20 calls replayed in a
CUDA graph) with ``TORCHKM_SMALL_D_COLUMNS=0`` (a loop over single centroids) and ``1`` (the
default: chunks of centroids per thread), and checks each variant on fresh data: labels against
a float64 argmin (rows whose best two float64 distances are within 1e-5 relative are not counted),
sums and counts against float64 ``index_add_`` of those labels. Prints a table and writes JSON.

    python scripts/diag_small_d.py [--json out.json]
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

SHAPES = [(100_000_000, 2, 32), (245_760, 2, 32), (1_000_000, 1, 64), (1_000_000, 3, 7), (1_000_000, 4, 16),
          (1_000_000, 2, 1000), (1_000_000, 8, 32)]


def run_variant(x, c, columns: bool, update: bool = True, loop_like: bool = False):
    """``loop_like``: as the Lloyd loop calls it, int32 labels overwriting their previous values in
    place (``prev_labels=labels``) and a control word (``control``)."""
    from torchkm._kernels.assign import AssignPass

    os.environ["TORCHKM_SMALL_D_COLUMNS"] = "1" if columns else "0"
    n, k = x.shape[0], c.shape[0]
    labels = torch.full((n,), -1, dtype=torch.int32 if loop_like else torch.int64, device=x.device)
    run = AssignPass(x, k, "exact", update=update)
    c32 = c.float().contiguous()
    control = torch.zeros(1, dtype=torch.int32, device=x.device) if loop_like else None

    def call():
        run(x, c32, offset=None, row_scale=None, raw_norms=None, sample_weight=None,
            prev_labels=labels if loop_like else None, labels=labels, control=control)

    ms = graph_ms(call)
    labels.fill_(-1)
    run.acc.fill_(float("nan"))  # poisoned: the pass must clear and fill it
    call()
    torch.cuda.synchronize()
    return ms, labels.long(), (run.acc_sums.sum(0).double(), run.acc_counts.sum(0).double()) if update else None


def check(x, c, labels, sums_counts, sample: int = 1 << 16):
    n = x.shape[0]
    idx = torch.randint(0, n, (min(n, sample),), device=x.device)
    x64, c64 = x[idx].double(), c.double()
    dist = torch.cdist(x64, c64) ** 2
    top = dist.topk(min(2, c.shape[0]), dim=1, largest=False)
    want = top.indices[:, 0]
    near = (top.values[:, 1] - top.values[:, 0] <= 1e-5 * top.values[:, 0].clamp_min(1e-30)) if c.shape[0] > 1 \
        else torch.zeros_like(want, dtype=torch.bool)
    got = labels[idx]
    result = {"off_percent": ((got != want) & ~near).double().mean().item() * 100}
    if sums_counts is not None:
        sums, counts = sums_counts
        ref_counts = torch.zeros(c.shape[0], dtype=torch.float64, device=x.device).index_add_(
            0, labels, torch.ones(n, dtype=torch.float64, device=x.device))
        ref_sums = torch.zeros(c.shape[0], x.shape[1], dtype=torch.float64, device=x.device).index_add_(
            0, labels, x.double())
        result["counts_max_abs_err"] = (counts - ref_counts).abs().max().item()
        result["sums_max_rel_err"] = ((sums - ref_sums).abs().max() / ref_sums.abs().max().clamp_min(1e-30)).item()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--json")
    args = parser.parse_args()
    import triton

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d")}
    print(meta, flush=True)
    rows = []
    print(f"{'n':>11} {'d':>2} {'k':>5} {'dtype':9} {'update':6} {'loop ms':>8} {'chunks ms':>9} {'speedup':>7} {'mma sums':>8} "
          f"{'off% loop/chunks':>17} {'counts err':>10} {'sums rel err':>12}")
    g = torch.Generator(device="cuda").manual_seed(int(time.time()))
    for n, d, k in SHAPES:
        x32 = torch.rand(n, d, device="cuda", generator=g)
        c = x32[torch.randint(0, n, (k,), device="cuda", generator=g)].clone()
        for dtype_name in args.dtypes:
            x = x32.to(getattr(torch, dtype_name))
            for update in (True, False):
                if not update and n < 100_000_000:
                    continue
                old_ms, old_labels, old_acc = run_variant(x, c, False, update)
                new_ms, new_labels, new_acc = run_variant(x, c, True, update)
                os.environ["TORCHKM_SMALL_D_REG_ACC"] = "0"
                mma_ms, mma_labels, mma_acc = run_variant(x, c, True, update)
                del os.environ["TORCHKM_SMALL_D_REG_ACC"]
                mma_check = check(x, c, mma_labels, mma_acc)
                loop_like = {f"{name}_ms": run_variant(x, c, columns, update, loop_like=True)[0]
                             for name, columns in [("loop", False), ("chunks", True)]}
                print("      as in the Lloyd loop (prev_labels=labels, int32, control):", loop_like, flush=True)
                old_check, new_check = check(x, c, old_labels, old_acc), check(x, c, new_labels, new_acc)
                row = {"n": n, "d": d, "k": k, "dtype": dtype_name, "update": update, "loop_ms": old_ms,
                       "chunks_ms": new_ms, "chunks_mma_sums_ms": mma_ms, "loop_like": loop_like, "mma_sums_check": mma_check, "loop_check": old_check, "chunks_check": new_check,
                       "labels_differ": int((old_labels != new_labels).sum().item())}
                rows.append(row)
                print(f"{n:>11,} {d:>2} {k:>5} {dtype_name:9} {update!s:6} {old_ms:8.3f} {new_ms:9.3f} "
                      f"{old_ms / new_ms:7.2f} {mma_ms:8.3f} {old_check['off_percent']:8.3f}/{new_check['off_percent']:.3f} "
                      f"{new_check.get('counts_max_abs_err', 0):10.1f} {new_check.get('sums_max_rel_err', 0):12.2e}"
                      f" (mma sums: {mma_check.get('counts_max_abs_err', 0):.1f} {mma_check.get('sums_max_rel_err', 0):.2e})"
                      f"  (labels differ: {row['labels_differ']})", flush=True)
            del x
        del x32
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
