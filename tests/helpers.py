"""Shared test helpers: data generators and float64 oracles."""

import numpy as np
import torch


def blobs(rng, n, d, k, spread=10.0, sigma=1.0, offset=0.0, dtype=np.float32, return_blobs=False):
    """Gaussian blobs: k centres with coordinates uniform in [0, spread), unit-ish clusters.
    ``return_blobs``: also the blob of each row."""
    centres = rng.uniform(0, spread, size=(k, d))
    which = rng.integers(0, k, size=n)
    x = (centres[which] + sigma * rng.standard_normal((n, d)) + offset).astype(dtype)
    return (x, which) if return_blobs else x


# Rows per chunk of ``f64_sq_distances``: the (rows, k, d) differences stay under this many values.
_DIFFERENCE_VALUES = 1 << 24


def f64_sq_distances(x, c):
    """Squared distances of every row of x to every row of c, summed in float64 from the direct
    differences (no cancellation). Rows go in chunks, each value the same sum over its own
    differences: one (n, k, d) intermediate at a GPU test's size (1,892 x 8,192 x 256) is 32 GB,
    and those test cases took 50-73 s each (H200 host, 2026-11-29)."""
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    rows = max(1, _DIFFERENCE_VALUES // max(1, c.shape[0] * c.shape[1]))
    out = np.empty((x.shape[0], c.shape[0]), dtype=np.float64)
    for start in range(0, x.shape[0], rows):
        out[start:start + rows] = ((x[start:start + rows, None, :] - c[None, :, :]) ** 2).sum(-1)
    return out


def numpy_lloyd(x, c0, n_iter):
    """Textbook float64 Lloyd: the independent oracle."""
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(c0, dtype=np.float64).copy()
    for _ in range(n_iter):
        labels = f64_sq_distances(x, c).argmin(1)
        for j in range(c.shape[0]):
            members = x[labels == j]
            if len(members):
                c[j] = members.mean(0)
    labels = f64_sq_distances(x, c).argmin(1)
    return c, labels, f64_sq_distances(x, c)[np.arange(len(x)), labels].sum()


def tie_tolerance(x, c):
    """Per-row bound on fp32 rounding of ||x||^2 - 2x.c + ||c||^2: gaps below it are near-ties."""
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    return 1e-5 * ((x**2).sum(1) + (c**2).sum(1).max())


def assert_labels_match_except_near_ties(x, c, labels, expected):
    """Rows may differ only where the float64 distance gap between the two choices is a near-tie."""
    labels = np.asarray(labels)
    expected = np.asarray(expected)
    differ = np.nonzero(labels != expected)[0]
    if differ.size:
        d = f64_sq_distances(x[differ], c)
        gap = np.abs(d[np.arange(differ.size), labels[differ]] - d[np.arange(differ.size), expected[differ]])
        tol = tie_tolerance(x[differ], c)
        bad = gap > tol
        assert not bad.any(), (
            f"{bad.sum()} of {len(x)} labels differ beyond near-ties: rows {differ[bad][:10]}, "
            f"gaps {gap[bad][:5]}, tolerance {tol[bad][:5]}"
        )
    return differ.size


def assert_sums_equal_but_for_order(sums, other, rows, labels, atol=1e-5):
    """Two per-cluster fp32 sums of the same ``rows`` by the same ``labels``, added in different
    orders (float atomics on a GPU), agree within recursive summation's bound: cluster j's sums
    may part by 2 (m_j - 1) 2^-24 sum |rows| of its m_j rows, per feature, plus ``atol``. A flat
    tolerance is not enough where a large cluster's features cancel: 119 rows of about unit
    size summing to 0.056 parted by 1.1e-5 and 1.5e-5 on an H200, and 20,000 orders of those
    values in numpy's float32 spread 1.8e-5."""
    rows = rows.detach().double().cpu()
    labels = labels.detach().cpu().long()
    k = sums.shape[0]
    abs_sums = torch.zeros(k, rows.shape[1], dtype=torch.float64).index_add_(0, labels, rows.abs())
    counts = torch.bincount(labels, minlength=k).double()
    bound = atol + 2.0 * (counts - 1).clamp(min=0)[:, None] * 2.0**-24 * abs_sums
    gap = (sums.detach().double().cpu() - other.detach().double().cpu()).abs()
    bad = gap > bound
    assert not bad.any(), (f"{int(bad.sum())} sums part beyond reordering: at {bad.nonzero()[:5].tolist()}, "
                           f"gaps {gap[bad][:5].tolist()}, bounds {bound[bad][:5].tolist()}")


def torch_dtype(name):
    return getattr(torch, name)


def assert_passes_count_changed_labels(engine, passes):
    """Run ``passes`` passes of a kernel engine (``iterate``, ``read``, ``labels``) from no labels:
    each pass's reported changed count must equal the labels it changed (all rows at the first),
    and the passes must change some label after the first. Returns the true counts."""
    changed = []
    for it in range(passes):
        before = engine.labels.clone()
        engine.iterate(has_prev=it > 0)
        counted = int(engine.read(1)[0][2])
        changed.append(int((engine.labels != before).sum()) if it else engine.labels.shape[0])
        assert counted == changed[-1], (it, counted, changed)
    assert changed[1] > 0  # the passes did change labels
    return changed


def fp32_tie_rows(n, d, k, seed, device="cpu"):
    """Rows on the bisectors of close centroid pairs, far from every other centroid.

    Pairs ``a, b = site -+ delta / 2`` (|delta| about 1e-3) sit about 14 sqrt(d) apart; each row is
    its pair's midpoint plus a unit step along their bisector. So a row's two distances (about 1)
    part by about 1e-8 (fp32's rounding of the row), inside fp32's rounding of the sums (about
    d 6e-8 each): fp32 orders them by the order a kernel sums the features in, float64 (exact
    here) by the fp32 values. An odd k adds one far centroid. Returns fp32 rows and centroids."""
    g = torch.Generator().manual_seed(seed)
    pairs = k // 2
    sites = 10.0 * torch.randn(pairs, d, generator=g, dtype=torch.float64)
    delta = 1e-3 * torch.randn(pairs, d, generator=g, dtype=torch.float64)
    # The pairs as fp32 values, and the bisectors of those values (in float64).
    a = (sites - delta / 2).float().double()
    b = (sites + delta / 2).float().double()
    c = torch.stack([a, b], dim=1).reshape(2 * pairs, d)
    if k % 2:
        c = torch.cat([c, 10.0 * torch.randn(1, d, generator=g, dtype=torch.float64) + 100.0])
    which = torch.randint(pairs, (n,), generator=g)
    step = torch.randn(n, d, generator=g, dtype=torch.float64)
    unit = (b - a)[which] / (b - a)[which].norm(dim=1, keepdim=True)
    step = step - (step * unit).sum(1, keepdim=True) * unit
    x = (a + b)[which] / 2 + step / step.norm(dim=1, keepdim=True)
    return x.float().to(device), c.float().to(device)
