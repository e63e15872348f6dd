"""Diagnose torch.compile of torchkm.assign (and of a VQ training step): which tensors Inductor thinks
each kernel mutates, whether the compiled labels equal the eager ones, and the kernel calls of the
generated code.

    python scripts/diag_compile.py [--n 20011 --d 33 --k 50 --precision exact --vq]
        [--poison 127] [--backend aot_eager] [--eager-steps 20] [--dump DIR]

``--poison B`` fills the CUDA caching allocator's free memory with the byte B first, so that a
kernel reading memory nothing wrote sees B's pattern (0x7F7F7F7F as int32) instead of whatever an
earlier run left there. Run with CUDA_LAUNCH_BLOCKING=1 to see which launch faults, if one does.
"""
import argparse
import inspect
import os
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
parser.add_argument("--only-vq", action="store_true", help="skip the compiled assign")
parser.add_argument("--poison", type=int, default=None, help="fill the allocator's free memory with this byte")
parser.add_argument("--backend", default="inductor")
parser.add_argument("--eager-steps", type=int, default=0, help="eager VQ training steps before compiling")
parser.add_argument("--dump", default=None, help="folder for the generated code")
args = parser.parse_args()


def poison(byte: int) -> None:
    """Leave the caching allocator's pools (large and small blocks) full of ``byte``."""
    held = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda").fill_(byte) for _ in range(24)]
    held += [torch.empty(1 << 18, dtype=torch.uint8, device="cuda").fill_(byte) for _ in range(2000)]
    held += [torch.empty(512, dtype=torch.uint8, device="cuda").fill_(byte) for _ in range(4000)]
    torch.cuda.synchronize()
    del held


def dump(name: str, codes: list[str]) -> None:
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for i, code in enumerate(codes):
            with open(os.path.join(args.dump, f"{name}_{i}.py"), "w") as f:
                f.write(code)


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
if not args.only_vq:
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

    eager = torchkm.assign(x, c, precision=args.precision)
    if args.poison is not None:
        poison(args.poison)
    compiled = torch.compile(lambda a, b: torchkm.assign(a, b, precision=args.precision), fullgraph=True,
                             backend=args.backend)
    try:
        if args.backend == "inductor":
            (labels, dist), codes = run_and_get_code(compiled, x, c)
            dump("assign", codes)
        else:
            labels, dist, codes = *compiled(x, c), []
        torch.cuda.synchronize()
        print("compiled assign: labels differ from eager:", int((labels != eager[0]).sum()),
              "| out of range:", int(((labels < 0) | (labels >= args.k)).sum()),
              "| distances differ:", int((dist != eager[1]).sum()))
        for code in codes:
            for line in code.splitlines():
                if ".run(" in line or "empty_strided" in line or "zeros" in line or "clone" in line:
                    print("   ", line.strip()[:220])
    except Exception:  # noqa: BLE001 (a diagnostic: print it and go on)
        traceback.print_exc()

if args.vq or args.only_vq:
    from torchkm.nn import VectorQuantizer

    torch._dynamo.reset()
    if args.eager_steps:
        warm = VectorQuantizer(args.k, args.d, kmeans_init=False, precision=args.precision).cuda()
        for _ in range(args.eager_steps):
            rows = x.clone().requires_grad_(True)
            out = warm(rows)
            (out.quantized.sum() + out.loss).backward()
        torch.cuda.synchronize()
        print(f"{args.eager_steps} eager VQ steps: indices in range:",
              bool(((out.indices >= 0) & (out.indices < args.k)).all()))
        del warm, out
    if args.poison is not None:
        poison(args.poison)
    vq = VectorQuantizer(args.k, args.d, kmeans_init=False, precision=args.precision).cuda()
    reference = VectorQuantizer(args.k, args.d, kmeans_init=False, precision=args.precision).cuda()
    reference.load_state_dict(vq.state_dict())
    step = torch.compile(vq, fullgraph=True, backend=args.backend)
    try:
        for i in range(3):
            rows = x.clone().requires_grad_(True)
            if i == 0 and args.backend == "inductor":
                out, codes = run_and_get_code(step, rows)
                dump("vq", codes)
            else:
                out = step(rows)
            (out.quantized.sum() + out.loss).backward()
            want = reference(x.clone().requires_grad_(True))
            torch.cuda.synchronize()
            print(f"compiled VQ step {i}: indices in range:", bool(((out.indices >= 0) & (out.indices < args.k)).all()),
                  "| differ from eager:", int((out.indices != want.indices).sum()),
                  "| codebook max diff:", float((vq.codebook - reference.codebook).abs().max()))
        if args.backend == "inductor":
            for code in codes:
                for line in code.splitlines():
                    if ".run(" in line or "clone" in line:
                        print("   ", line.strip()[:220])
    except Exception:  # noqa: BLE001
        traceback.print_exc()
