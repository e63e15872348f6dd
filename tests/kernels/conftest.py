import os

import pytest
import torch

pytest.importorskip("triton")

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
if not ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

# The interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584); bf16 runs on GPUs only.
needs_gpu_for_bf16 = pytest.mark.skipif(not ON_GPU, reason="Triton interpreter mishandles bf16 tl.dot (triton#11584)")

# Small tiles, so that the odd shapes of the tests span several row, centroid and feature tiles.
SMALL_TILES = {"BLOCK_N": 32, "BLOCK_K": 16, "BLOCK_D": 16, "num_warps": 4, "num_stages": 2}
