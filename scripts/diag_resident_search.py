"""The streamed Hopper search (16-bit rows of more than 256 features, row tile resident in shared
memory) against the tl.dot search, in one process, e.g. at 1M x 768, k = 8192.

For bf16 rows: the floor (the products' FLOPs at the bf16 GEMM rate measured in the same run),
cuBLAS ``x @ c.T``, the fused pass (``AssignPass``, replayed in a CUDA graph) fast and exact, with
and without sums, on the tl.dot search (``TORCHKM_HOPPER_STREAMED=0``) and on the streamed search;
then the streamed search alone at each ``--configs`` entry (``TORCHKM_HOPPER_STREAMED_CONFIG``),
its record checked first (NaN-poisoned, against a float64 argmin on sampled rows: labels beyond
near-ties, and the exact record's runner-up and bounds). Every pass's labels are checked against
float64 (``bench_lloyd.check``). Fresh random rows each run. Prints a table and writes JSON.

    python scripts/diag_resident_search.py [--n 1000000 --d 768 --k 8192] [--configs 64,64,0,2 ...]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))


def labels_off_pct(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, record: torch.Tensor) -> float:
    """Percent of 8192 sampled rows whose record label is not the float64 argmin beyond near-ties (a
    gap under 1e-3 of the row's score scale); 100 where a sampled slot was not written."""
    rows = torch.randint(0, x.shape[0], (8192,), device=x.device)
    scores = bias.double()[None, :] + x[rows].double() @ c_mma.double().T
    top = scores.topk(2, dim=1, largest=False).values
    got = record.view(torch.int32)[1, rows].long()
    if bool(((got < 0) | (got >= bias.shape[0])).any()) or bool(record[0, rows].isnan().any()):
        return 100.0
    near = (top[:, 1] - top[:, 0]) < 1e-3 * scores.abs().max(dim=1).values
    wrong = (scores.gather(1, got[:, None]).squeeze(1) > top[:, 0]) & ~near
    return 100.0 * float(wrong.double().mean())


def record_bounds_off_pct(x: torch.Tensor, c_mma: torch.Tensor, bias: torch.Tensor, record: torch.Tensor) -> float:
    """Percent of 4096 sampled rows whose exact record breaks its contract (``hopper_search.search``;
    float64 scores, a slack of 1e-4 of the row's score scale for the fp32 products): ``second`` at
    most the second-best score, ``label2`` another centroid whose score is at least it, ``third`` at
    most the third best, ``label3`` (if any) a centroid other than both, ``fourth`` at most the
    fourth best. (A runner-up that shares the best's slot has no index of its own: ``label2`` may
    then name a worse centroid, and the bounds say so.)"""
    rows = torch.randint(0, x.shape[0], (4096,), device=x.device)
    scores = bias.double()[None, :] + x[rows].double() @ c_mma.double().T
    top = scores.topk(4, dim=1, largest=False).values
    slack = 1e-4 * scores.abs().max(dim=1).values
    labels = record.view(torch.int32)[:, rows].long()
    if bool(((labels[3] < 0) | (labels[3] >= bias.shape[0])).any()) or bool(record[[2, 4, 6]][:, rows].isnan().any()):
        return 100.0
    bad = record[2, rows].double() > top[:, 1] + slack
    bad |= (labels[3] == labels[1]) | (scores.gather(1, labels[3][:, None]).squeeze(1) < top[:, 1] - slack)
    bad |= record[4, rows].double() > top[:, 2] + slack
    bad |= (labels[5] >= 0) & ((labels[5] == labels[1]) | (labels[5] == labels[3]))
    bad |= record[6, rows].double() > top[:, 3] + slack
    return 100.0 * float(bad.double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--configs", nargs="*", default=["64,64,0,1", "64,64,0,2", "64,32,0,2", "128,32,0,1"],
                        help="TORCHKM_HOPPER_STREAMED_CONFIG values BLOCK_K,BLOCK_D,STAGES,GROUP (STAGES 0: as "
                             "many as fit)")
    parser.add_argument("--ring-configs", nargs="*", default=["256,64,4", "256,64,3", "128,64,4"],
                        help="TORCHKM_HOPPER_RING_CONFIG values BLOCK_K,BLOCK_D,STAGES of the ring search (fast)")
    parser.add_argument("--ring-packed", nargs="*", default=["1"], choices=["1", "0"],
                        help="TORCHKM_HOPPER_RING_PACKED values for the ring search alone (keys or scores)")
    parser.add_argument("--ring-third", nargs="*", default=["1"], choices=["1", "0"],
                        help="TORCHKM_HOPPER_RING_THIRD values for the ring search alone (exact record)")
    parser.add_argument("--searches", nargs="*", default=["tl.dot", "streamed", "ring"],
                        choices=["tl.dot", "streamed", "ring"], help="the passes' searches to time")
    parser.add_argument("--odd", action="store_true",
                        help="first check the ring search's labels on odd shapes (n, d, k not multiples of its tiles)")
    parser.add_argument("--sums", nargs="*", default=["no", "with"], choices=["no", "with"],
                        help="time the passes without and / or with their sums")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from bench_lloyd import ceilings, check, graph_ms, labels_off
    from torchkm._kernels import hopper_search
    from torchkm._kernels.centroids import prepare_centroids

    from scripts.diag_exact_bound import env
    from scripts.diag_streamed import gemm_ms, pass_ms

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "n": args.n, "d": args.d, "k": args.k}
    print(meta, flush=True)
    rates = ceilings()
    floor = 2 * args.n * args.k * args.d / (rates["bf16_TFLOPs"] * 1e12) * 1e3
    rows = [{"variant": "floor (products at the measured bf16 rate)", "ms": floor, **rates}]
    seed = int(time.time())
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(args.n, args.d, device="cuda", generator=g).bfloat16()
    c = x[torch.randint(0, args.n, (args.k,), device="cuda", generator=g)].float()
    rows.append({"variant": "cuBLAS x @ c.T (bf16 out, row chunks)", "ms": gemm_ms(x, c)})

    def show(row):
        value = row.get("ms")
        print(f"{row['variant']:<58} {value if value is None else round(value, 3)!s:>8} ms"
              + (f"  x floor {value / floor:.2f}" if value else "")
              + "".join(f"  {key}={row[key]}" for key in ("labels_off_beyond_ties_pct", "record_bounds_off_pct",
                                                         "check", "error") if key in row), flush=True)

    show(rows[0])
    show(rows[1])
    if args.odd:
        for n, d, k in ((1000, 520, 1000), (777, 312, 300), (4099, 1000, 2000), (130, 264, 257), (20000, 768, 8192)):
            xo = torch.randn(n, d, device="cuda", generator=g).bfloat16()
            co = xo[torch.randint(0, n, (k,), device="cuda", generator=g)].float() + 0.01
            po = prepare_centroids(co.contiguous(), None, xo.dtype, fast=True, split=False, exact=False)
            record = torch.full((7, n + 5), float("nan"), device="cuda")
            record.view(torch.int32)[1] = -7
            row = {"variant": f"ring search labels at {n} x {d} x {k}"}
            try:
                with env(TORCHKM_HOPPER_STREAMED="ring"):
                    hopper_search.search(xo, po.c_mma, po.bias, record, check=False)
                torch.cuda.synchronize()
                row["labels_off_beyond_ties_pct"] = labels_off_pct(xo, po.c_mma, po.bias, record[:, :n])
                row["untouched_tail"] = bool(record[0, n:].isnan().all())
                scores = po.bias[None, :] + xo.float() @ po.c_mma.float().T
                got = record.view(torch.int32)[1, :n].long().clamp(0, k - 1)
                row["best_off_rel"] = float(((record[0, :n] - scores.gather(1, got[:, None]).squeeze(1)).abs()
                                             / scores.abs().amax(dim=1)).max())
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)[:500]
            rows.append(row)
            show(row)
    searches = {"tl.dot": "0", "streamed": "1", "ring": "ring"}
    for search, setting in ((name, searches[name]) for name in args.searches):
        with env(TORCHKM_HOPPER_STREAMED=setting, TORCHKM_HOPPER_RING_EXACT="1"):
            for precision in ("fast", "exact"):
                for update in [kind == "with" for kind in args.sums]:
                    row = {"variant": f"{precision} pass, {'with' if update else 'no'} sums, {search} search"}
                    try:
                        row["ms"] = pass_ms(x, c, precision, 5, update=update)
                        if update and precision == "exact":
                            row["check"] = check(x, c)
                        elif update:
                            from torchkm._kernels.assign import assign

                            sample = torch.randint(0, args.n, (8192,), device="cuda")
                            labels = assign(x, c, precision="fast", store_sq_dist=False).labels
                            row["labels_off_beyond_ties_pct"] = labels_off(x[sample].double(), c.double(),
                                                                           labels[sample])[1]
                    except Exception as e:  # noqa: BLE001 - report and go on
                        row["error"] = repr(e)[:500]
                    rows.append(row)
                    show(row)
    prepared = prepare_centroids(c.contiguous(), None, x.dtype, fast=True, split=False, exact=False)
    c_mma, bias = prepared.c_mma, prepared.bias
    def search_alone(variant: str, shape, exact: bool) -> None:
        """The search alone into a poisoned record: its labels (and the exact record's bounds)
        against float64 first, then its time replayed."""
        row = {"variant": variant, "shape": shape}
        record = torch.full((7, args.n), float("nan"), device="cuda")
        record.view(torch.int32)[[1, 3, 5]] = -7
        try:
            hopper_search.search(x, c_mma, bias, record, check=exact)
            torch.cuda.synchronize()
            row["labels_off_beyond_ties_pct"] = labels_off_pct(x, c_mma, bias, record)
            if exact:
                row["record_bounds_off_pct"] = record_bounds_off_pct(x, c_mma, bias, record)
            row["ms"] = graph_ms(lambda: hopper_search.search(x, c_mma, bias, record, check=exact), calls=5)
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is reported
            row["error"] = repr(e)[:500]
        rows.append(row)
        show(row)
        if args.json:  # as it goes: a run cut short keeps its rows
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "seed": seed, "rows": rows}, fh, indent=1, default=str)

    for spec in args.configs:
        with env(TORCHKM_HOPPER_STREAMED="1", TORCHKM_HOPPER_STREAMED_CONFIG=spec):
            for exact in (False, True):
                search_alone(f"streamed search alone, {'exact' if exact else 'fast'}, config {spec}",
                             hopper_search.streamed_shape(args.d), exact)
    for spec in args.ring_configs:
        for packed in args.ring_packed:
            for exact, third in [(False, "1")] + [(True, third) for third in args.ring_third]:
                with env(TORCHKM_HOPPER_STREAMED="ring", TORCHKM_HOPPER_RING_CONFIG=spec,
                         TORCHKM_HOPPER_RING_PACKED=packed, TORCHKM_HOPPER_RING_THIRD=third):
                    search_alone(f"ring search alone, {'exact' if exact else 'fast'}, config {spec}, "
                                 f"{'keys' if packed == '1' else 'scores'}" + (f", third {third}" if exact else ""),
                                 hopper_search.ring_shape(args.d, check=exact), exact)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "seed": seed, "rows": rows}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
