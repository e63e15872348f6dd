"""The exact mode over short rows and 65 or more clusters: the best two candidates (``besttwo``)
against every row in 3xTF32 products (``configs.exact_as_tf32x3``, which takes the latter up to 128
clusters on ``tf32x3_rows_config``'s tiles), on the exact tiles (``x3``) and on the default route
(``x3rows``), with the fast mode as a control.

For each shape and dtype, fresh N(0, 1) rows centred on their mean (as a fit passes them) and
centroids drawn from them; each pass runs once into poisoned labels, checked against a float64
argmin on 8,192 rows (rows whose best two are within 1e-5 relative not counted) and its sums
against float64 ``index_add_``, then is timed (20 calls replayed in a CUDA graph, median of three).
``--variants NAME:PRECISION:CONFIG``: other passes instead, e.g. ``one128:tf32x3:64,128,D,4,2``
(CONFIG ``BLOCK_N,BLOCK_K,BLOCK_D,warps,stages`` with ``D`` for the padded feature count, or
``default``, or ``exact``/``fast`` for ``assign_config``'s tiles of that mode; PRECISION
``exact``, ``fast``, ``tf32x3`` (every row in 3xTF32 products) or ``besttwo``, the exact mode
keeping the best two where it would take 3xTF32 products, ``TORCHKM_EXACT_X3=0``).

    python scripts/diag_exact_x3.py [--shapes 3932160,32,128 245760,32,256 ...] [--variants ...] [--json out.json]
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

SHAPES = ["3932160,32,128", "3932160,32,256", "3932160,32,512", "245760,32,128", "245760,32,256", "245760,32,1024",
          "1000000,16,128", "1000000,24,200"]


def main() -> None:
    from torchkm._kernels.assign import AssignPass
    from torchkm._kernels.configs import assign_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=SHAPES, metavar="N,D,K")
    parser.add_argument("--variants", nargs="*", default=["exact:besttwo:default", "x3:tf32x3:exact",
                                                           "x3rows:exact:default", "fast:fast:default"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    def config_of(spec: str, n: int, k: int, d: int, dtype: torch.dtype) -> dict | None:
        if spec == "default":
            return None
        if spec in ("exact", "fast"):
            return assign_config(n, k, d, dtype, spec)
        d_pad = max(16, 1 << (d - 1).bit_length())
        bn, bk, bd, warps, stages = (d_pad if v == "D" else int(v) for v in spec.split(","))
        return {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_D": bd, "num_warps": warps, "num_stages": stages,
                "EAGER": False, "SWAP": False}

    out = []
    for shape in args.shapes:
        n, d, k = (int(v) for v in shape.split(","))
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator(device="cuda").manual_seed(int(time.time() * 1000) % 2**31)
            x = torch.randn(n, d, device="cuda", generator=g).to(dtype)
            offset = x.float().mean(0)
            c = x[torch.randint(0, n, (k,), device="cuda", generator=g)].float() - offset
            norms = x.float().norm(dim=1)
            rows = torch.randperm(n, device="cuda")[:8192]
            dist = torch.cdist(x[rows].double() - offset.double(), c.double()) ** 2
            two = dist.topk(2, dim=1, largest=False).values
            clear = (two[:, 1] - two[:, 0]) > 1e-5 * two[:, 0]
            times = {}
            for variant in args.variants:
                name, precision, spec = variant.split(":")
                config = config_of(spec, n, k, d, dtype)
                if precision == "besttwo":
                    os.environ["TORCHKM_EXACT_X3"] = "0"
                p = AssignPass(x, k, "exact" if precision == "besttwo" else precision, update=True, config=config)
                os.environ.pop("TORCHKM_EXACT_X3", None)
                labels = torch.full((n,), -7, dtype=torch.int64, device="cuda")

                def call(p=p, labels=labels, x=x):
                    p(x, c, offset=offset, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None,
                      labels=labels)

                call()
                ref = torch.zeros(k, d, dtype=torch.float64, device="cuda").index_add_(0, labels, x.double() - offset.double())
                row = {"n": n, "d": d, "k": k, "dtype": str(dtype).split(".")[-1], "variant": name,
                       "precision": precision, "config": config,
                       "labels_off": int(((labels[rows] != dist.argmin(1)) & clear).sum()),
                       "sums_rel_err": float((p.acc_sums.double().sum(0) - ref).abs().max() / ref.abs().max()),
                       "ms": sorted(graph_ms(call) for _ in range(3))[1]}
                times[name] = row["ms"]
                out.append(row)
                print(f"{n}x{d}x{k} {row['dtype']:<9} {name:<6} {row['ms']:.4f} ms off {row['labels_off']} "
                      f"sums {row['sums_rel_err']:.1e}", flush=True)
            if "exact" in times:
                print("  -> " + " ".join(f"{name}/exact {ms / times['exact']:.3f}" for name, ms in times.items()
                                         if name != "exact"), flush=True)
            del x
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()
