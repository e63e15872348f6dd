"""A/B of parts of the VQ layer's training step against the torch code they replace, at 32,768 x
256, 8192 codes (fp32 and bf16, exact and fast), alternating within one process. Prints host and
wall ms per step (``bench_vq.host_and_wall_ms``), do_bench's median per round, and the GPU time
per step from the profiler (the sum of its kernels and copies over 20 steps, steadier than wall
times on a shared device), with the number of kernels; ``--kernels N`` lists each side's N largest.

- ``--part backward``: the fused input gradient (``torchkm._kernels.quantize``) against the torch
  expression (``_reference.straight_through_grad``).
- ``--part update``: the EMA update in two launches after an assignment pass that keeps its sums
  (``_ops.assign_and_ema_update``) against the assignment with reduced sums and torch's EMA
  (``_online``); with the step replayed as a CUDA graph (the default) and, with ``--eager``,
  without (``TORCHKM_REPLAY_QUERIES=0``). Replays are dropped between the two sides.

    python scripts/diag_vq_step.py [--part backward|update] [--eager] [--rounds 3] [--kernels 0]
"""
import argparse
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import torch  # noqa: E402
from bench_lloyd import ms  # noqa: E402
from bench_vq import host_and_wall_ms, make_layer, step_fn  # noqa: E402

import torchkm  # noqa: E402
from torchkm import _ops, _reference  # noqa: E402


def sides(part: str) -> dict:
    """name -> the value of the ``_ops`` function the layer looks up at each call."""
    if part == "backward":
        return {"kernel": ("straight_through_grad", _ops.straight_through_grad),
                "torch": ("straight_through_grad", _reference.straight_through_grad)}
    return {"fused": ("ema_step_fuses", _ops.ema_step_fuses), "torch": ("ema_step_fuses", lambda x: False)}


def gpu_us_per_step(step, steps: int = 20) -> tuple[float, float, collections.Counter]:
    """(GPU us per step, kernels and copies per step, us per step by kernel name) from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_name: collections.Counter = collections.Counter()
    launches = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name[:70]] += event.device_time_total / steps
            launches += 1
    return sum(by_name.values()), launches / steps, by_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("backward", "update"), default="backward")
    parser.add_argument("--eager", action="store_true", help="no replayed steps (TORCHKM_REPLAY_QUERIES=0)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernels", type=int, default=0, help="list each side's N largest kernels")
    args = parser.parse_args()
    if args.eager:
        os.environ["TORCHKM_REPLAY_QUERIES"] = "0"
    variants = sides(args.part)
    originals = {attr: getattr(_ops, attr) for attr, _ in variants.values()}
    for dtype in (torch.float32, torch.bfloat16):
        for precision in ("exact", "fast"):
            layer = make_layer(f"torchkm-{precision}", torch.randn(8192, 256, device="cuda"))
            x = torch.randn(32768, 256, device="cuda", dtype=dtype).requires_grad_(True)
            step = step_fn(layer, x, dtype)
            res: dict[str, list] = {name: [] for name in variants}
            try:
                for _ in range(args.rounds):
                    for name, (attr, fn) in variants.items():
                        setattr(_ops, attr, fn)  # (nn.py looks it up on the module at each call)
                        torchkm.empty_cache()
                        host, wall = host_and_wall_ms(step, 50)
                        res[name].append((host, wall, ms(step)))
                gpu = {}
                for name, (attr, fn) in variants.items():
                    setattr(_ops, attr, fn)
                    torchkm.empty_cache()
                    gpu[name] = gpu_us_per_step(step)
            finally:
                for attr, fn in originals.items():
                    setattr(_ops, attr, fn)
            for name, v in res.items():
                total, launches, by_name = gpu[name]
                print(f"{dtype} {precision} {args.part} {name}{' eager' if args.eager else ''}: host "
                      f"{statistics.mean(h for h, _, _ in v):.3f} wall {statistics.mean(w for _, w, _ in v):.3f} "
                      f"do_bench {[round(b, 3) for _, _, b in v]} GPU {total / 1e3:.3f} ({launches:.0f} kernels)",
                      flush=True)
                for kernel, us in by_name.most_common(args.kernels):
                    print(f"    {us:7.1f} us  {kernel}")


if __name__ == "__main__":
    main()
