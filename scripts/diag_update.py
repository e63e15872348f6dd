"""Device time of one assignment pass with and without its fused sums (CUDA graph replays, events).

Shows what the scatter-add of the sums costs at each shape: the one-hot pre-reduction for few
clusters, per-row atomics for many.

    python scripts/diag_update.py [--shapes 245760x32x32 3932160x32x32 245760x32x1024] [--precisions exact fast]
"""

from __future__ import annotations

import argparse

import torch
from torchkm._kernels.assign import AssignPass

from torchkm._ops import eager_launches


@eager_launches
def pass_ms(x: torch.Tensor, c: torch.Tensor, precision: str, update: bool, reps: int = 50) -> float:
    n, k = x.shape[0], c.shape[0]
    p = AssignPass(x, k, precision, update=update)
    labels = torch.zeros(n, dtype=torch.int32, device=x.device)
    norms = torch.linalg.vector_norm(x, dim=1)

    def once() -> None:
        p(x, c, offset=None, row_scale=None, raw_norms=norms, sample_weight=None, prev_labels=labels, labels=labels)

    once()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        once()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["245760x32x32", "3932160x32x32", "245760x32x1024", "1000000x128x4096"])
    parser.add_argument("--precisions", nargs="+", default=["exact", "fast"])
    args = parser.parse_args()
    for shape in args.shapes:
        n, d, k = (int(v) for v in shape.split("x"))
        x = torch.rand(n, d, device="cuda") - 0.5
        c = x[torch.randperm(n, device="cuda")[:k]].clone()
        for precision in args.precisions:
            plain = pass_ms(x, c, precision, False)
            fused = pass_ms(x, c, precision, True)
            bytes_floor = n * d * 4 / 3.0e12 * 1e3
            print(f"{shape:>18} {precision:>5}: assign {plain:7.3f} ms, with sums {fused:7.3f} ms "
                  f"(+{fused - plain:6.3f}); reading x once at 3 TB/s {bytes_floor:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
