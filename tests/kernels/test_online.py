"""triton_kernels/online.py (the EMA codebook update) against its torch reference."""

import pytest
import torch
from torchkm._kernels.assign import assign_keeping_sums
from torchkm._kernels.online import ema_update, ema_update_reference

from tests.kernels.conftest import DEVICE


def _state(k: int, d: int, replicas: int, g: torch.Generator, empty_codes: int = 0) -> dict:
    acc_counts = torch.randint(0, 4, (replicas, k), generator=g).float()
    acc_counts[:, :empty_codes] = 0  # codes the batch never chose: their sizes decay
    acc_sums = torch.randn(replicas, k, d, generator=g) * acc_counts[..., None]
    cluster_size = torch.rand(k, generator=g) * 3
    cluster_size[:empty_codes] = 0.5  # below the tests' revival threshold, 0.7, whatever the decay
    state = {
        "acc_sums": acc_sums, "acc_counts": acc_counts,
        "cluster_size": cluster_size,
        "embed_sum": torch.randn(k, d, generator=g),
        "codebook": torch.randn(k, d, generator=g),
    }
    return {name: t.to(DEVICE) for name, t in state.items()}


def _run(fn, state: dict, **kwargs) -> dict:
    state = {name: t.clone() for name, t in state.items()}
    k, d = state["codebook"].shape
    state["used"] = torch.full((k, d), float("nan"), device=DEVICE)  # poisoned: every row is written
    state["sq_total"] = torch.full((), float("nan"), device=DEVICE)
    fn(state["acc_sums"], state["acc_counts"], state["cluster_size"], state["embed_sum"], state["codebook"],
       used=state["used"], sq_total=state["sq_total"], **kwargs)
    return state


@pytest.mark.parametrize("k,d,replicas", [(1, 1, 1), (7, 3, 3), (1000, 17, 1), (33, 129, 2), (1100, 5, 1)])
@pytest.mark.parametrize("decay,eps", [(0.99, 1e-5), (0.3, 1e-5), (0.8, None), (None, None)])
@pytest.mark.parametrize("normalize", [False, True])
def test_ema_update_matches_reference(k, d, replicas, decay, eps, normalize):
    g = torch.Generator().manual_seed(hash((k, d, replicas, decay, eps, normalize)) % (1 << 31))
    state = _state(k, d, replicas, g, empty_codes=min(k - 1, 2))
    offset = torch.randn(d, generator=g).to(DEVICE)
    parts = torch.rand(37, generator=g).to(DEVICE)
    x = torch.randn(50, d, generator=g).to(DEVICE)
    revive = dict(revive_threshold=0.7, revive_from=x, revive_rows=torch.randint(0, 50, (k,), generator=g).to(DEVICE))
    kwargs = dict(decay=decay, eps=eps, offset=offset, normalize=normalize, part_inertia=parts, **revive)
    got = _run(ema_update, state, **kwargs)
    want = _run(ema_update_reference, state, **kwargs)
    assert not bool((want["cluster_size"] < 0.7).any())
    if k > 1:
        assert bool((want["cluster_size"] == 0.7).any())  # some codes were revived
    for name in ("cluster_size", "embed_sum", "codebook", "used", "sq_total"):
        torch.testing.assert_close(got[name], want[name], rtol=2e-5, atol=2e-5, msg=name)
    assert torch.equal(got["used"], state["codebook"])


