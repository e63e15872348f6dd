"""CPU simulation: fp32 atomic sums of bf16 rows centred on an fp32 offset, against float64, for
several offsets. Not a kernel run: it models what the fused passes' per-row atomics do (each row's
centred features added into one of ``R`` copies of the sums, ``atomic_replicas``; here row i goes
to copy i mod R, each copy a sequential fp32 chain).

Why: on an H200 (BENCHMARKS.md, 2026-12-03, third session), the dense passes' sums over bf16 rows
were 1.6e-6 (245,760 x 32 x 96) and 2.9e-5 (3.9M x 32 x 128) off float64 relative to the largest
sum, growing with n, against 6e-8 and 1.5e-7 over fp32 rows. Rows of equal bf16 value centred on
the same offset carry the same low bits, so a chain rounds them the same way again and again
instead of at random. An offset on a coarse grid (``x - offset`` then has few significant bits)
should leave the chains nearly exact; this prints how much, for one large cluster (rows whose
first feature exceeds ``--cut``).

2026-12-03, this machine's CPU, torch 2.13.0+cpu, 64 copies, largest error over features 1..31
(their sums up to 462 / 1,830): 245,760 rows (a cluster of 45,260), fp32 mean 7.9e-4, mean on a
2^-8 grid 9.3e-6, no offset 9.3e-6; 3,932,160 rows (723,360), 1.36e-2, 6.8e-5, 6.8e-5. The error
is the addends' (``x - offset`` rounded the same way for equal rows), not the chains'.

    python scripts/sim_offset_sums.py [--n 3932160] [--d 32] [--copies 64] [--cut 0.9]
"""

from __future__ import annotations

import argparse

import torch


def chained(v: torch.Tensor, copies: int) -> torch.Tensor:
    """Row i added to copy i mod ``copies``, each copy a sequential fp32 chain; copies summed in float64."""
    m = v.shape[0] // copies * copies
    chains = v[:m].view(-1, copies, v.shape[1]).cumsum(0)[-1]  # cumsum: sequential, in fp32
    return chains.double().sum(0) + v[m:].double().sum(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3_932_160)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--copies", type=int, default=64)
    parser.add_argument("--cut", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    x = torch.randn(args.n, args.d).to(torch.bfloat16)
    mean = x.double().mean(0)
    rows = x[x[:, 0].float() > args.cut]
    print(f"{args.n} x {args.d} bf16 rows, one cluster of {rows.shape[0]} rows, {args.copies} copies")
    for name, offset in [("fp32 mean", mean.float()), ("mean rounded to bf16", mean.to(torch.bfloat16).float()),
                         ("mean on a 2^-8 grid", (mean * 256).round().float() / 256),
                         ("mean on a 2^-12 grid", (mean * 4096).round().float() / 4096),
                         ("no offset", torch.zeros(args.d))]:
        centred = rows.float() - offset
        exact = rows.double() - offset.double()
        ref = exact.sum(0)
        addends = float((centred.double().sum(0) - ref).abs().max())
        total = float((chained(centred, args.copies) - ref).abs().max())
        other = float((chained(centred, args.copies) - ref)[1:].abs().max())
        print(f"{name:<22} x - offset exact: {bool(torch.equal(centred.double(), exact))!s:<5}  error of the "
              f"addends {addends:.2e}, of the chained sums {total:.2e} (features 1..: {other:.2e}; their sums "
              f"up to {float(ref[1:].abs().max()):.3g})")


if __name__ == "__main__":
    main()
