"""triton_kernels/lloyd.py: a block's pass records, logged on the device, against the reference."""

import pytest
import torch
from torchkm._kernels.lloyd import record_pass, record_pass_reference

from tests.kernels.conftest import DEVICE


def _state(rows: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    log = torch.randn(rows, width, generator=g, dtype=torch.float64).to(DEVICE)
    stats_prev = torch.randn(4, generator=g, dtype=torch.float64).to(DEVICE)
    control = torch.tensor([1, 5, 0], dtype=torch.int32).to(DEVICE)
    return log, stats_prev, control


@pytest.mark.parametrize("width", [4, 6, 8])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_record_pass_logs_each_pass_in_its_row_like_the_reference(width, rows):
    log, stats_prev, control = _state(rows, width, width * 10 + rows)
    ref_log, ref_prev, ref_control = log.clone(), stats_prev.clone(), control.clone()
    g = torch.Generator().manual_seed(rows)
    # Past the last row too: those records land in the last row.
    for _ in range(rows + 2):
        record = torch.randn(width, generator=g, dtype=torch.float64).to(DEVICE)
        record_pass(record, stats_prev, log, control)
        record_pass_reference(record, ref_prev, ref_log, ref_control)
        assert torch.equal(stats_prev, record[:4])
        assert torch.equal(log, ref_log)
        assert torch.equal(control, ref_control)
    assert control.tolist() == [1, 5, rows]  # the frozen flag and the budget are left alone; the slot stops at rows


def test_record_pass_takes_a_view_of_a_wider_record():
    log, stats_prev, control = _state(2, 8, 3)
    record = torch.arange(8, dtype=torch.float64, device=DEVICE)
    record_pass(record, stats_prev, log, control)
    assert log[0].tolist() == list(range(8))
    assert stats_prev.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_record_pass_rejects_mismatched_shapes():
    log, stats_prev, control = _state(2, 4, 4)
    with pytest.raises(ValueError, match="as wide as the record"):
        record_pass(torch.zeros(6, dtype=torch.float64, device=DEVICE), stats_prev, log, control)
    with pytest.raises(ValueError, match="control 3 wide"):
        record_pass(torch.zeros(4, dtype=torch.float64, device=DEVICE), stats_prev, log, control[:2])
