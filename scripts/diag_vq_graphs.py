"""The compiled VQ layer step with and without CUDA graphs, the Hopper search on and off: time per
step, host time per step, and Inductor's counters (CUDA graph skips and re-recordings), so that a
step that is not replayed as a graph shows why.

    TORCH_LOGS=perf_hints python scripts/diag_vq_graphs.py [--precisions fast exact] [--dtypes float32 bfloat16]
        [--searches hopper tl.dot] [--profile-host]

``--profile-host``: also where each step's host time goes (cProfile of 30 steps, by own and by
cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import ms  # noqa: E402
from bench_vq import host_and_wall_ms, make_layer, step_fn  # noqa: E402


def explain_mutations() -> None:
    """Print the graph inputs that cudagraph trees count as mutated when they decide whether to record
    (a mutated input that is not static makes them skip the graph)."""
    import torch._inductor.cudagraph_trees as trees

    original_trees = trees.check_for_mutation

    def explained_trees(func, inputs, is_recorded):
        for idx in func.mutated_input_idxs:
            t = inputs[idx]
            print(f"  mutated input {idx} static={idx in func.static_input_idxs} recorded={is_recorded(t)} "
                  f"{getattr(t, 'shape', None)} {getattr(t, 'dtype', None)}", flush=True)
        return original_trees(func, inputs, is_recorded)

    trees.check_for_mutation = explained_trees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=32_768)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--codes", type=int, default=8192)
    parser.add_argument("--precisions", nargs="*", default=["fast", "exact"])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--modes", nargs="*", default=["default", "reduce-overhead"])
    parser.add_argument("--searches", nargs="*", default=["hopper", "tl.dot"])
    parser.add_argument("--why", action="store_true", help="print the inputs counted as mutated")
    parser.add_argument("--profile-host", action="store_true", help="cProfile the steps' host time")
    args = parser.parse_args()
    if args.why:
        explain_mutations()
    print(f"{'precision':<10}{'dtype':<10}{'search':<8}{'mode':<17}{'ms/step':>9}{'host ms':>9}  counters")
    for precision in args.precisions:
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            x = torch.randn(args.n, args.dim, device="cuda", dtype=dtype).requires_grad_(True)
            codebook = torch.randn(args.codes, args.dim, device="cuda")
            for search in args.searches:
                os.environ["TORCHKM_HOPPER_SEARCH"] = "1" if search == "hopper" else "0"
                os.environ["TORCHKM_HOPPER_TRACED"] = "1" if search == "hopper" else "0"
                # Inductor's caches do not key on the switches: each variant compiles into its own.
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="diag_vq_graphs_")
                for mode in args.modes:
                    torch._dynamo.reset()
                    counters.clear()
                    layer = torch.compile(make_layer(f"torchkm-{precision}", codebook), fullgraph=True,
                                          mode=None if mode == "default" else mode)
                    step = step_fn(layer, x, dtype)
                    t = ms(step)
                    host, _ = host_and_wall_ms(step, 20)
                    inductor = {key: value for key, value in counters["inductor"].items() if "cudagraph" in key}
                    print(f"{precision:<10}{dtype_name:<10}{search:<8}{mode:<17}{t:>9.3f}{host:>9.3f}  {inductor}",
                          flush=True)
                    if args.profile_host:
                        host_profile = cProfile.Profile()
                        host_profile.enable()
                        for _ in range(30):
                            step()
                        host_profile.disable()
                        torch.cuda.synchronize()
                        stats = pstats.Stats(host_profile)
                        stats.sort_stats("tottime").print_stats(18)
                        stats.sort_stats("cumulative").print_stats(30)
    for name in ("TORCHKM_HOPPER_SEARCH", "TORCHKM_HOPPER_TRACED", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ.pop(name)


if __name__ == "__main__":
    main()
