import os
import sys

import numpy as np
import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors; it must be chosen
# before any kernel module is imported. With a GPU the kernels compile for it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _position_independent_interpreter_dot() -> None:
    """Under the interpreter, ``tl.dot`` of floats is numpy's ``matmul`` in the accumulator's dtype.
    Some CPUs' OpenBLAS float32 kernels round a product column differently by its position in
    the matrix (on an AMD EPYC with OpenBLAS 0.3.31, one centroid stored at indices 3 and 100
    gave 20 of 64 rows different float32 products), so exact ties between identical centroids,
    which a GPU tile computes with one instruction sequence for every column, stop being ties.
    Products of float32 (or narrower) values are exact in float64: summing there and rounding
    once gives every position the same result."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    except ImportError:
        return
    original = InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # float32 / float16 operands only (the interpreter keeps bfloat16 as uint16 bits).
        floats = a.data.dtype in (np.float32, np.float16) and b.data.dtype in (np.float32, np.float16) \
            and d.data.dtype in (np.float32, np.float16)
        if not floats:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)).astype(d.data.dtype)
        return TensorHandle(acc + d.data, d.dtype.scalar)

    InterpreterBuilder.create_dot = create_dot


_position_independent_interpreter_dot()


@pytest.fixture(autouse=True)
def _fresh_assign_passes():
    """``assign`` keeps a pass per shape between calls, and fits keep their engines for the next fit
    of the same rows: a test that patches the kernel modules must not be served one built before
    its patch."""
    yield
    assign_module = sys.modules.get("torchkm._kernels.assign")
    if assign_module is not None:
        assign_module.clear_reused_passes(all_threads=True)
    workspace_module = sys.modules.get("torchkm._workspace")
    if workspace_module is not None:
        workspace_module.clear()


@pytest.fixture
def kernels(monkeypatch):
    """Send CPU tensors through the Triton kernels too (under the interpreter without a GPU)."""
    monkeypatch.setenv("TORCHKM_ENGINE", "triton")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
