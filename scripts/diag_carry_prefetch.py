"""The fused pass of few clusters (carried one-hot sums: k <= 64, rows of at most 32 features) under
each setting of a switch that the pass reads at each call (``--switch``: by default
``TORCHKM_CARRY_PREFETCH``, each program's next tile loaded ahead or not; ``TORCHKM_ONE_TILE``, the
search of one centroid tile without a running minimum), at the default tiles and at others, timed in
one process.

For each shape and dtype, fresh N(0, 1) rows and centroids drawn from them; for each mode, tile
config and setting, one pass into poisoned labels is checked first (labels against a float64
argmin on 8,192 rows, rows whose best two are within 1e-5 relative not counted; counts against a
bincount of the labels; sums against float64 ``index_add_``; ``same_labels``: equal to the first
setting's labels), then the pass is timed (20 calls replayed in a CUDA graph, median of three).

    python scripts/diag_carry_prefetch.py [--only A A16] [--switch TORCHKM_ONE_TILE --settings 0 1]
        [--extra V=1000000,128,64 ...] [--centred] [--configs 64,32,32,2,2 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import graph_ms, select_workloads  # noqa: E402

SHAPES = {"A": (245_760, 32, 32), "A16": (3_932_160, 32, 32)}


def main() -> None:
    from torchkm._kernels.assign import AssignPass

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(SHAPES))
    parser.add_argument("--extra", nargs="*", default=[], help="NAME=n,d,k: other shapes, run besides --only")
    parser.add_argument("--switch", default="TORCHKM_CARRY_PREFETCH")
    parser.add_argument("--settings", nargs="*", default=["0", "1", "2"])
    parser.add_argument("--configs", nargs="*", default=[], help="BLOCK_N,BLOCK_K,BLOCK_D,warps,stages (besides the default)")
    parser.add_argument("--centred", action="store_true",
                        help="as a fit calls the pass: rows centred on their mean in the kernel (``offset``)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    configs = [None] + [dict(zip(("BLOCK_N", "BLOCK_K", "BLOCK_D", "num_warps", "num_stages"),
                                 (int(v) for v in spec.split(","))), EAGER=False, SWAP=False) for spec in args.configs]
    shapes = [(name, *SHAPES[name]) for name in args.only] + select_workloads([], args.extra)
    out = []
    for name, n, d, k in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1000) % 2**31)
            x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
            c32 = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float().contiguous()
            norms = x.float().norm(dim=1)
            # A fit passes the rows' mean as ``offset`` and centroids about it; the labels are the same.
            offset = x.float().mean(0) if args.centred else None
            c_pass = c32 - offset if args.centred else c32
            rows = torch.randperm(n, device="cuda")[:8192]
            dist = torch.cdist(x[rows].double(), c32.double()) ** 2
            two = dist.topk(2, dim=1, largest=False).values
            clear = (two[:, 1] - two[:, 0]) > 1e-5 * two[:, 0]
            for mode in ("exact", "fast"):
                first = None
                for config in configs:
                    for setting in args.settings:
                        os.environ[args.switch] = setting
                        p = AssignPass(x, k, mode, update=True, config=config)
                        labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")

                        def call(p=p, labels=labels, x=x):
                            p(x, c_pass, offset=offset, row_scale=None, raw_norms=norms, sample_weight=None,
                              prev_labels=None, labels=labels)

                        call()
                        counts = torch.bincount(labels, minlength=k).double()
                        sums = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(
                            0, labels, x.double() - (0 if offset is None else offset.double()))
                        row = {"shape": name, "n": n, "d": d, "k": k, "dtype": str(dtype).split(".")[-1], "mode": mode,
                               "config": config, "centred": args.centred, "switch": args.switch, "setting": setting,
                               "labels_off": int(((labels[rows] != dist.argmin(1)) & clear).sum()),
                               "counts_equal": bool(torch.equal(p.acc_counts.double().sum(0), counts)),
                               "sums_rel_err": float((p.acc_sums.double().sum(0) - sums).abs().max() / sums.abs().max()),
                               "same_labels": None if first is None else bool(torch.equal(labels, first))}
                        if first is None:
                            first = labels.clone()
                        row["runs"] = [graph_ms(call) for _ in range(3)]
                        row["ms"] = sorted(row["runs"])[1]
                        out.append(row)
                        print(f"{name:<4} {row['dtype']:<9} {mode:<5} {str(config and tuple(config.values())[:5]):<22} "
                              f"{args.switch}={setting} | {row['ms']:.4f} ms | off {row['labels_off']} counts "
                              f"{row['counts_equal']} sums {row['sums_rel_err']:.1e} same {row['same_labels']}", flush=True)
            del x
            torch.cuda.empty_cache()
    os.environ.pop(args.switch, None)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()
