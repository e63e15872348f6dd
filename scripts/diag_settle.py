"""The bounds engine's settle pass alone, per tile config (``TORCHKM_SETTLE_CONFIG``), and the
search over its list: GPU time of each (CUDA-graph replays) on seed 000's data, from bounds a few
settle passes into a fit (the state of a late pass).

    python scripts/diag_settle.py [--n 245760] [--k 1024] [--configs 256,4 128,4 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import graph_ms
from bench_prune import seed000_data
from torchkm._kernels.prune import BoundsEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--sigma2", type=float, default=0.0125)
    parser.add_argument("--passes", type=int, default=12, help="settle passes before timing")
    parser.add_argument("--configs", nargs="*", default=["256,4", "128,4", "128,2", "64,2", "512,8", "256,8", "512,4"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    x = seed000_data(args.n, args.d, args.k, args.sigma2, 4321)
    g = torch.Generator(device="cuda").manual_seed(4322)
    c0 = x[torch.randperm(args.n, device="cuda", generator=g)[:args.k]].clone()
    out = {}
    for spec in [None, *args.configs]:
        if spec:
            os.environ["TORCHKM_SETTLE_CONFIG"] = spec
        labels = torch.empty(args.n, dtype=torch.int32, device="cuda")
        e = BoundsEngine(x, c0, labels, offset=None, row_scale=None, raw_norms=None, sample_weight=None,
                         normalize=False, tol=0.0, graphs=False)
        e.iterate(has_prev=False)
        e.read(1)
        for _ in range(args.passes):
            e.iterate(has_prev=True)
        listed = int(e.active_count)
        # Each timed call starts a block (control and the previous pass's statistics reset), so
        # that no pass is frozen by a stopping rule; that copy is timed alone and taken off.
        def fresh(run, e=e):
            e._block_state.copy_(e._go)
            run()

        reset_ms = graph_ms(lambda e=e: e._block_state.copy_(e._go), calls=20)
        settle_ms = graph_ms(lambda: fresh(e._settle), calls=20) - reset_ms
        pass_ms = graph_ms(lambda: fresh(e._settle_pass), calls=20) - reset_ms
        name = spec or f"default {e.settle_cfg['BLOCK_N']},{e.settle_cfg['num_warps']}"
        out[name] = {"settle_ms": settle_ms, "pass_ms": pass_ms, "reset_ms": reset_ms, "listed": listed}
        print(f"{name:>14}: settle {settle_ms * 1e3:6.1f} us, whole pass {pass_ms * 1e3:6.1f} us, "
              f"{listed} rows listed ({listed / args.n:.1%})", flush=True)
        os.environ.pop("TORCHKM_SETTLE_CONFIG", None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "d": args.d, "k": args.k, "sigma2": args.sigma2, "passes": args.passes,
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "configs": out}, f, indent=1)


if __name__ == "__main__":
    main()