@pytest.mark.parametrize("k,d", [(7, 3), (1100, 17), (33, 129)])
@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("normalize", [False, True])
def test_ema_update_of_a_batch_with_non_finite_distances_changes_nothing(k, d, bad, normalize):
    """A non-finite part of the squared distances (a row of NaN or Inf): the sizes, sums and codes
    stay as they were and no code is revived, though codes are dead and the sums are NaN."""
    g = torch.Generator().manual_seed(k + d)
    state = _state(k, d, 2, g, empty_codes=min(k - 1, 2))
    state["acc_sums"][1, k // 2, d - 1] = float(bad)
    parts = torch.rand(300, generator=g).to(DEVICE)
    parts[123] = float(bad)
    x = torch.randn(50, d, generator=g).to(DEVICE)
    kwargs = dict(decay=0.9, eps=1e-5, normalize=normalize, part_inertia=parts, revive_threshold=0.7,
                  revive_from=x, revive_rows=torch.randint(0, 50, (k,), generator=g).to(DEVICE))
    for fn in (ema_update, ema_update_reference):
        got = _run(fn, state, **kwargs)
        for name in ("cluster_size", "embed_sum", "codebook"):
            assert torch.equal(got[name], state[name]), (fn.__name__, name)
        assert torch.equal(got["used"], state["codebook"])
        assert not torch.isfinite(got["sq_total"])


def test_ema_update_without_revival_offset_or_totals_and_with_strided_bf16_rows():
    g = torch.Generator().manual_seed(5)
    state = _state(9, 6, 1, g, empty_codes=3)
    got = {name: t.clone() for name, t in state.items()}
    want = {name: t.clone() for name, t in state.items()}
    args = ("acc_sums", "acc_counts", "cluster_size", "embed_sum", "codebook")
    ema_update(*(got[a] for a in args), decay=0.9, eps=1e-5)
    ema_update_reference(*(want[a] for a in args), decay=0.9, eps=1e-5)
    for name in args[2:]:
        torch.testing.assert_close(got[name], want[name], rtol=2e-5, atol=2e-5)
    # Revival rows of another dtype and layout (a transposed bf16 batch).
    rows = torch.randn(6, 40, generator=g).to(DEVICE, torch.bfloat16).t()
    pick = torch.arange(9, device=DEVICE) * 4
    for out, fn in ((got, ema_update), (want, ema_update_reference)):
        fn(*(out[a] for a in args), decay=0.5, eps=None, revive_threshold=2.5, revive_from=rows, revive_rows=pick)
    for name in args[2:]:
        torch.testing.assert_close(got[name], want[name], rtol=2e-5, atol=2e-5)


def test_ema_update_rejects_bad_buffers():
    g = torch.Generator().manual_seed(0)
    s = _state(4, 3, 1, g)
    args = [s["acc_sums"], s["acc_counts"], s["cluster_size"], s["embed_sum"], s["codebook"]]
    with pytest.raises(ValueError, match="codebook"):
        ema_update(*args[:4], s["codebook"].double(), decay=0.9, eps=None)
    with pytest.raises(ValueError, match="acc_counts"):
        ema_update(args[0], args[1][:, :3], *args[2:], decay=0.9, eps=None)
    with pytest.raises(ValueError, match="decay"):
        ema_update(*args, decay=1.0, eps=None)
    with pytest.raises(ValueError, match="revive"):
        ema_update(*args, decay=0.9, eps=None, revive_threshold=1.0)


@pytest.mark.parametrize("k,d", [(7, 17), (100, 3)])
def test_pass_sums_feed_the_update(k, d):
    """``assign_keeping_sums`` leaves the pass's sums in its accumulators: with the offset added
    back they are the batch's per-code sums, and the inertia partials its squared distances."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(301, d, generator=g).to(DEVICE)
    c = torch.randn(k, d, generator=g).to(DEVICE)
    offset = c.mean(0)
    out = assign_keeping_sums(x, c - offset, precision="fast", offset=offset, store_sq_dist=True)
    counts = torch.bincount(out.labels, minlength=k).float()
    sums = torch.zeros(k, d, device=DEVICE).index_add_(0, out.labels, x)
    torch.testing.assert_close(out.acc_counts.sum(0), counts)
    torch.testing.assert_close(out.acc_sums.sum(0) + counts[:, None] * offset, sums, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.part_inertia.sum(), out.sq_dist.sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.sq_dist, ((x - c[out.labels]) ** 2).sum(1), rtol=1e-4, atol=1e-4)
