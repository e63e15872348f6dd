"""Launch configurations of the kernels: one table, chosen from the problem's shape and dtype.

The table was set from sweeps on an H200 (benchmarks/bench_lloyd.py --sweep); ``TORCHKM_ASSIGN_CONFIG``
(``BLOCK_N,BLOCK_K,BLOCK_D,num_warps,num_stages``) overrides it for experiments.
"""

from __future__ import annotations

import os

import torch
import triton

__all__ = ["assign_config", "num_persistent_programs", "small_d_block_n", "update_config"]


def _override() -> dict | None:
    spec = os.environ.get("TORCHKM_ASSIGN_CONFIG")
    if not spec:
        return None
    bn, bk, bd, warps, stages = (int(v) for v in spec.split(","))
    return {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_D": bd, "num_warps": warps, "num_stages": stages}


def assign_config(n: int, k: int, d: int, dtype: torch.dtype, precision: str) -> dict:
    """Tile sizes for the fused assignment kernel.

    A row tile is loaded once for all centroid tiles when the padded row fits one chunk (d <= 128
    for 4-byte operands, 256 for 2-byte ones); otherwise the features are streamed in chunks.
    """
    override = _override()
    if override is not None:
        return override
    operand_bytes = 4 if (dtype == torch.float32 or precision in ("tf32x3", "ieee")) else 2
    if precision == "tf32x3":
        # Re-checks: three products per tile (hi/lo splits held in shared memory); small tiles.
        d_pad = max(16, triton.next_power_of_2(d))
        block_d = d_pad if d_pad <= 128 else 32
        return {"BLOCK_N": 64, "BLOCK_K": min(64, max(16, triton.next_power_of_2(k))), "BLOCK_D": block_d,
                "num_warps": 4, "num_stages": 2}
    d_pad = max(16, triton.next_power_of_2(d))
    one_chunk = 128 if operand_bytes == 4 else 256
    k_pad = max(16, triton.next_power_of_2(k))
    if d_pad > one_chunk:
        # Streamed features: a deeper pipeline over the feature chunks (H200 sweep, d=256/768).
        block_d = 32 if operand_bytes == 4 else 64
        return {"BLOCK_N": 128, "BLOCK_K": min(64, k_pad), "BLOCK_D": block_d, "num_warps": 4, "num_stages": 3}
    if operand_bytes == 4:
        return {"BLOCK_N": 128, "BLOCK_K": min(128, k_pad), "BLOCK_D": d_pad, "num_warps": 8, "num_stages": 2}
    return {"BLOCK_N": 64, "BLOCK_K": min(64, k_pad), "BLOCK_D": d_pad, "num_warps": 4, "num_stages": 2}


def update_config(d: int) -> dict:
    """Tile sizes of the stand-alone update kernels."""
    return {"BLOCK_N": 64, "BLOCK_D": min(128, max(16, triton.next_power_of_2(d)))}


def num_persistent_programs(device: torch.device) -> int:
    """Programs of a persistent launch: a few per SM (a handful under the CPU interpreter)."""
    if device.type != "cuda":
        return 4
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


def small_d_block_n(n: int, k: int) -> int:
    """Rows per program of the small-d kernel (one row per thread for 4 warps, more for big n)."""
    return 256 if n >= (1 << 20) else 128
