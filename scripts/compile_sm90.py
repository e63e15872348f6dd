"""Compile every kernel variant the benchmark shapes use for sm_90 on a machine without a GPU.

Triton lowers to PTX and runs its bundled ptxas, so front-end errors, shared-memory overruns and
register spills show up here before any device time is spent (the Gluon Hopper search too, its
tensor descriptors built from CPU tensors):

    .venv/bin/python scripts/compile_sm90.py                 # every variant of the default configs
    .venv/bin/python scripts/compile_sm90.py --sweep SIFT-like:bfloat16:fast 128,128,128,8,2,1 ...

Register counts and spills depend on the Triton version: to see what the device image (Triton 3.6)
builds, `pip install --no-deps --target /tmp/t36 triton==3.6.0` and run with `PYTHONPATH=/tmp/t36`.
Run it with both: CI installs the registry's newest Triton (3.9 on 2026-12-06), which compiles
differently (three kernels failed there that 3.6 compiled, until 2026-12-06), and CI never compiles.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import torchkm._kernels._common as common
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type

TY = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.bool: "i1"}
seen = set()


def ptxas_usage(ptx: str, name: str) -> str:
    """Registers and spill bytes from Triton's bundled ptxas (-v), as the GPU would load the kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=False).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return f"regs={regs.group(1) if regs else '?'} spill_bytes={spill.group(1) if spill else '?'}"
