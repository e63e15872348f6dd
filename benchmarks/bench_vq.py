"""Forward + backward of a vector-quantization layer in training mode on the GPU: torchkm.nn.VectorQuantizer
vs vector-quantize-pytorch, a plain torch layer, and the FLOP floor.

One step = forward of a (32,768, 256) batch through the layer in training mode (assignment, EMA codebook
update), then backward to the input from a fixed gradient for ``quantized`` and 1 for ``loss``
(``--upstream loss``: from ``quantized.square().mean() + loss``, as entries before 2026-11-22's
"replayed training steps" did). Inputs are fp32, or bf16 as
they arrive from an encoder under ``torch.autocast(dtype=bfloat16)`` (the step runs under autocast).

Correctness first, on fresh random data each run: the layer's indices on a poisoned-free fresh module are
checked against a float64 argmin over the codebook it used (exact mode: equal except near-ties; fast mode:
the fraction that differs is printed), and its EMA statistics against torch's one-hot sums; only then is
anything timed: wall time per step (CUDA events via triton.testing.do_bench, median; the host's
time where it is the longer), and GPU time per step with the host ahead (``gpu_ms``: steps queued
behind a device-side sleep, as inside a model whose GPU work keeps the host ahead).

A library name ending in ``-compiled`` (``torchkm-fast-compiled``) times ``torch.compile(layer,
fullgraph=True)`` of that layer (Inductor, no CUDA graphs), ``-cudagraphs`` the same with
``mode="reduce-overhead"``; their checks run the eager layer.

Peers: vector-quantize-pytorch ``VectorQuantize(dim, codebook_size)`` with its defaults (decay 0.8, rotation
trick gradients, as users run it; carry its wheel and those of einops, einx, frozendict, loguru and
torch-einops-utils), and ``torch-dense``: a straightforward torch layer (one n x k matmul, argmin,
embedding, one-hot EMA update). Floor: 2 n k d FLOPs at the measured tf32 (fp32 input) or bf16 GEMM rate.

    python benchmarks/bench_vq.py --json out/bench_vq.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import time
import traceback

import torch
import triton
from bench_lloyd import (  # benchmarks/ is the script's directory, so on sys.path
    ceilings,
    ms,
)

import torchkm

WORKLOADS = [(32_768, 256, 8192), (32_768, 256, 65_536)]  # (n, dim, codes): issue 5


class TorchDenseVQ(torch.nn.Module):
    """The layer a user writes in plain torch: full distance matrix, argmin, EMA by one-hot sums."""

    def __init__(self, codebook: torch.Tensor, decay: float = 0.99, eps: float = 1e-5) -> None:
        super().__init__()
        self.register_buffer("codebook", codebook.clone())
        self.register_buffer("embed_sum", codebook.clone())
        self.register_buffer("cluster_size", torch.ones(codebook.shape[0], device=codebook.device))
        self.decay, self.eps = decay, eps

    def forward(self, x: torch.Tensor):
        flat = x.reshape(-1, x.shape[-1]).float()
        with torch.no_grad():
            c = self.codebook
            idx = torch.addmm((c * c).sum(1), flat, c.T, alpha=-2.0).argmin(1)
            counts = torch.zeros_like(self.cluster_size).index_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
            sums = torch.zeros_like(self.embed_sum).index_add_(0, idx, flat)
            self.cluster_size.lerp_(counts, 1 - self.decay)
            self.embed_sum.lerp_(sums, 1 - self.decay)
            total = self.cluster_size.sum()
            size = (self.cluster_size + self.eps) / (total + c.shape[0] * self.eps) * total
            self.codebook.copy_(self.embed_sum / size[:, None])
        codes = c[idx]
        loss = 0.25 * torch.nn.functional.mse_loss(flat, codes)
        quantized = flat + (codes - flat).detach()
        return quantized.view_as(x).to(x.dtype), idx.view(x.shape[:-1]), loss


def make_layer(library: str, codebook: torch.Tensor):
    k, dim = codebook.shape
    if library.startswith("torchkm"):
        precision = library.split("-")[1]
        layer = torchkm.nn.VectorQuantizer(k, dim, kmeans_init=False, precision=precision)
        with torch.no_grad():
            layer.codebook.copy_(codebook)
            layer.embed_sum.copy_(codebook)
        return layer.cuda()
    if library == "torch-dense":
        return TorchDenseVQ(codebook)
    from vector_quantize_pytorch import VectorQuantize

    layer = VectorQuantize(dim=dim, codebook_size=k).cuda()
    with torch.no_grad():
        layer._codebook.embed.copy_(codebook[None])
        layer._codebook.embed_avg.copy_(codebook[None])
    return layer


def step_fn(layer, x: torch.Tensor, dtype: torch.dtype, upstream: str = "grad"):
    """One training step of ``layer`` on ``x``: forward, then backward to ``x``.

    ``upstream="grad"``: the layer's own forward and backward, given a fixed gradient for its output
    and 1 for its loss (what the layer costs inside a model, whatever the model's loss).
    ``"loss"``: the backward of ``quantized.float().square().mean() + loss``, a stand-in model
    loss whose own elementwise passes (about 0.07 GPU ms and some twenty launches at 32,768 x 256)
    are timed too; entries before 2026-11-22's "replayed training steps" used it.
    """
    grad = torch.randn(x.shape, device=x.device, dtype=x.dtype) if upstream == "grad" else None

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            quantized, _, loss = layer(x)
            if grad is None:
                (quantized.float().square().mean() + loss).backward()
            else:
                torch.autograd.backward((quantized, loss), (grad.to(quantized.dtype), torch.ones_like(loss)))
        x.grad = None
    return step


def check(library: str, x: torch.Tensor, codebook: torch.Tensor, dtype: torch.dtype) -> dict:
    """Indices of one training step against a float64 argmin over the codebook it started from, and the
    EMA size update against a one-hot count of those indices."""
    layer = make_layer(library, codebook)
    before = codebook.clone()
    size_before = torch.ones(codebook.shape[0], device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        _, idx, _ = layer(x)
    idx = idx.reshape(-1)
    sample = torch.randperm(x.shape[0], device="cuda")[:4096]
    rows = x.detach().reshape(-1, x.shape[-1])[sample].double()
    d = torch.cdist(rows, before.double()).square()
    best = d.min(1)
    chosen = d.gather(1, idx[sample, None]).squeeze(1)
    gap = chosen - best.values
    # fp32 rounding of ||x||^2 - 2 x.c + ||c||^2 bounds what counts as a near-tie.
    tie = 1e-5 * (rows.square().sum(1) + before.double().square().sum(1).max())
    out = {"differs": float((idx[sample] != best.indices).float().mean()),
           "beyond_ties": float((gap > tie).float().mean())}
    if library.startswith("torchkm"):
        counts = torch.bincount(idx, minlength=codebook.shape[0]).float()
        want = size_before.lerp(counts, 1 - layer.decay)
        out["ema_size_err"] = float((layer.cluster_size - want).abs().max())
    return out


def gpu_ms(fn, steps: int = 20, reps: int = 5) -> float:
    """GPU ms per call of ``fn`` with the host ahead: ``steps`` calls queued behind a device-side
    sleep long enough that the host has issued them all before the GPU reaches the first (checked;
    the sleep doubles until it is), timed by CUDA events, median of ``reps``. Where a step's host
    time exceeds its GPU time, this is what the step costs inside a model whose own GPU work keeps
    the host ahead, and the wall time (``ms``) what it costs alone. NaN for a ``fn`` that waits for
    the GPU (then the host is never ahead)."""
    fn()
    torch.cuda.synchronize()
    cycles, times = 1 << 21, []
    while len(times) < reps:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        ahead = not start.query()  # the GPU was still asleep when the last call was issued
        torch.cuda.synchronize()
        if ahead:
            times.append(start.elapsed_time(end) / steps)
        elif cycles >= 1 << 32:  # seconds of sleep: fn synchronises
            return float("nan")
        else:
            cycles *= 2
    return sorted(times)[len(times) // 2]


def host_and_wall_ms(fn, steps: int, warmup: int = 3) -> tuple[float, float]:
    """ms per call of ``fn`` on the host (until the launches are issued) and in all (until the GPU is done)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    host = (time.perf_counter() - t0) / steps * 1e3
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / steps * 1e3


def profile(n: int, dim: int, k: int, precision: str, dtype: torch.dtype, steps: int = 20,
            compiled: bool = False) -> None:
    """Host and GPU time per step of the torchkm layer, and the profiler's top entries for both.
    ``compiled``: of ``torch.compile(layer, fullgraph=True)`` (no CUDA graphs, so that the profiler
    lists its kernels), the GPU side only."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    x = torch.randn(n, dim, device="cuda", dtype=dtype).requires_grad_(True)
    layer = make_layer(f"torchkm-{precision}", torch.randn(k, dim, device="cuda"))
    if compiled:
        torch._dynamo.reset()
        layer = torch.compile(layer, fullgraph=True)
    step = step_fn(layer, x, dtype)
    host, wall = host_and_wall_ms(step, steps)
    print(f"\nprofile {n:,} x {dim}, {k:,} {precision} {dtype}{' compiled' if compiled else ''}: host {host:.3f} "
          f"ms/step (launch side), wall {wall:.3f} ms/step")
    if compiled:
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=16, max_name_column_width=70))
        return
    # Where the host's time goes, by Python function (cProfile's own overhead inflates small calls).
    host_profile = cProfile.Profile()
    host_profile.enable()
    for _ in range(steps):
        step()
    host_profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(host_profile).sort_stats("tottime").print_stats(22)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
    print(table.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--libraries", nargs="*", default=["torchkm-exact", "torchkm-fast", "torch-dense", "vector-quantize-pytorch"])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--codes", type=int, nargs="*", default=[k for _, _, k in WORKLOADS],
                        help="codebook sizes to run (of 8192 and 65536)")
    parser.add_argument("--upstream", choices=["grad", "loss"], default="grad",
                        help="what the backward starts from: a fixed gradient for the output (the layer alone), or a "
                             "stand-in model loss (see step_fn)")
    parser.add_argument("--profile", action="store_true", help="profile the torchkm layer instead of the comparison")
    parser.add_argument("--profile-compiled", action="store_true",
                        help="profile the compiled torchkm layer's kernels at 32,768 x 256, 8192 codes")
    args = parser.parse_args()
    if args.profile:
        for n, dim, k, precision in [(2048, 32, 256, "exact"), (32_768, 256, 8192, "fast"), (32_768, 256, 8192, "exact")]:
            profile(n, dim, k, precision, torch.float32)
        return
    if args.profile_compiled:
        for precision in ("fast", "exact"):
            for dtype_name in args.dtypes:
                profile(32_768, 256, 8192, precision, getattr(torch, dtype_name), compiled=True)
        return

    rates = ceilings()
    try:
        import vector_quantize_pytorch
        vqp_version = getattr(vector_quantize_pytorch, "__version__", None)
        if vqp_version is None:
            from importlib.metadata import version
            vqp_version = version("vector-quantize-pytorch")
    except ImportError:
        vqp_version = None
        args.libraries = [lib for lib in args.libraries if lib != "vector-quantize-pytorch"]
    meta = {
        "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "vector_quantize_pytorch": vqp_version, "upstream": args.upstream, "python": platform.python_version(), **rates,
    }
    print(json.dumps(meta))
    rows = []
    print(f"{'n x dim, codes':<22}{'dtype':<10}{'library':<26}{'ms/step':>9}{'x floor':>9}{'GPU ms':>9}{'x floor':>9}"
          f"{'vqp/this':>9}  check")
    for n, dim, k in WORKLOADS:
        if k not in args.codes:
            continue
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            rate = rates["bf16_TFLOPs" if dtype == torch.bfloat16 else "tf32_TFLOPs"]
            floor = 2 * n * k * dim / (rate * 1e12) * 1e3
            x = torch.randn(n, dim, device="cuda", dtype=dtype).requires_grad_(True)
            codebook = torch.randn(k, dim, device="cuda")
            group = []
            for library in args.libraries:
                base = library.removesuffix("-compiled").removesuffix("-cudagraphs")
                checked = check(base, x, codebook, dtype)
                layer = make_layer(base, codebook)
                if library != base:
                    # What a user gets from torch.compile(layer): Inductor fuses the elementwise work
                    # around the kernels and launches them without the op's Python; "-cudagraphs"
                    # also replays the step's launches as CUDA graphs (mode="reduce-overhead").
                    mode = "reduce-overhead" if library.endswith("-cudagraphs") else None
                    torch._dynamo.reset()  # each variant compiles afresh (no recompile limit across them)
                    layer = torch.compile(layer, fullgraph=True, mode=mode)
                try:
                    step = step_fn(layer, x, dtype, args.upstream)
                    t = ms(step)
                    t_gpu = gpu_ms(step)
                except torch.OutOfMemoryError:
                    t = t_gpu = float("nan")
                except Exception as error:  # a compiled variant that does not run is reported, not fatal
                    if library == base:
                        raise
                    print(f"{library} {dtype_name}: {type(error).__name__}: {str(error)[:300]}")
                    traceback.print_exc()
                    t = t_gpu = float("nan")
                del layer
                torchkm.empty_cache()
                torch.cuda.empty_cache()
                group.append({"n": n, "dim": dim, "codes": k, "dtype": dtype_name, "library": library, "ms": t,
                              "gpu_ms": t_gpu, "floor_ms": floor, "check": checked})
            peer = next((r["ms"] for r in group if r["library"] == "vector-quantize-pytorch"), float("nan"))
            for r in group:
                r["speedup_vs_vqp"] = peer / r["ms"]
                print(f"{f'{n:,} x {dim}, {k:,}':<22}{dtype_name:<10}{r['library']:<26}{r['ms']:>9.3f}"
                      f"{r['ms'] / floor:>9.2f}{r['gpu_ms']:>9.3f}{r['gpu_ms'] / floor:>9.2f}{r['speedup_vs_vqp']:>9.2f}  "
                      + ", ".join(f"{key} {value:.2e}" for key, value in r["check"].items()))
            rows += group
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
