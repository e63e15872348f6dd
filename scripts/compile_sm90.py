"""Compile every kernel variant the benchmark shapes use for sm_90 on a machine without a GPU.

Triton lowers to PTX and runs its bundled ptxas, so front-end errors and shared-memory overruns
show up here before any device time is spent:  .venv/bin/python scripts/compile_sm90.py
"""
import sys
import time

import torch
import torchkm._kernels._common as common
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TY = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.bool: "i1"}
seen = set()
class Compiler:
    def __init__(self, fn): self.fn = fn
    def __getitem__(self, grid): return self
    def __call__(self, *args, **kw):
        fn = self.fn
        names = fn.arg_names
        bound = dict(zip(names, args)); bound.update(kw)
        opts = {k: bound.pop(k) for k in ("num_warps", "num_stages") if k in bound}
        sig, consts = {}, {}
        for i, name in enumerate(names):
            v = bound[name]
            p = fn.params[i]
            if p.is_constexpr:
                sig[name] = "constexpr"; consts[name] = v
            elif isinstance(v, torch.Tensor):
                sig[name] = "*" + TY[v.dtype]
            elif isinstance(v, bool):
                sig[name] = "i1"
            elif isinstance(v, int):
                sig[name] = "i64" if abs(v) >= 2**31 else "i32"
            elif isinstance(v, float):
                sig[name] = "fp32"
            else:
                raise TypeError(name)
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted((k, str(v)) for k, v in consts.items())), tuple(sorted(opts.items())))
        if key in seen: return
        seen.add(key)
        t0 = time.time()
        src = ASTSource(fn, sig, consts)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
        print(f"ok {fn.__name__} {time.time()-t0:.1f}s regs={getattr(k, 'n_regs', '?')} spills={getattr(k,'n_spills','?')} shared={k.metadata.shared} {opts} " + " ".join(f"{a}={b}" for a,b in consts.items() if a.isupper()), flush=True)
common.launcher = lambda fn: Compiler(fn)
import torchkm._kernels.assign as A
import torchkm._kernels.distances as D
import torchkm._kernels.update as U

A.launcher = U.launcher = D.launcher = common.launcher
A.num_persistent_programs = lambda dev: 4
for (n, d, k) in [(1000, 3, 100), (245760, 32, 32), (245760, 32, 1024), (100_000_000, 2, 32), (1_000_000, 128, 4096), (1_000_000, 768, 8192), (32768, 256, 8192)]:
    for dt in (torch.float32, torch.bfloat16):
        x = torch.empty(0, d, dtype=dt).expand(n, d) if False else torch.empty(1, d, dtype=dt)
        # fake shape: only dtypes and strides matter for compilation
        class X(torch.Tensor): pass
        xx = torch.empty(2, d, dtype=dt)
        c = torch.randn(k, d)
        for prec in ("exact", "fast"):
            sums = torch.zeros(k, d); counts = torch.zeros(k)
            try:
                A.assign(xx, c, precision=prec, offset=torch.zeros(d), raw_norms=torch.ones(2), sums=sums, counts=counts, store_sq_dist=False, prev_labels=torch.zeros(2, dtype=torch.int64),
                         config=A.assign_config(n, k, d, dt, prec))
            except Exception as e:
                print("FAIL", n, d, k, dt, prec, repr(e)[:3000]); sys.exit(1)
    U.update(xx, torch.zeros(2, dtype=torch.int64), 5); U.update(xx, torch.zeros(2, dtype=torch.int64), 5, deterministic=True)
D.sq_distances(torch.empty(2, 5), torch.randn(3, 5))
