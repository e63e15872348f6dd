"""What ``algorithm="auto"`` costs a fit that stays dense: ``"lloyd"`` and ``"auto"`` fits of seed
000's data, paired round by round (the order rotates each round), so that drift of the GPU's clocks
between rounds cancels; plus the host cost of a pair of timing events (how the hybrid times passes).

Prints, per workload, the median fit time of each algorithm, the median of the per-round ratios
auto / lloyd, the time per iteration and how many passes ran pruned; ``--json`` writes every fit.

    python scripts/diag_auto_overhead.py [--n 245760] [--ks 32 1024] [--sigma2 0.0125 0.05 0.3] [--repeats 21]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, default_tol
from bench_prune import paired_ratio, seed000_data

from torchkm import _loop

ALGORITHMS = ("lloyd", "auto")


def event_costs(pairs: int = 2000) -> dict[str, float]:
    """Host microseconds per pair of ``Event.record`` calls: new events on the current stream,
    the same events again, and with the stream passed; and per ``elapsed_time``."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(pairs)]
    for first, last in events:
        first.record()
        last.record()
    created = time.perf_counter()
    torch.cuda.synchronize()
    synced = time.perf_counter()
    for first, last in events:
        first.elapsed_time(last)
    read = time.perf_counter()
    for first, last in events:
        first.record()
        last.record()
    again = time.perf_counter()
    stream = torch.cuda.current_stream()
    for first, last in events:
        first.record(stream)
        last.record(stream)
    given = time.perf_counter()
    torch.cuda.synchronize()
    scale = 1e6 / pairs
    return {"create_and_record_pair_us": (created - started) * scale, "elapsed_time_us": (read - synced) * scale,
            "record_pair_us": (again - read) * scale, "record_pair_stream_given_us": (given - again) * scale}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=245_760)
    parser.add_argument("--ks", type=int, nargs="+", default=[32, 1024])
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.0125, 0.05, 0.3])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    costs = event_costs()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "seed": seed,
                      "events": costs}), flush=True)
    rows = []
    for k in args.ks:
        for sigma2 in args.sigma2:
            x = seed000_data(args.n, 32, k, sigma2, seed + k)
            g = torch.Generator(device="cuda").manual_seed(seed)
            c0 = x[torch.randperm(args.n, device="cuda", generator=g)[:k]].clone()
            data, offset = centred_view(x)
            tol = default_tol(data)

            def fit(algorithm: str) -> tuple[_loop.KMeansResult, float]:
                torch.cuda.synchronize()
                started = time.perf_counter()
                out = _loop.lloyd(data, c0 - offset, sample_weight=None, max_iter=args.max_iter, tol=tol,
                                  algorithm=algorithm)
                torch.cuda.synchronize()
                return out, (time.perf_counter() - started) * 1e3

            for algorithm in ALGORITHMS:  # compiles; the hybrid says what it decided
                logging.getLogger("torchkm").setLevel(logging.INFO)
                fit(algorithm)
                logging.getLogger("torchkm").setLevel(logging.WARNING)
            runs: dict[str, list[tuple[float, int, int]]] = {a: [] for a in ALGORITHMS}
            for repeat in range(args.repeats):
                turn = repeat % len(ALGORITHMS)
                for algorithm in ALGORITHMS[turn:] + ALGORITHMS[:turn]:
                    out, ms = fit(algorithm)
                    runs[algorithm].append((ms, out.n_iter, sum(h.kernel == "pruned" for h in out.history)))
            ms = {a: [r[0] for r in runs[a]] for a in ALGORITHMS}
            row = {
                "n": args.n, "k": k, "sigma2": sigma2, "runs": runs,
                "median_ms": {a: statistics.median(ms[a]) for a in ALGORITHMS},
                "paired_ratio": paired_ratio(ms["auto"], ms["lloyd"]),
                "ms_per_iter": {a: statistics.median(r[0] / r[1] for r in runs[a]) for a in ALGORITHMS},
            }
            rows.append(row)
            print(f"{args.n} x 32, k = {k}, sigma^2 = {sigma2}: lloyd {row['median_ms']['lloyd']:.3f} ms, auto "
                  f"{row['median_ms']['auto']:.3f} ms; auto / lloyd paired {row['paired_ratio']:.3f}; per iteration "
                  f"{row['ms_per_iter']['lloyd']:.4f} / {row['ms_per_iter']['auto']:.4f} ms; iterations "
                  f"{min(r[1] for r in runs['auto'])}-{max(r[1] for r in runs['auto'])}; auto's pruned passes "
                  f"{min(r[2] for r in runs['auto'])}-{max(r[2] for r in runs['auto'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "events": costs, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
