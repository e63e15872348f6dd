"""What torch.compile thinks each kernel launch writes: only its outputs, never the rows.

Inductor decides which arguments a ``wrap_triton`` launch mutates from the kernel's Triton IR, and
treats a helper's pointer arguments as written wherever a value the helper returns reaches a
store's address. A launch that "writes" the rows makes Inductor clone them before it and keeps a
compiled VQ layer from running as a CUDA graph (its input counts as mutated). So every launch of
the assignment ops, as ``torch.compile`` traces them, is checked here against the arguments it may
write.

The check runs in a child process without the interpreter (Triton's IR of the real kernels; the
target is an sm_90 GPU by name, nothing is launched): the launches of each op are recorded, not
run, then analysed by torch's own function.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The outputs of each kernel (everything else it gets is read-only).
WRITES = {
    "_prepare_kernel": {"bias_ptr", "bias_centred_ptr", "bias_exact_ptr", "c_mma_ptr", "c_lo_ptr", "c_exact_ptr", "c_norm_ptr",
                        "zero_f32_ptr", "zero_f64_ptr", "zero_i32_ptr", "control_ptr", "half_ptr"},
    "_amax_parts_kernel": {"out_ptr", "norm_ptr"},
    "_half_rows_kernel": {"out_ptr"},
    "_assign_kernel": {"acc_ptr", "chunk_min_ptr", "flag_count_ptr", "flag_rows_ptr", "key_ptr", "labels_ptr",
                       "lower_ptr", "part_changed_ptr", "part_inertia_ptr", "sq_dist_ptr"},
    "_research_kernel": {"key_ptr"},
    "_candidate_plan_kernel": {"count_ptr", "list_ptr", "top_ptr", "xh_ptr", "cand_ptr"},
    "_neighbour_need_kernel": {"need_ptr"},
    "_neighbours_kernel": {"tally_ptr", "ids_ptr"},
    # (the neighbour search's centred centroids)
    "_column_partials_kernel": {"partials_ptr"},
    "_centre_kernel": {"out_ptr", "mean_ptr"},
    "_neighbours_finish_kernel": {"need_ptr", "tally_ptr", "count_ptr", "radius_ptr"},
    "_candidate_kernel": {"count_ptr", "cand_ptr"},
    "_candidate_exact_kernel": {"count_ptr", "key_ptr", "slot_list_ptr"},
    "_assign_small_d_kernel": {"acc_ptr", "labels_ptr", "part_changed_ptr", "part_inertia_ptr", "sq_dist_ptr"},
}

CASES = [  # (precision, fused with the sums, d, k[, a setting of CASE_ENV, kept for the cases after it])
    ("exact", True, 40, 70), ("exact", False, 40, 70), ("fast", True, 40, 70), ("fast", False, 130, 70),
    ("exact", True, 130, 70), ("exact", True, 40, 1000), ("exact", True, 3, 20), ("fast", False, 3, 20),
    ("exact", True, 300, 1000),  # fp16 operands: the candidate re-search over the plan's fp16 copy
    ("exact", True, 40, 1000, "unlisted"),  # no chunk minima: the candidate launch without the plan
]
# Settings a case's name stands for.
CASE_ENV = {"unlisted": {"TORCHKM_CHUNK_MINS": "0"}}


def _analyse() -> None:
    """The child: record each case's launches, then print what torch's analysis says each writes."""
    import importlib

    import torch
    import torchkm._kernels.assign as assign_module
    import torchkm._kernels.centroids as centroids_module
    import triton
    from torch._higher_order_ops import triton_kernel_wrap
    from triton.backends.compiler import GPUTarget

    from torchkm import _ops

    calls = []

    def recorder(kernel):
        class Launch:
            def __getitem__(self, grid):
                def record(*args, **kwargs):
                    calls.append((kernel, args, kwargs))
                return record
        return Launch()

    assign_module.launcher = centroids_module.launcher = recorder

    class NamedTarget:  # no GPU here: Triton's IR needs only the target's name
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def is_active(self):
            return True

    analyse = getattr(triton_kernel_wrap, "identify_accessed_tensors", None)
    if analyse is not None:
        def written(kernel, kwargs):
            return sorted(dep.name for dep in analyse(kernel, kwargs, {}).read_writes.writes)
    else:  # torch < 2.12
        def written(kernel, kwargs):
            return sorted(triton_kernel_wrap.identify_mutated_tensors(kernel, kwargs, {}))

    triton.runtime.driver.set_active(NamedTarget())
    results = []
    for precision, fused, d, k, *setting in CASES:
        calls.clear()
        for name in setting:
            os.environ.update(CASE_ENV[name])
        gen = torch.Generator().manual_seed(d + k)
        x, c = torch.randn(300, d, generator=gen), torch.randn(k, d, generator=gen)
        if fused:
            _ops.query_assign_and_sum(x, c, precision)
        else:
            _ops.query_assign(x, c, "euclidean", precision)
        for kernel, args, kwargs in calls:
            kernel = getattr(importlib.import_module(kernel.fn.__module__), kernel.fn.__name__)
            bound = {**dict(zip(kernel.arg_names, args)), **kwargs}
            bound = {key: value for key, value in bound.items() if key not in ("num_warps", "num_stages")}
            results.append({"case": [precision, fused, d, k, *setting], "kernel": kernel.fn.__name__,
                            "writes": written(kernel, bound)})
    print(json.dumps(results))


def test_launches_write_only_their_outputs():
    pytest.importorskip("triton.backends.nvidia")
    env = {**os.environ, "TORCHKM_ENGINE": "triton", "TORCHKM_HOPPER_SEARCH": "0", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    results = json.loads(child.stdout.strip().splitlines()[-1])
    kernels = {r["kernel"] for r in results}
    assert {"_prepare_kernel", "_assign_kernel", "_assign_small_d_kernel", "_research_kernel", "_candidate_plan_kernel",
            "_candidate_kernel", "_candidate_exact_kernel", "_amax_parts_kernel", "_half_rows_kernel",
            "_neighbour_need_kernel", "_neighbours_kernel",
            "_neighbours_finish_kernel"} <= kernels
    for r in results:
        extra = set(r["writes"]) - WRITES[r["kernel"]]
        assert not extra, f"{r['kernel']} in case {r['case']} counts {sorted(extra)} as written"
        # An analysis that failed would count every tensor: the outputs alone are a handful.
        assert r["writes"], r


if __name__ == "__main__":
    _analyse()
