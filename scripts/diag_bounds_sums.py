"""The bounds engine's (``algorithm="pruned"``, d > 8) sums, counts and centroids after each pass,
against float64 sums and means of that pass's labels: how far off they are, in which cluster, and
(``err*count/|x|max``) about how many rows' worth; then, on a GPU, the time of the float64 sums
that the engine takes once per fit after its first pass (``BoundsEngine._exact_sums``, a kernel)
against its torch reference (``update.float64_sums_reference``), each in a CUDA graph as the engine
replays it (``bench_lloyd.graph_ms``; until 2026-12-03 eager calls, which timed the host at 245,760
rows: 0.2 ms against 0.06), and their difference.

Rows N(0, 1), centred on their mean as a fit centres them; the start is ``k`` distinct rows.
Runs on a GPU (CUDA graphs, as a fit replays the passes) or on the CPU under ``TRITON_INTERPRET=1``.

    python scripts/diag_bounds_sums.py N D K PASSES [float32|bfloat16|float16] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, graph_ms  # noqa: E402


def main() -> None:
    from torchkm import _loop, _ops

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("d", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("passes", type=int)
    parser.add_argument("dtype", nargs="?", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n, d, k = args.n, args.d, args.k
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(args.seed)
    x = torch.randn(n, d, device=dev, generator=g).to(getattr(torch, args.dtype))
    data, offset = centred_view(x)
    c = x[torch.randperm(n, device=dev, generator=g)[:k]].float()
    labels = torch.full((n,), -7, dtype=torch.int32, device=dev)
    engine = _ops.pruned_engine(data, c - offset, labels, None, -1.0, "pruned", graphs=dev == "cuda",
                                block=_loop._GRAPH_BLOCK)
    rows64 = x.double() - offset.double()
    x_max = float(rows64.abs().max())
    for t in range(args.passes):
        engine.iterate(has_prev=t > 0)
        (_, _, _, empty), = engine.read(1)
        pass_labels = engine.labels.long()
        counts = torch.bincount(pass_labels, minlength=k).double()
        sums = torch.zeros(k, d, dtype=torch.float64, device=dev).index_add_(0, pass_labels, rows64)
        means = sums / counts[:, None]
        counts_off = (engine.counts.double() - counts).abs()
        sums_off = (engine.sums.double() - sums).abs().max(1).values
        centroids_off = (engine.c.double() - means).abs()
        j, s = int(centroids_off.max(1).values.argmax()), int(sums_off.argmax())
        print(f"pass {t} {type(engine).__name__}: counts off {float(counts_off.max()):.3g}; sums off "
              f"{float(sums_off[s]):.4g} at cluster {s} ({int(counts[s])} rows, |x| max {x_max:.3g}); centroids "
              f"off {float(centroids_off.max() / means.abs().max()):.3g} relative at cluster {j} ({int(counts[j])} "
              f"rows, err*count/|x|max {float(centroids_off[j].max() * counts[j] / x_max):.3g}); skipped "
              f"{engine.info.skipped:.3f}", flush=True)
        if empty:
            break
    if dev == "cuda" and hasattr(engine, "_exact_sums"):
        from torchkm._kernels import update

        sums64 = torch.empty(k, d, dtype=torch.float64, device=dev)
        counts64 = torch.empty(k, dtype=torch.float64, device=dev)
        inp = engine.inputs
        kw = {"sample_weight": inp["sample_weight"], "offset": inp["offset"], "row_scale": inp["row_scale"]}
        results = {}

        def one_copy():
            os.environ["TORCHKM_F64_REPLICAS"] = "1"
            try:
                update.float64_sums(engine.x, engine.labels, k, out=(sums64, counts64), **kw)
            finally:
                del os.environ["TORCHKM_F64_REPLICAS"]

        from torchkm._kernels.configs import float64_replicas

        for name, run in ((f"engine (float64_sums, {float64_replicas(k, d)} copies)",
                           lambda: engine._exact_sums(sums64, counts64)),
                          ("float64_sums, 1 copy", one_copy),
                          ("torch reference", lambda: update.float64_sums_reference(
                              engine.x, engine.labels, k, out=(sums64, counts64), **kw))):
            # In a CUDA graph, as the engine replays it (eager calls would time the host).
            took = graph_ms(run)
            results[name] = (sums64.clone(), counts64.clone())
            print(f"float64 sums, once per fit, {name}: {took:.3f} ms", flush=True)
        (a, ca), _, (b, cb) = results.values()
        print(f"  kernel vs reference: sums {float((a - b).abs().max() / b.abs().max()):.3g} relative, "
              f"counts {float((ca - cb).abs().max()):.3g}")

if __name__ == "__main__":
    main()
