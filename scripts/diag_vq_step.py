"""A/B of the VQ layer's input gradient: the fused Triton kernel (``torchkm._kernels.quantize``)
against the torch expression it replaces, in the eager training step at 32,768 x 256, 8192 codes
(fp32 and bf16, exact and fast), alternating within one process. Prints host and wall ms per step
(``bench_vq.host_and_wall_ms``) and do_bench's median per round.

    python scripts/diag_vq_backward.py [--rounds 3]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import torch  # noqa: E402
from bench_lloyd import ms  # noqa: E402
from bench_vq import host_and_wall_ms, make_layer, step_fn  # noqa: E402

from torchkm import _ops, _reference  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kernel = _ops.straight_through_grad
    for dtype in (torch.float32, torch.bfloat16):
        for precision in ("exact", "fast"):
            layer = make_layer(f"torchkm-{precision}", torch.randn(8192, 256, device="cuda"))
            x = torch.randn(32768, 256, device="cuda", dtype=dtype).requires_grad_(True)
            step = step_fn(layer, x, dtype)
            res: dict[str, list] = {"kernel": [], "torch": []}
            try:
                for _ in range(args.rounds):
                    for name, fn in (("kernel", kernel), ("torch", _reference.straight_through_grad)):
                        _ops.straight_through_grad = fn  # (nn.py looks it up on the module at each call)
                        host, wall = host_and_wall_ms(step, 50)
                        res[name].append((host, wall, ms(step)))
            finally:
                _ops.straight_through_grad = kernel
            for name, v in res.items():
                print(f"{dtype} {precision} backward {name}: host {statistics.mean(h for h, _, _ in v):.3f} wall "
                      f"{statistics.mean(w for _, w, _ in v):.3f} do_bench {[round(b, 3) for _, _, b in v]}", flush=True)


if __name__ == "__main__":
    main()
