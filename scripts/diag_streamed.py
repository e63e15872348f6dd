"""The streamed-feature search (rows wider than one chunk, e.g. 1M x 768, k = 8192): tile configs,
the re-search's share, and a cuBLAS product of the same shape, in one process.

For each dtype: the GPU time of ``x @ c.T`` through cuBLAS (row chunks, tf32 for fp32 rows: what a
GEMM of this shape reaches, no minimum), then the fused assignment pass (search + sums, ``--calls``
calls replayed in a CUDA graph) for the fast and exact modes at the default config and at each
``--configs`` entry (``TORCHKM_ASSIGN_CONFIG``). Every exact variant's labels are checked against
float64 on sampled rows (``bench_lloyd.check``); a torch.profiler pass of each mode's default shows
the kernels' split (search, re-search, epilogue). ``--recheck-configs`` also times the exact pass at
other re-search configs (``TORCHKM_RECHECK_CONFIG/TORCHKM_RESEARCH_CHUNKS``). The centroids are
sampled rows, or with ``--lloyd-iters N`` the means after N Lloyd iterations from them (on random
rows those crowd near the origin, and more rows are close calls). Prints a table and writes JSON.

    python scripts/diag_streamed.py [--n 1000000 --d 768 --k 8192] [--configs 256,128,64,8,3,1 ...]
        [--recheck-configs 128,128,32,8,4,1/8 ...] [--exact-env TORCHKM_RESEARCH_CANDIDATES=0]
        [--env TORCHKM_HALF_OPERANDS=0] [--lloyd-iters 2]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from triton.runtime.errors import OutOfResources

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import check, distinct_rows, graph_ms, ms


def gemm_ms(x: torch.Tensor, c: torch.Tensor, chunk: int = 1 << 17) -> float:
    out = torch.empty(chunk, c.shape[0], dtype=x.dtype, device=x.device)
    ct = c.to(x.dtype).T

    def run():
        for s in range(0, x.shape[0], chunk):
            rows = x[s:s + chunk]
            torch.mm(rows, ct, out=out[: rows.shape[0]])

    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return ms(run)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def pass_ms(x: torch.Tensor, c: torch.Tensor, precision: str, calls: int, update: bool = True) -> float:
    from torchkm._kernels.assign import AssignPass

    n, k = x.shape[0], c.shape[0]
    norms = torch.cat([x[s:s + (1 << 22)].float().norm(dim=1) for s in range(0, n, 1 << 22)])
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    run = AssignPass(x, k, precision, update=update)
    c32 = c.float().contiguous()
    return graph_ms(lambda: run(x, c32, offset=None, row_scale=None, raw_norms=norms, sample_weight=None,
                                prev_labels=None, labels=labels), calls=calls)


def kernel_split(x: torch.Tensor, c: torch.Tensor, precision: str) -> dict[str, float]:
    """GPU ms of each kernel in one pass (torch.profiler), by name."""
    from torch.profiler import ProfilerActivity, profile
    from torchkm._kernels.assign import AssignPass

    n, k = x.shape[0], c.shape[0]
    norms = torch.cat([x[s:s + (1 << 22)].float().norm(dim=1) for s in range(0, n, 1 << 22)])
    labels = torch.empty(n, dtype=torch.int64, device=x.device)
    run = AssignPass(x, k, precision, update=True)
    c32 = c.float().contiguous()

    def call():
        run(x, c32, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=None, labels=labels)

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if t > 0:
            out[e.key[:40]] = round(t / 1e3, 3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])


def lloyd_centroids(x: torch.Tensor, c: torch.Tensor, iters: int) -> torch.Tensor:
    """The centroids after ``iters`` Lloyd iterations from ``c`` (fast labels, float64 means; an
    empty cluster keeps its centroid)."""
    from torchkm._kernels.assign import assign

    for _ in range(iters):
        labels = assign(x, c, precision="fast", store_sq_dist=False).labels
        sums = torch.zeros(c.shape, dtype=torch.float64, device=x.device)
        for s in range(0, x.shape[0], 1 << 20):
            sums.index_add_(0, labels[s:s + (1 << 20)], x[s:s + (1 << 20)].double())
        counts = torch.bincount(labels, minlength=c.shape[0]).double()[:, None]
        c = torch.where(counts > 0, sums / counts.clamp_min(1), c.double()).float()
    return c


def _settings(spec: str) -> dict[str, str]:
    """``VAR=VALUE`` or several joined by ``;`` (one variant under all of them)."""
    return dict(part.split("=", 1) for part in spec.split(";"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--precisions", nargs="*", default=["fast", "exact"])
    parser.add_argument("--configs", nargs="*", default=[], help="BLOCK_N,BLOCK_K,BLOCK_D,num_warps,num_stages,EAGER")
    parser.add_argument("--recheck-configs", nargs="*", default=[], help="re-search CONFIG/CHUNKS for the exact pass")
    parser.add_argument("--exact-env", nargs="*", default=[], help="VAR=VALUE[;VAR=VALUE]: the exact pass under those settings too")
    parser.add_argument("--env", nargs="*", default=[], help="VAR=VALUE[;VAR=VALUE]: every mode's pass under those settings too")
    parser.add_argument("--lloyd-iters", type=int, default=0, help="centroids after this many Lloyd iterations")
    parser.add_argument("--calls", type=int, default=3, help="pass calls per captured graph")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d")}, flush=True)
    n, d, k = args.n, args.d, args.k
    g = torch.Generator(device="cuda").manual_seed(int(time.time()))
    x32 = torch.randn(n, d, device="cuda", generator=g)
    c0 = distinct_rows(x32, k, g)
    rows = []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for dtype_name in args.dtypes:
        x = x32.to(getattr(torch, dtype_name))
        base = {"n": n, "d": d, "k": k, "dtype": dtype_name, "lloyd_iters": args.lloyd_iters}
        c = lloyd_centroids(x, c0, args.lloyd_iters)
        t = gemm_ms(x, c)
        record({**base, "variant": "cuBLAS x @ c.T", "ms": round(t, 3), "TFLOPs": round(2 * n * k * d / t / 1e9, 1)})
        for precision in args.precisions:
            record({**base, "variant": f"{precision} default, search only",
                    "ms": round(pass_ms(x, c, precision, args.calls, update=False), 3)})
            record({**base, "variant": f"{precision} default, kernels", "split": kernel_split(x, c, precision)})
            variants = [(cfg, {"TORCHKM_ASSIGN_CONFIG": cfg}) for cfg in args.configs]
            variants += [(spec, _settings(spec)) for spec in args.env]
            if precision == "exact":
                variants += [(f"re-search {spec}", dict(zip(("TORCHKM_RECHECK_CONFIG", "TORCHKM_RESEARCH_CHUNKS"),
                                                            spec.split("/")))) for spec in args.recheck_configs]
                variants += [(spec, _settings(spec)) for spec in args.exact_env]
            for cfg, variables in [(None, {}), *variants]:
                os.environ.update(variables)
                try:
                    row = {**base, "variant": f"{precision} {cfg or 'default'}",
                           "ms": round(pass_ms(x, c, precision, args.calls), 3)}
                    if precision == "exact":
                        got = check(x, c)
                        row.update(rechecked_pct=round(got["rechecked_pct"], 3),
                                   off_beyond_ties_pct=round(got["labels_off_beyond_ties_pct"], 4))
                        if cfg in args.exact_env or cfg in args.env:
                            row["split"] = kernel_split(x, c, precision)
                except OutOfResources as err:  # shared memory or registers
                    row = {**base, "variant": f"{precision} {cfg}", "error": type(err).__name__}
                finally:
                    for variable in variables:
                        del os.environ[variable]
                record(row)
        del x
        torch.cuda.empty_cache()
    print(f"\n{'dtype':<9} {'variant':<36} {'ms':>9}  notes")
    for r in rows:
        notes = r.get("error") or (f"{r['TFLOPs']} TFLOP/s" if "TFLOPs" in r else "") or (
            f"re-searched {r['rechecked_pct']} %, off beyond ties {r['off_beyond_ties_pct']} %" if "rechecked_pct" in r else "")
        if "split" in r:
            notes = f"{notes} {r['split']}".strip()
        print(f"{r['dtype']:<9} {r['variant']:<36} {r.get('ms', float('nan')):>9.3f}  {notes}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
