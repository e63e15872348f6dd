"""The Hopper search (triton_kernels/hopper_search.py) A/B against the tl.dot search, in one process.

For each workload and dtype: GPU time of the Gluon search alone, and of the fused pass (search +
sums, 20 calls replayed in a CUDA graph) with the tl.dot search (``TORCHKM_HOPPER_SEARCH=0``) and
with the Hopper search, fast and exact; the floor (the products' FLOPs at the tf32 / bf16 GEMM rate
measured in the same run); and for each exact variant its labels against float64 on sampled rows
and its sums (``bench_lloyd.check``). Prints a table and writes JSON.

    python scripts/diag_hopper_search.py [--only SIFT-like VQ-batch sift] [--dtypes float32 bfloat16] [--json out.json]
        [--searches hopper] [--packed 1 no-half]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import ceilings, check, graph_ms

from scripts.diag_exact_bound import env, pass_ms

WORKLOADS = {"SIFT-like": (1_000_000, 128, 4096), "VQ-batch": (32_768, 256, 8192), "sift": (None, 128, 4096),
             "d64": (1_000_000, 64, 4096), "vocab-1M": (1_000_000, 128, 65_536)}


def search_ms(x: torch.Tensor, c: torch.Tensor, check_: bool) -> float:
    from torchkm._kernels import hopper_search
    from torchkm._kernels.centroids import prepare_centroids

    prepared = prepare_centroids(c.float().contiguous(), None, x.dtype, fast=True, split=False, exact=False)
    out = torch.empty(hopper_search.record_rows(True), x.shape[0], device=x.device)
    return graph_ms(lambda: hopper_search.search(x, prepared.c_mma, prepared.bias, out, check=check_))


def record_off_pct(x: torch.Tensor, c: torch.Tensor) -> float:
    """Percent of 4096 sampled rows whose search record's label is not the float64 argmin, beyond
    near-ties (a gap under 1e-3 of the score scale): a config is timed only after it is checked."""
    from torchkm._kernels import hopper_search
    from torchkm._kernels.centroids import prepare_centroids

    prepared = prepare_centroids(c.float().contiguous(), None, x.dtype, fast=True, split=False, exact=False)
    out = torch.full((hopper_search.record_rows(True), x.shape[0]), float("nan"), device=x.device)
    hopper_search.search(x, prepared.c_mma, prepared.bias, out, check=True)
    rows = torch.randint(0, x.shape[0], (4096,), device=x.device)
    scores = prepared.bias.double()[None, :] + x[rows].double() @ prepared.c_mma.double().T
    top = scores.topk(2, dim=1, largest=False).values
    got = out.view(torch.int32)[1, rows].long()
    near = (top[:, 1] - top[:, 0]) < 1e-3 * scores.abs().max(dim=1).values
    wrong = (scores.gather(1, got[:, None]).squeeze(1) > top[:, 0]) & ~near
    return 100.0 * float(wrong.double().mean()) + (100.0 if out[0].isnan().any() else 0.0)


def config_rows(base: dict, x: torch.Tensor, c: torch.Tensor, configs: list[str]) -> list[dict]:
    """The search alone under each ``TORCHKM_HOPPER_CONFIG`` (BLOCK_N,BLOCK_K,STAGES,warps)."""
    rows = []
    for spec in configs:
        with env(TORCHKM_HOPPER_CONFIG=spec):
            off = record_off_pct(x, c)
            for label, check_ in [("fast", False), ("exact", True)]:
                rows.append({**base, "variant": f"search alone, {label}, config {spec}",
                             "ms": search_ms(x, c, check_), "labels_off_beyond_ties_pct": off})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=["SIFT-like", "VQ-batch"])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--sift", default=".data/sift.npy")
    parser.add_argument("--json", default=None)
    parser.add_argument("--searches", nargs="*", default=["tl.dot", "hopper"],
                        help="which searches the passes take (tl.dot, hopper)")
    parser.add_argument("--chunk-rows", nargs="*", default=[],
                        help="also time the Hopper passes with these TORCHKM_HOPPER_CHUNK_ROWS (0: the default); "
                             "ROWS,0: with TORCHKM_HOPPER_OVERLAP=0 (one stream)")
    parser.add_argument("--packed", nargs="*", default=["1"],
                        help="time the Hopper passes under each of these TORCHKM_HOPPER_PACKED settings "
                             "(1: the default, no-half: fp16 operands unpacked, 0: nothing packed)")
    parser.add_argument("--configs", nargs="*", default=[],
                        help="also time the search alone under these BLOCK_N,BLOCK_K,STAGES,warps configs")
    args = parser.parse_args()
    rates = ceilings()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d"), **rates}
    print(meta, flush=True)
    rows = []
    for name in args.only:
        n, d, k = WORKLOADS[name]
        g = torch.Generator(device="cuda").manual_seed(int(time.time()))
        if name == "sift":
            if not os.path.exists(args.sift):
                continue
            x32 = torch.from_numpy(np.load(args.sift).astype(np.float32)).cuda()
            n = x32.shape[0]
        else:
            x32 = torch.randn(n, d, device="cuda", generator=g)
        c = x32[torch.randint(0, n, (k,), device="cuda", generator=g)].clone()
        for dtype_name in args.dtypes:
            x = x32.to(getattr(torch, dtype_name))
            rate = rates["tf32_TFLOPs"] if dtype_name == "float32" else rates["bf16_TFLOPs"]
            floor = 2 * n * d * k / (rate * 1e12) * 1e3
            base = {"workload": name, "n": n, "d": d, "k": k, "dtype": dtype_name, "floor_ms": floor}
            from torchkm._kernels import hopper_search

            if hopper_search.supported(x, k, scaled=False, split=False, row_list=False):
                for label, check_ in [("search alone, fast", False), ("search alone, exact (best two + third)", True)]:
                    rows.append({**base, "variant": label, "ms": search_ms(x, c, check_)})
                rows.extend(config_rows(base, x, c, args.configs))
            variants = [("tl.dot", "0", "1")] + [("hopper", "1", packed) for packed in args.packed]
            for precision in ("fast", "exact"):
                for search, setting, packed in variants:
                    if search not in args.searches:
                        continue
                    label = f"pass, {precision}, {search}" + (f", packed={packed}" if search == "hopper" else "")
                    with env(TORCHKM_HOPPER_SEARCH=setting, TORCHKM_HOPPER_PACKED=packed):
                        row = {**base, "variant": label, "ms": pass_ms(x, c, precision)}
                        if precision == "exact":
                            row.update(check(x, c))
                    rows.append(row)
            for chunk in args.chunk_rows:
                chunk_rows, _, overlap = chunk.partition(",")
                setting = {"TORCHKM_HOPPER_CHUNK_ROWS": chunk_rows} if chunk_rows != "0" else {}
                setting["TORCHKM_HOPPER_OVERLAP"] = overlap or "1"
                for precision in ("fast", "exact"):
                    with env(TORCHKM_HOPPER_SEARCH="1", **setting):
                        rows.append({**base, "variant": f"pass, {precision}, hopper, chunk rows {chunk}",
                                     "ms": pass_ms(x, c, precision)})
            for row in rows:
                if row["workload"] == name and row["dtype"] == dtype_name:
                    print(f"{name:<10} {dtype_name:<9} {row['variant']:<40} {row['ms']:8.3f} ms  "
                          f"{row['ms'] / floor:5.2f}x floor ({floor:.3f})"
                          + (f"  re-searched {row['rechecked_pct']:6.3f} %" if "rechecked_pct" in row else "")
                          + (f"  off beyond ties {row['labels_off_beyond_ties_pct']:.3f} %"
                             if "labels_off_beyond_ties_pct" in row else ""), flush=True)
            del x
        del x32
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
