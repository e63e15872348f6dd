import os

import numpy as np
import pytest

# Kernel tests run Triton's interpreter on the CPU; set it before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
