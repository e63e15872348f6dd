"""The exact mode's rounding bound, A/B in one process: GPU time of the fused pass and rows re-searched.

For each workload and dtype, times the fused assignment pass (search + sums, 20 calls replayed in
a CUDA graph) for the fast mode, the exact mode with the gap bound (``TORCHKM_EXACT_BOUND=gap``,
the rule before the distance bound) and with the distance bound (the default; bf16 rows
then take one bf16 product, where the gap bound ran hi + lo centroids), and for bf16 also the
distance bound with hi + lo centroids (``TORCHKM_BF16_SPLIT=1``) and at the other configs given. Each exact variant's labels are checked
against float64 on sampled rows (``bench_lloyd.check``). Prints a table and writes JSON.

    python scripts/diag_exact_bound.py [--only seed000-B SIFT-like VQ-batch embeddings sift] [--sift .data/sift.npy] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np
import torch
from triton.runtime.errors import OutOfResources

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import check, graph_ms

WORKLOADS = {  # name: (n, d, k, other configs for bf16's exact pass)
    "seed000-B": (245_760, 32, 1024, []),
    "SIFT-like": (1_000_000, 128, 4096, ["128,64,128,8,3,0"]),
    "VQ-batch": (32_768, 256, 8192, ["128,32,256,8,3,0,1"]),
    "embeddings": (1_000_000, 768, 8192, []),
    "sift": (None, 128, 4096, []),
}


@contextlib.contextmanager
def env(**variables: str):
    old = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def pass_ms(x: torch.Tensor, c: torch.Tensor, precision: str) -> float:
    from torchkm._kernels.assign import AssignPass

    n, k = x.shape[0], c.shape[0]
    norms = torch.cat([x[s:s + (1 << 22)].float().norm(dim=1) for s in range(0, n, 1 << 22)])
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    run = AssignPass(x, k, precision, update=True)
    c32 = c.float().contiguous()
    return graph_ms(lambda: run(x, c32, offset=None, row_scale=None, raw_norms=norms, sample_weight=None,
                                prev_labels=None, labels=labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--sift", default=".data/sift.npy")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")}, flush=True)
    rows = []
    for name in args.only:
        n, d, k, extra = WORKLOADS[name]
        g = torch.Generator(device="cuda").manual_seed(int(time.time()))
        if name == "sift":
            x32 = torch.from_numpy(np.load(args.sift).astype(np.float32)).cuda()
            n = x32.shape[0]
        else:
            x32 = torch.randn(n, d, device="cuda", generator=g)
        c = x32[torch.randint(0, n, (k,), device="cuda", generator=g)].clone()
        for dtype_name in args.dtypes:
            x = x32.to(getattr(torch, dtype_name))
            # The gap bound ran bf16 centroids as hi + lo parts; the default is one product now.
            variants = [("fast", "fast", {}),
                        ("exact, gap bound", "exact", {"TORCHKM_EXACT_BOUND": "gap", "TORCHKM_BF16_SPLIT": "1"}),
                        ("exact, distance bound (default)", "exact", {})]
            if dtype_name == "bfloat16":
                variants.append(("exact, distance bound, hi + lo", "exact", {"TORCHKM_BF16_SPLIT": "1"}))
                variants += [(f"exact, distance bound, {cfg}", "exact", {"TORCHKM_ASSIGN_CONFIG": cfg}) for cfg in extra]
            for label, precision, variables in variants:
                with env(**variables):
                    try:
                        row = {"workload": name, "n": n, "d": d, "k": k, "dtype": dtype_name, "variant": label,
                               "ms": pass_ms(x, c, precision)}
                        if precision == "exact":
                            row.update(check(x, c))
                    except OutOfResources as err:  # shared memory or registers
                        row = {"workload": name, "dtype": dtype_name, "variant": label, "error": type(err).__name__}
                rows.append(row)
                print(f"{name:<11} {dtype_name:<9} {label:<48} "
                      + (f"{row['ms']:9.3f} ms" if "ms" in row else row.get("error", ""))
                      + (f"  re-searched {row['rechecked_pct']:6.3f} %  off beyond ties {row['labels_off_beyond_ties_pct']:.3f} %"
                         if "rechecked_pct" in row else ""), flush=True)
        del x32
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
