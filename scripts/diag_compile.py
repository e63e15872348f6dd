"""Diagnose torch.compile of torchkm.assign: which tensors Inductor thinks each kernel mutates."""
import inspect

import torch

import torchkm
import torchkm._kernels._common as common
from torch._higher_order_ops import triton_kernel_wrap as tkw

calls = []
orig = common.launcher


def recording(kernel):
    class Rec:
        def __getitem__(self, grid):
            def run(*args, **kw):
                calls.append((kernel, grid, args, kw))
                return kernel[grid](*args, **kw)
            return run
    return Rec()


import torchkm._kernels.assign as A
import torchkm._kernels.centroids as C
A.launcher = C.launcher = recording
x = torch.randn(20011, 33, device="cuda")
c = x[:50].clone()
torchkm.assign(x, c)
A.launcher = C.launcher = orig
print("identify_mutated_tensors signature:", inspect.signature(tkw.identify_mutated_tensors))
for kernel, grid, args, kw in calls:
    names = kernel.arg_names
    bound = dict(zip(names, args))
    bound.update(kw)
    kwargs = {k: v for k, v in bound.items() if k not in ("num_warps", "num_stages")}
    try:
        mutated = tkw.identify_mutated_tensors(kernel, kwargs, {})
    except TypeError:
        mutated = tkw.identify_mutated_tensors(kernel, kwargs)
    print(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, "mutates", sorted(mutated))
from torch._inductor.utils import run_and_get_code

compiled = torch.compile(lambda a, b: torchkm.assign(a, b), fullgraph=True)
(labels, dist), codes = run_and_get_code(compiled, x, c)
eager = torchkm.assign(x, c)
print("labels differ:", int((labels != eager[0]).sum()))
for code in codes:
    for line in code.splitlines():
        if ".run(" in line or "empty_strided" in line or "zeros" in line:
            print("   ", line.strip()[:200])
