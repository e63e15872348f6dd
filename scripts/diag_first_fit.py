"""How long a script's first k-means takes on a GPU. Triton compiles each kernel the first time a
process launches it and keeps the result on disk (``TRITON_CACHE_DIR``, by default
``~/.triton/cache``), so a user's very first script pays the compiles, and later scripts load
them. Each scenario runs in fresh processes: first with an empty cache directory ("cold"), then
twice more with the cache that run filled ("disk"). Each process reports the seconds of ``import
torchkm``, of its first call and of a second, identical call (synchronized); with
``--compile-log``, also each kernel's compiles (variants) and their seconds.

    python scripts/diag_first_fit.py [--scenarios fit-seed000 fit-1m ...] [--compile-log] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# Each scenario's set-up (data on the GPU, made before the clock starts) and its timed call.
SCENARIOS = {
    "fit-seed000": ("x = torch.rand(245_760, 32, device='cuda')",
                    "torchkm.fit(x, 1024, max_iter=20, random_state=0)"),
    "fit-seed000-pruned": ("x = torch.rand(245_760, 32, device='cuda')",
                           "torchkm.fit(x, 1024, max_iter=20, random_state=0, algorithm='pruned')"),
    "fit-1m": ("x = torch.randn(1_000_000, 128, device='cuda')",
               "torchkm.fit(x, 4096, max_iter=20, random_state=0)"),
    "fit-1m-bf16": ("x = torch.randn(1_000_000, 128, device='cuda', dtype=torch.bfloat16)",
                    "torchkm.fit(x, 4096, max_iter=20, random_state=0)"),
    "assign": ("x = torch.randn(100_000, 96, device='cuda'); c = torch.randn(500, 96, device='cuda')",
               "torchkm.assign(x, c)"),
    "vq-step": ("vq = None; z = torch.randn(64, 256, 128, device='cuda', requires_grad=True)",
                "vq = vq or torchkm.VectorQuantizer(1024, 128).cuda(); out = vq(z); (out.quantized.sum() + out.loss).backward()"),
}

CHILD = """
import time
t0 = time.perf_counter()
import torch
{compile_log}
import torchkm
torch.cuda.init()
t_import = time.perf_counter() - t0
{setup}
torch.cuda.synchronize()
times = []
for _ in range(2):
    t = time.perf_counter()
    {call}
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
print("RESULT", t_import, times[0], times[1])
"""

# With ``--compile-log``: each call of Triton's ``compile`` (a disk-cache hit included) timed, by
# kernel; the JIT looks ``triton.compiler.compile`` up when it first compiles a kernel.
COMPILE_LOG = """
import triton.compiler
_compile = triton.compiler.compile
def _timed_compile(src, *args, **kwargs):
    t = time.perf_counter()
    try:
        return _compile(src, *args, **kwargs)
    finally:
        fn = getattr(src, "fn", None)
        print("COMPILE", getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?"),
              time.perf_counter() - t, flush=True)
triton.compiler.compile = _timed_compile
"""


def run_child(name: str, cache: str, compile_log: bool = False) -> dict:
    setup, call = SCENARIOS[name]
    env = {**os.environ, "TRITON_CACHE_DIR": cache}
    code = CHILD.format(setup=setup, call=call, compile_log=COMPILE_LOG if compile_log else "")
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout)[-2000:], "process_s": wall}
    t_import, first, second = map(float, lines[-1].split()[1:])
    out = {"import_s": t_import, "first_s": first, "second_s": second, "process_s": wall}
    if compile_log:
        compiles: dict[str, list[float]] = {}
        for line in done.stdout.splitlines():
            if line.startswith("COMPILE "):
                _, kernel, seconds = line.split()
                compiles.setdefault(kernel, []).append(float(seconds))
        out["compiles"] = compiles
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--compile-log", action="store_true",
                        help="time each kernel's compile (or cache load) and print the slowest")
    args = parser.parse_args()
    import torch
    import triton

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(meta, flush=True)
    rows = []
    print(f"{'scenario':>20} {'cache':>6} | {'import s':>8} {'first s':>8} {'second s':>8} {'process s':>9}")
    for name in args.scenarios:
        with tempfile.TemporaryDirectory() as cache:
            for label in ("cold", "disk", "disk"):
                r = {"scenario": name, "cache": label, **run_child(name, cache, args.compile_log)}
                rows.append(r)
                if "error" in r:
                    print(f"{name:>20} {label:>6} | error: {r['error'][-300:]}")
                    continue
                print(f"{name:>20} {label:>6} | {r['import_s']:8.2f} {r['first_s']:8.2f} {r['second_s']:8.3f} "
                      f"{r['process_s']:9.2f}", flush=True)
                if "compiles" in r:
                    per_kernel = sorted(((sum(v), len(v), kernel) for kernel, v in r["compiles"].items()), reverse=True)
                    total = sum(t for t, _, _ in per_kernel)
                    print(f"{'':>20} {'':>6}   {sum(n for _, n, _ in per_kernel)} compiles of {len(per_kernel)} "
                          f"kernels, {total:.2f} s; slowest: " + ", ".join(
                              f"{kernel} {t:.2f} s ({n})" for t, n, kernel in per_kernel[:8]), flush=True)
                if args.json:  # (after every run: a time limit may stop the script)
                    with open(args.json, "w") as f:
                        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
