"""Assignment pass (nearest centroid of every row) on the GPU: torch baseline, Triton kernel, floor.

Correctness first: on every workload the kernel's labels are checked against a float64 oracle on a
sample of rows (fresh random data each run) before anything is timed. Then the median time of one
assignment pass for: the pure-torch engine (chunked GEMM + argmin, torchkm's reference), the Triton
kernel in fp32 ("ieee" products), tf32 and bf16; and the floor, the larger of FLOPs over the
measured tensor-core rate and bytes over the measured copy bandwidth.

    python benchmarks/bench_assign.py --json out/bench_assign.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import triton
from triton.testing import do_bench

from torchkm._kernels.assign import assign as kernel_assign
from torchkm._reference import DataView
from torchkm._reference import assign as reference_assign

WORKLOADS = [  # (name, n, d, k), DESIGN.md section 4
    ("seed000-A", 245_760, 32, 32),
    ("seed000-B", 245_760, 32, 1024),
    ("100Mx2", 100_000_000, 2, 32),
    ("SIFT-like", 1_000_000, 128, 4096),
    ("embeddings", 1_000_000, 768, 8192),
    ("VQ-batch", 32_768, 256, 8192),
]


def ms(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def ceilings() -> dict[str, float]:
    x = torch.randn(256 * 2**20, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    copy_tbs = 2 * x.numel() * 4 / (ms(lambda: y.copy_(x)) * 1e-3) / 1e12
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    flops = 2 * 8192**3
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = flops / (ms(lambda: a @ b) * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    fp32 = flops / (ms(lambda: a @ b) * 1e-3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = prev
    ah, bh = a.bfloat16(), b.bfloat16()
    bf16 = flops / (ms(lambda: ah @ bh) * 1e-3) / 1e12
    return {"copy_TBps": copy_tbs, "fp32_TFLOPs": fp32, "tf32_TFLOPs": tf32, "bf16_TFLOPs": bf16}


def label_errors(x: torch.Tensor, c: torch.Tensor, labels: torch.Tensor, rows: int = 8192) -> tuple[float, float]:
    """Fraction of sampled rows off the float64 argmin, and the fraction of those beyond a near-tie."""
    idx = torch.randint(0, x.shape[0], (rows,), device=x.device)
    xs, cs = x[idx].double(), c.double()
    d = (xs * xs).sum(1, keepdim=True) - 2 * xs @ cs.T + (cs * cs).sum(1)
    true = d.argmin(1)
    got = labels[idx]
    off = got != true
    gap = d.gather(1, got[:, None]).squeeze(1) - d.gather(1, true[:, None]).squeeze(1)
    tol = 1e-5 * ((xs * xs).sum(1) + (cs * cs).sum(1).max())
    return float(off.double().mean()), float((off & (gap > tol)).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="skip the two largest workloads")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    ceil = ceilings()
    print(info)
    print({k: round(v, 2) for k, v in ceil.items()})
    rows = []
    header = f"{'workload':<12} {'n':>11} {'d':>4} {'k':>5} | {'torch fp32':>10} {'ours ieee':>9} {'ours tf32':>9} {'ours bf16':>9} | {'floor tf32':>10} {'floor bf16':>10} | {'off% tf32':>9} {'bad% tf32':>9} {'off% bf16':>9}"
    print(header)
    for name, n, d, k in WORKLOADS:
        if args.quick and n * d > 200_000_000:
            continue
        g = torch.Generator(device="cuda").manual_seed(int(time.time()))
        x = torch.randn(n, d, device="cuda", generator=g)
        c = x[torch.randint(0, n, (k,), device="cuda", generator=g)] + 0.01 * torch.randn(k, d, device="cuda", generator=g)
        xb = x.bfloat16()
        row = {"workload": name, "n": n, "d": d, "k": k}
        # Correctness before speed: every output written and in range, labels vs float64.
        for mode, xi, prec in (("ieee", x, "ieee"), ("tf32", x, "tf32"), ("bf16", xb, "ieee")):
            labels, best, _ = kernel_assign(xi, c, input_precision=prec)
            assert int(labels.min()) >= 0 and int(labels.max()) < k and bool(torch.isfinite(best).all()), mode
            row[f"off_{mode}"], row[f"bad_{mode}"] = label_errors(x, c, labels)
        view = DataView(x, torch.float32)
        row["ms_torch_fp32"] = ms(lambda: reference_assign(view, c))
        row["ms_ieee"] = ms(lambda: kernel_assign(x, c, input_precision="ieee"))
        row["ms_tf32"] = ms(lambda: kernel_assign(x, c, input_precision="tf32"))
        row["ms_bf16"] = ms(lambda: kernel_assign(xb, c))
        flops = 2.0 * n * k * d
        row["floor_tf32"] = max(flops / (ceil["tf32_TFLOPs"] * 1e12), n * d * 4 / (ceil["copy_TBps"] * 1e12)) * 1e3
        row["floor_bf16"] = max(flops / (ceil["bf16_TFLOPs"] * 1e12), n * d * 2 / (ceil["copy_TBps"] * 1e12)) * 1e3
        rows.append(row)
        print(f"{name:<12} {n:>11,} {d:>4} {k:>5} | {row['ms_torch_fp32']:>10.3f} {row['ms_ieee']:>9.3f} {row['ms_tf32']:>9.3f} {row['ms_bf16']:>9.3f} | "
              f"{row['floor_tf32']:>10.3f} {row['floor_bf16']:>10.3f} | {100 * row['off_tf32']:>9.3f} {100 * row['bad_tf32']:>9.3f} {100 * row['off_bf16']:>9.3f}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "ceilings": ceil, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
