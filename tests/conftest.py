import os
import sys

import numpy as np
import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors; it must be chosen
# before any kernel module is imported. With a GPU the kernels compile for it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _fresh_assign_passes():
    """``assign`` keeps a pass per shape between calls: a test that patches the kernel modules must
    not be served one built before its patch."""
    yield
    assign_module = sys.modules.get("torchkm._kernels.assign")
    if assign_module is not None:
        assign_module.clear_reused_passes(all_threads=True)


@pytest.fixture
def kernels(monkeypatch):
    """Send CPU tensors through the Triton kernels too (under the interpreter without a GPU)."""
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