class Compiler:
    """Stands in for a kernel's launch (``kernel[grid](...)``): compiles it for sm_90 as the runtime
    would specialise that launch, and prints its registers and spills. ``source``: ``ASTSource``, or
    Gluon's for the Gluon search (its tensor descriptors, built from CPU tensors, typed by
    ``mangle_type``)."""

    def __init__(self, fn, source=ASTSource):
        self.fn, self.source = fn, source

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kw):
        fn = self.fn
        names = fn.arg_names
        bound = dict(zip(names, args))
        bound.update(kw)
        # Launch options; a Gluon kernel also takes num_warps as a constexpr of its own.
        opts = {k: bound[k] if k in names else bound.pop(k) for k in ("num_warps", "num_stages", "maxnreg")
                if k in bound}
        sig, consts, attrs = {}, {}, {}
        for i, name in enumerate(names):
            v = bound[name]
            p = fn.params[i]
            # As the runtime specialises a launch: an int equal to 1 becomes a constant (a unit
            # stride), and pointers and ints divisible by 16 say so (vectorised and async loads).
            if p.is_constexpr or (type(v) is int and v == 1 and not p.do_not_specialize):
                sig[name] = "constexpr"
                consts[name] = v
            elif isinstance(v, torch.Tensor):
                sig[name] = "*" + TY[v.dtype]
                attrs[(i,)] = [["tt.divisibility", 16]]
            elif isinstance(v, bool):
                sig[name] = "i1"
            elif isinstance(v, int):
                sig[name] = "i64" if abs(v) >= 2**31 else "i32"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            elif isinstance(v, float):
                sig[name] = "fp32"
            else:  # a tensor descriptor
                sig[name] = mangle_type(v)
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted((k, str(v)) for k, v in consts.items())), tuple(sorted(opts.items())))
        if key in seen:
            return
        seen.add(key)
        t0 = time.time()
        k = triton.compile(self.source(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
        shown = ("BLOCK_N", "BLOCK_K", "BLOCK_D", "CHECK", "EAGER", "PRECISION", "ONE_CHUNK", "HAS_ROW_INDEX", "UPDATE",
                 "SEARCHED", "HALF", "CENTRED")
        print(f"ok {fn.__name__} {time.time()-t0:.1f}s {ptxas_usage(k.asm['ptx'], k.metadata.name)} shared={k.metadata.shared} {opts} "
              + " ".join(f"{a}={b}" for a, b in consts.items() if a in shown or fn.__name__ != "_assign_kernel"), flush=True)
common.launcher = lambda fn: Compiler(fn)


def compile_hopper_search(n, d, k, dtype, check, half, centred=False, min_chunk=0):
    """One Gluon search launch as ``assign`` would make it: rows of ``dtype`` (fp32 rows as fp16
    operands with ``half``, less the offset with ``centred``), packed where ``hopper_search.packed``
    says; with ``min_chunk``, writing chunk minima of that many centroids (the ring search's exact
    record)."""
    rows_dtype = torch.float16 if half else dtype
    x = torch.empty(n, d, dtype=dtype)
    c_mma = torch.zeros(k, d, dtype=rows_dtype)
    bias = torch.zeros(k)
    operands = H.search_operands_reference(bias, rows_dtype) if H.packed(x, k, half=half) else None
    H.search(x, c_mma, bias, torch.empty(H.record_rows(check), n), check=check, offset=torch.zeros(d),
             operands=operands, half_scale=torch.ones(3) if half else None, centred=centred,
             **({"chunk_mins": torch.empty(n * -(-k // min_chunk)), "min_chunk": min_chunk} if min_chunk else {}))
# Imported after the patch above, so that every launcher the modules build compiles instead.
import torchkm._kernels.assign as A  # noqa: E402
import torchkm._kernels.boxes as B  # noqa: E402
import torchkm._kernels.centroids as C  # noqa: E402
import torchkm._kernels.distances as D  # noqa: E402
import torchkm._kernels.hopper_search as H  # noqa: E402
import torchkm._kernels.online as O  # noqa: E402
import torchkm._kernels.quantize as Q  # noqa: E402
import torchkm._kernels.update as U  # noqa: E402

A.launcher = B.launcher = U.launcher = D.launcher = C.launcher = O.launcher = Q.launcher = common.launcher
if H.gluon is not None:
    from triton.experimental.gluon._runtime import GluonASTSource

    H._search_kernel = Compiler(H._search_kernel, GluonASTSource)
    H._streamed_kernel = Compiler(H._streamed_kernel, GluonASTSource)
    H._ring_kernel = Compiler(H._ring_kernel, GluonASTSource)
A.num_persistent_programs = lambda dev: 4
WORKLOADS = {"small-d": (1000, 3, 100), "seed000-A": (245760, 32, 32), "seed000-B": (245760, 32, 1024),
             "100Mx2": (100_000_000, 2, 32), "SIFT-like": (1_000_000, 128, 4096), "embeddings": (1_000_000, 768, 8192),
             "VQ-batch": (32768, 256, 8192)}


def compile_assign(n, d, k, dtype, precision, config):
    # Only dtypes, strides and constexprs matter for compilation: a 2-row stand-in for x.
    x = torch.empty(2, d, dtype=dtype)
    c = torch.randn(k, d)
    A.assign(x, c, precision=precision, offset=torch.zeros(d), raw_norms=torch.ones(2), sums=torch.zeros(k, d),
             counts=torch.zeros(k), store_sq_dist=False, prev_labels=torch.zeros(2, dtype=torch.int64), config=config)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", nargs="+", metavar="WORKLOAD:DTYPE:PRECISION CONFIG",
                        help="compile one workload's assign kernel at each config BN,BK,BD,warps,stages,eager")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS),
                        help="only these workloads' passes and Hopper searches, nothing else (a quick check: "
                             "tests/kernels/test_compile_sm90.py runs it so in CI)")
    args = parser.parse_args()
    names = args.workloads or list(WORKLOADS)
    # The resident-row streamed Hopper search and its epilogues (16-bit rows wider than 256
    # features, both modes) compile whatever the default (``hopper_search.STREAMED_DEFAULT``); the
    # ring search (the default's, both modes) is compiled with the Gluon searches below.
    os.environ.setdefault("TORCHKM_HOPPER_STREAMED", "1")
    if args.sweep:
        name, dtype, precision = args.sweep[0].split(":")
        n, d, k = WORKLOADS[name]
        for spec in args.sweep[1:]:
            bn, bk, bd, warps, stages, eager = (int(v) for v in spec.split(","))
            compile_assign(n, d, k, getattr(torch, dtype), precision,
                           {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_D": bd, "num_warps": warps, "num_stages": stages,
                            "EAGER": bool(eager)})
        return
    for n, d, k in (WORKLOADS[name] for name in names):
        for dt in (torch.float32, torch.bfloat16):
            for prec in ("exact", "fast"):
                try:
                    compile_assign(n, d, k, dt, prec, A.assign_config(n, k, d, dt, prec))
                except Exception as e:  # noqa: BLE001 - report any compiler failure, then stop
                    print("FAIL", n, d, k, dt, prec, repr(e)[:3000])
                    sys.exit(1)
        xx = torch.empty(2, d, dtype=dt)
        U.update(xx, torch.zeros(2, dtype=torch.int64), 5)
        U.update(xx, torch.zeros(2, dtype=torch.int64), 5, deterministic=True)
        # The exact pass's sums in label order (``AssignPass.sorted_sums``).
        U.add_sorted_sums(xx, torch.zeros(2, dtype=torch.int32), torch.zeros(5, d), torch.zeros(5))
    # The epilogues over the Hopper search's record (its reference stands in for the search, and
    # the packed operands' torch reference for their launch).
    os.environ["TORCHKM_HOPPER_SEARCH"] = "reference"
    search_operands, H.search_operands = H.search_operands, H.search_operands_reference
    for name in ("SIFT-like", "VQ-batch", "embeddings"):
        if name not in names:
            continue
        n, d, k = WORKLOADS[name]
        for dt in (torch.float32, torch.bfloat16):
            for prec in ("exact", "fast"):
                compile_assign(n, d, k, dt, prec, A.assign_config(n, k, d, dt, prec))
        # The exact epilogue over raw fp16 operands (``TORCHKM_CENTRED_OPERANDS=0``; centred ones are
        # the default, compiled above).
        os.environ["TORCHKM_CENTRED_OPERANDS"] = "0"
        compile_assign(n, d, k, torch.float32, "exact", A.assign_config(n, k, d, torch.float32, "exact"))
        del os.environ["TORCHKM_CENTRED_OPERANDS"]
    del os.environ["TORCHKM_HOPPER_SEARCH"]
    H.search_operands = search_operands
    # The Gluon search itself, as the passes above launch it on an H100 / H200.
    for name in ("SIFT-like", "VQ-batch", "seed000-B", "embeddings"):
        if name not in names:
            continue
        n, d, k = WORKLOADS[name]
        for dt, half in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False)):
            x = torch.empty(2, d, dtype=dt)
            if not H.supported(x, k, scaled=False, split=False, row_list=False,
                               dtype=torch.float16 if half else None):
                continue
            for check in (False, True):
                compile_hopper_search(n, d, k, dt, check, half)
                if half:
                    compile_hopper_search(n, d, k, dt, check, half, centred=True)
            if H.streamed(x) and not half:
                # The ring search (``TORCHKM_HOPPER_STREAMED=ring``; the exact record's under
                # ``TORCHKM_HOPPER_RING_EXACT=1``).
                setting, os.environ["TORCHKM_HOPPER_STREAMED"] = os.environ["TORCHKM_HOPPER_STREAMED"], "ring"
                for check in (False, True):
                    compile_hopper_search(n, d, k, dt, check, half)
                # With the chunk minima its exact pass's candidate re-search reads (``search_chunk_mins``).
                compile_hopper_search(n, d, k, dt, True, half, min_chunk=512)
                os.environ["TORCHKM_HOPPER_STREAMED"] = setting
    if args.workloads:
        return
    D.sq_distances(torch.empty(2, 5), torch.randn(3, 5))
    for d, dt in ((128, torch.float32), (256, torch.bfloat16), (768, torch.float32), (3, torch.float32)):
        D.labelled_sq_distances(torch.empty(2, d, dtype=dt), torch.randn(3, d), torch.zeros(2, dtype=torch.int32))
    # The box engine (algorithm="pruned" at d <= 8): 2 stand-in rows, 2 tiles.
    for d, k in ((1, 32), (2, 32), (3, 100), (8, 7)):
        B.curve_keys(torch.empty(2, d), torch.zeros(d), lo=torch.zeros(d), inv=torch.ones(d))
        cand, count = torch.zeros(2, B.MAX_CANDIDATES, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
        work, work_count = torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        tallies = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        for settle in (None, (torch.zeros(2, dtype=torch.int32), torch.zeros(2, d + 2, dtype=torch.float64),
                              torch.zeros(k * d + k), torch.zeros(1))):
            B.candidates(torch.zeros(2, d), torch.zeros(2, d), torch.randn(k, d), cand, count, work, work_count,
                         settle=settle, control=torch.zeros(2, dtype=torch.int32),
                         stats_prev=torch.zeros(4, dtype=torch.float64))
        for weight in (None, torch.ones(2)):
            B.box_pass(torch.empty(2, d), torch.randn(k, d), cand, count, work, work_count,
                       torch.zeros(2, dtype=torch.int32), torch.zeros(k * d + k), torch.zeros(3),
                       torch.zeros(3, dtype=torch.int64), tallies, block_n=128, sample_weight=weight,
                       control=torch.zeros(2, dtype=torch.int32))
    for normalize in (False, True):
        c = torch.randn(7, 33)
        C.finish_update(torch.zeros(2, 7, 33), torch.zeros(2, 7), c, torch.zeros(3), torch.zeros(3, dtype=torch.int64),
                        torch.zeros(4, dtype=torch.float64), normalize=normalize, old_centroids=c.clone(),
                        sums=c.clone(), counts=torch.zeros(7), control=torch.zeros(2, dtype=torch.int32))
    for x_dtype in (torch.float32, torch.bfloat16):
        C.prepare_centroids(torch.randn(7, 33), torch.zeros(33), x_dtype, fast=True, split=x_dtype != torch.float32,
                            exact=True, zero=(torch.zeros(3), torch.zeros(2, dtype=torch.int32)),
                            control=torch.zeros(2, dtype=torch.int32), stats_prev=torch.zeros(4, dtype=torch.float64),
                            iteration=1, tol=0.0)
    k, d = WORKLOADS["VQ-batch"][2], WORKLOADS["VQ-batch"][1]
    for codes in (k, 65536):
        C.centre_rows(torch.zeros(codes, d))
    C.amax_parts(torch.empty(2, d), torch.zeros(k, d), torch.zeros(8), 4, norms=torch.empty(2))
    for rows_dtype in (torch.float32, torch.bfloat16):
        C.row_norms(torch.empty(2, d, dtype=rows_dtype), torch.empty(2))
        Q.gather_codes(torch.zeros(2, dtype=torch.int64), torch.zeros(k, d), rows_dtype, torch.zeros(()), 0.5, 0.25)
        Q.straight_through_grad(torch.empty(2, d, dtype=rows_dtype), torch.empty(2, d, dtype=rows_dtype),
                                torch.empty(2, d), torch.ones(()), torch.ones(()), 0.25)
    for normalize, rows_dtype in ((False, torch.float32), (True, torch.bfloat16)):
        c = torch.randn(k, d)
        O.ema_update(torch.zeros(1, k, d), torch.zeros(1, k), torch.ones(k), c.clone(), c, decay=0.99, eps=1e-5,
                     offset=torch.zeros(d), normalize=normalize, used=c.clone(), part_inertia=torch.zeros(9),
                     sq_total=torch.zeros(()), revive_threshold=1.0, revive_from=torch.zeros(2, d, dtype=rows_dtype),
                     revive_rows=torch.zeros(k, dtype=torch.int64))


if __name__ == "__main__":
    main()
