"""The box engine's pass (``algorithm="pruned"`` at d <= 3; kernels up to 8) against the dense Lloyd engine's, on the GPU.

For each shape: fresh N(0, 1) rows, centroids from random rows, five passes of each engine from the
same start, then the GPU time of one more pass of each (20 passes replayed in a CUDA graph), the
box engine's set-up time (curve order, sorted copy, tile boxes), its candidate lists (mean length,
tiles past the slots, tiles searched rather than settled) and its two launches alone (the
candidates launch with the tiles' settling, the pass over the work list it leaves). ``--configs`` times the box pass at several
``TORCHKM_BOX_CONFIG`` values (``BLOCK_N,programs per SM``), ``--candidate-configs`` the candidates
launch at several ``TORCHKM_BOX_CANDIDATES`` values (``tiles per program,warps``).

    python scripts/diag_boxes.py --json out/boxes.json [--only 100Mx2x32] [--configs 128,8 256,8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from bench_lloyd import centred_view, graph_ms  # noqa: E402
from torchkm._kernels.boxes import BoxEngine, box_pass, candidates  # noqa: E402
from torchkm._kernels.lloyd import LloydEngine  # noqa: E402

SHAPES = [("100Mx2x32", 100_000_000, 2, 32), ("10Mx3x100", 10_000_000, 3, 100), ("1Mx2x1000", 1_000_000, 2, 1000),
          ("245760x2x32", 245_760, 2, 32), ("1Mx8x32", 1_000_000, 8, 32)]


def warm(engine) -> None:
    """Five passes, then a block state that is not frozen (as ``_run_passes`` starts one)."""
    engine.iterate(False)
    engine.read(1)
    for _ in range(4):
        engine.run_block(1)
        engine.read(1)
    engine.control.copy_(engine._go_control)
    engine.stats_prev.copy_(engine._go)


def dense_pass_ms(x: torch.Tensor, c0: torch.Tensor) -> float:
    data, offset = centred_view(x)
    labels = torch.empty(x.shape[0], dtype=torch.int32, device=x.device)
    engine = LloydEngine(x, c0 - offset, labels, precision="exact", offset=offset, row_scale=None,
                         raw_norms=data.raw_norms, sample_weight=None, normalize=False, tol=-1.0)
    warm(engine)
    return graph_ms(engine._block_iteration)


def box_pass_stats(x: torch.Tensor, c0: torch.Tensor) -> dict[str, float]:
    _, offset = centred_view(x)
    labels = torch.empty(x.shape[0], dtype=torch.int32, device=x.device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    e = BoxEngine(x, c0 - offset, labels, offset=offset, row_scale=None, sample_weight=None, normalize=False, tol=-1.0)
    torch.cuda.synchronize()
    out = {"setup_ms": (time.perf_counter() - t0) * 1e3}
    warm(e)
    out["pass_ms"] = graph_ms(e._block_pass)
    out["mean_candidates"] = float(e.count.float().mean())
    out["tiles_past_slots_pct"] = 100 * float((e.count > e.cand.shape[1]).float().mean())
    out["tiles_searched_pct"] = 100 * float(e.work_count[0]) / e.count.numel()
    programs = e._programs
    settle = (e.tile_label, e.moments, e.acc, e.part_inertia[programs:])

    def candidates_only():
        e.work_count.zero_()
        candidates(e.lo, e.hi, e.c, e.cand, e.count, e.work, e.work_count, settle=settle)

    out["candidates_ms"] = graph_ms(candidates_only)
    out["box_pass_only_ms"] = graph_ms(lambda: box_pass(
        e.x_sorted, e.c, e.cand, e.count, e.work, e.work_count, e.sorted_labels, e.acc, e.part_inertia[:programs],
        e.part_changed[:programs], e.tallies, block_n=e.block_n))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--configs", nargs="*", default=[], help="TORCHKM_BOX_CONFIG values to time as well")
    parser.add_argument("--candidate-configs", nargs="*", default=[],
                        help="TORCHKM_BOX_CANDIDATES values (tiles per program,warps) to time as well")
    args = parser.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    for name, n, d, k in SHAPES:
        if args.only and name not in args.only:
            continue
        g = torch.Generator(device="cuda").manual_seed(int(time.time()))
        x = torch.randn(n, d, device="cuda", generator=g)
        c0 = x[torch.randint(0, n, (k,), device="cuda", generator=g)].clone()
        res = {"dense_pass_ms": dense_pass_ms(x, c0), "default": box_pass_stats(x, c0)}
        for variable, values in (("TORCHKM_BOX_CONFIG", args.configs), ("TORCHKM_BOX_CANDIDATES", args.candidate_configs)):
            for cfg in values:
                os.environ[variable] = cfg
                try:
                    res[f"{variable}={cfg}"] = box_pass_stats(x, c0)
                finally:
                    del os.environ[variable]
        for key, value in res.items():
            print(name, key, value if isinstance(value, float) else {a: round(b, 4) for a, b in value.items()}, flush=True)
        results[name] = res
        del x, c0
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
