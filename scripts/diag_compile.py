"""Diagnose torch.compile of torchkm.assign (and of a VQ training step): which tensors Inductor thinks
each kernel mutates, whether the compiled labels equal the eager ones, and the kernel calls of the
generated code.

    python scripts/diag_compile.py [--n 20011 --d 33 --k 50 --precision exact --vq]

Run with CUDA_LAUNCH_BLOCKING=1 to see which launch faults, if one does.
"""
import argparse
import inspect
import traceback

import torch
import torchkm._kernels._common as common
import torchkm._kernels.assign as assign_module
import torchkm._kernels.centroids as centroids_module
from torch._higher_order_ops import triton_kernel_wrap as tkw
from torch._inductor.utils import run_and_get_code

import torchkm

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=20011)
parser.add_argument("--d", type=int, default=33)
parser.add_argument("--k", type=int, default=50)
parser.add_argument("--precision", default="exact")
parser.add_argument("--vq", action="store_true", help="also compile a VectorQuantizer training step")
args = parser.parse_args()

calls = []


def recording(kernel):
    class Rec:
        def __getitem__(self, grid):
            def run(*a, **kw):
                calls.append((kernel, grid, a, kw))
                return kernel[grid](*a, **kw)
            return run
    return Rec()


x = torch.randn(args.n, args.d, device="cuda")
c = torch.randn(args.k, args.d, device="cuda")
assign_module.launcher = centroids_module.launcher = recording
torchkm.assign(x, c, precision=args.precision)
assign_module.launcher = centroids_module.launcher = common.launcher
print("identify_mutated_tensors signature:", inspect.signature(tkw.identify_mutated_tensors))
for kernel, grid, a, kw in calls:
    bound = dict(zip(kernel.arg_names, a))
    bound.update(kw)
    kwargs = {key: v for key, v in bound.items() if key not in ("num_warps", "num_stages")}
    try:
        mutated = tkw.identify_mutated_tensors(kernel, kwargs, {})
    except TypeError:
        mutated = tkw.identify_mutated_tensors(kernel, kwargs)
    print(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, grid, "mutates", sorted(mutated))

compiled = torch.compile(lambda a, b: torchkm.assign(a, b, precision=args.precision), fullgraph=True)
try:
    (labels, dist), codes = run_and_get_code(compiled, x, c)
    torch.cuda.synchronize()
    eager = torchkm.assign(x, c, precision=args.precision)
    print("compiled assign: labels differ from eager:", int((labels != eager[0]).sum()),
          "| out of range:", int(((labels < 0) | (labels >= args.k)).sum()))
    for code in codes:
        for line in code.splitlines():
            if ".run(" in line or "empty_strided" in line or "zeros" in line or "clone" in line:
                print("   ", line.strip()[:220])
except Exception:  # noqa: BLE001 (a diagnostic: print it and go on)
    traceback.print_exc()

if args.vq:
    from torchkm.nn import VectorQuantizer

    torch._dynamo.reset()
    vq = VectorQuantizer(args.k, args.d, kmeans_init=False, precision=args.precision).cuda()
    step = torch.compile(vq, fullgraph=True)
    try:
        for i in range(3):
            rows = x.clone().requires_grad_(True)
            if i == 0:
                out, codes = run_and_get_code(step, rows)
            else:
                out = step(rows)
            (out.quantized.sum() + out.loss).backward()
            torch.cuda.synchronize()
            print(f"compiled VQ step {i}: indices in range:", bool(((out.indices >= 0) & (out.indices < args.k)).all()))
        for code in codes:
            for line in code.splitlines():
                if ".run(" in line or "clone" in line:
                    print("   ", line.strip()[:220])
    except Exception:  # noqa: BLE001
        traceback.print_exc()
