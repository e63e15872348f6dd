"""Import-time switches of the exact pass (such as ``TORCHKM_SECOND_SUMS``: the Hopper search's
given-up scores by additions), A/B across processes.

Such a switch is a module constant (read at import), so each process times one setting: run it
once with the switch at ``0`` and once at ``1``, alternating, and compare the JSON (each row names
the process's ``TORCHKM_*`` settings). For each shape and dtype it times the fused assignment pass
(search + sums, 20 calls replayed in a CUDA graph, as ``bench_lloyd --sweep``) in the exact and the
fast mode, after checking the exact pass on fresh data: labels against a float64 argmin (rows whose
best two float64 distances are within 1e-5 relative are not counted), sums and counts against
float64 ``index_add_``; ``differs_from_fast``: the fraction of rows whose exact label is not the
fast pass's.

    TORCHKM_SECOND_SUMS=0 python scripts/diag_second_sums.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import graph_ms  # noqa: E402

SHAPES = {"SIFT-like": (1_000_000, 128, 4096), "seed000-A": (245_760, 32, 32), "seed000-B": (245_760, 32, 1024),
          "VQ-batch": (32_768, 256, 8192), "seed000-B16": (3_932_160, 32, 1024),
          "seed000-A16": (3_932_160, 32, 32)}


def run(pass_, x, c32, norms, labels):
    pass_(x, c32, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None, labels=labels)


def check(x, c, precision) -> dict:
    from torchkm._kernels.assign import AssignPass

    n, k = x.shape[0], c.shape[0]
    labels = torch.full((n,), -1, dtype=torch.int64, device=x.device)
    p = AssignPass(x, k, precision, update=True)
    c32, norms = c.float().contiguous(), x.float().norm(dim=1)
    run(p, x, c32, norms, labels)
    rows = torch.randperm(n, device=x.device)[:8192]
    dist = torch.cdist(x[rows].double(), c.double()) ** 2
    two = dist.topk(2, dim=1, largest=False).values
    clear = (two[:, 1] - two[:, 0]) > 1e-5 * two[:, 0].clamp_min(1e-30)
    off = ((labels[rows] != dist.argmin(1)) & clear).sum().item()
    sums = torch.zeros(k, x.shape[1], dtype=torch.float64, device=x.device).index_add_(0, labels, x.double())
    counts = torch.zeros(k, dtype=torch.float64, device=x.device).index_add_(
        0, labels, torch.ones(n, dtype=torch.float64, device=x.device))
    fast_labels = torch.full((n,), -1, dtype=torch.int64, device=x.device)
    run(AssignPass(x, k, "fast", update=True), x, c32, norms, fast_labels)
    differs = (fast_labels != labels).double().mean().item()
    err = ((p.acc_sums.double().sum(0) - sums).abs().max() / sums.abs().max().clamp_min(1e-30)).item()
    return {"labels_off": off, "sums_rel_err": err, "counts_equal": bool(torch.equal(p.acc_counts.double().sum(0), counts)),
            "rechecked": int(p.flag_count[0]) if precision == "exact" else 0, "differs_from_fast": differs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=list(SHAPES))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from torchkm._kernels.assign import AssignPass

    setting = " ".join(f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("TORCHKM_"))
    out = []
    for name in args.only:
        n, d, k = SHAPES[name]
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1000) % 2**31)
            x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
            c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float()
            norms = x.float().norm(dim=1)
            labels = torch.empty(n, dtype=torch.int64, device="cuda")
            c32 = c.contiguous()
            row = {"workload": name, "n": n, "d": d, "k": k, "dtype": dtype_name, "settings": setting,
                   "check_exact": check(x, c, "exact")}
            passes = {mode: AssignPass(x, k, mode, update=True) for mode in ("exact", "fast")}
            times = {mode: [] for mode in passes}
            for _ in range(args.rounds):
                for mode, p in passes.items():
                    times[mode].append(graph_ms(lambda p=p, x=x: run(p, x, c32, norms, labels)))
            for mode in passes:
                row[f"ms_{mode}"] = sorted(times[mode])[len(times[mode]) // 2]
            row["runs"] = times
            out.append(row)
            print(f"[{setting}] {name:<11} {dtype_name:<8} | exact {row['ms_exact']:.4f} ms  fast "
                  f"{row['ms_fast']:.4f} ms  exact/fast {row['ms_exact'] / row['ms_fast']:.3f} | {row['check_exact']}",
                  flush=True)
            del x, passes
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()
