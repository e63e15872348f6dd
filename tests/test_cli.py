"""The command line: python -m torchkm fit / predict on .npy and .fvecs files."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.helpers import blobs
from torchkm.cli import main, read_vectors


def _write_fvecs(path, x):
    d = np.full((x.shape[0], 1), x.shape[1], dtype=np.int32)
    np.hstack([d, x.astype(np.float32).view(np.int32)]).tofile(path)


def test_fit_and_predict_npy(tmp_path, rng, capsys):
    x = blobs(rng, 800, 5, 4, spread=50)
    np.save(tmp_path / "x.npy", x)
    c_path, l_path = tmp_path / "c.npy", tmp_path / "l.npy"
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "4", "--centroids", str(c_path), "--labels", str(l_path), "--device", "cpu"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_samples"] == 800 and summary["n_clusters"] == 4 and summary["converged"]
    centroids, labels = np.load(c_path), np.load(l_path)
    assert centroids.shape == (4, 5) and labels.shape == (800,) and labels.dtype == np.int64
    l2 = tmp_path / "l2.npy"
    assert main(["predict", str(tmp_path / "x.npy"), "--centroids", str(c_path), "--labels", str(l2), "--device", "cpu"]) == 0
    np.testing.assert_array_equal(np.load(l2), labels)


def test_fvecs_reader_and_module_entry_point(tmp_path, rng):
    x = rng.standard_normal((100, 7)).astype(np.float32)
    _write_fvecs(tmp_path / "x.fvecs", x)
    np.testing.assert_array_equal(read_vectors(tmp_path / "x.fvecs"), x)
    out = subprocess.run(
        [sys.executable, "-m", "torchkm", "fit", str(tmp_path / "x.fvecs"), "-k", "3", "--centroids", str(tmp_path / "c.npy"), "--no-progress"],
        capture_output=True, text=True, check=True,
    )
    assert json.loads(out.stdout)["n_features"] == 7


def test_errors_are_one_line_messages(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((3, 2), dtype=np.float32))
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "5", "--device", "cpu"]) == 2
    assert "n_clusters=5 is larger than n_samples=3" in capsys.readouterr().err
    (tmp_path / "bad.txt").write_text("1 2 3")
    assert main(["fit", str(tmp_path / "bad.txt"), "-k", "1", "--device", "cpu"]) == 2
    assert "unsupported file type '.txt'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit"])
    with pytest.raises(SystemExit):
        main(["fit", str(tmp_path / "x.npy"), "-k", "1", "--n-init", "best"])
    assert "invalid int_or_auto value: 'best'" in capsys.readouterr().err
    if not torch.cuda.is_available():  # a GPU the machine lacks is a usage error, not a traceback
        assert main(["fit", str(tmp_path / "x.npy"), "-k", "1", "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "device='cuda' needs a CUDA GPU" in err and "Pass --device cpu or --device auto" in err


def test_n_init_auto_as_scikit_learns(tmp_path, rng, capsys):
    np.save(tmp_path / "x.npy", blobs(rng, 300, 3, 4))
    runs = {}
    for n_init in ("auto", "10"):
        c_path = tmp_path / f"c{n_init}.npy"
        args = ["fit", str(tmp_path / "x.npy"), "-k", "4", "--init", "random", "--n-init", n_init, "--device", "cpu",
                "--centroids", str(c_path), "--no-progress"]
        assert main(args) == 0
        runs[n_init] = json.loads(capsys.readouterr().out)["inertia"], np.load(c_path)
    assert runs["auto"][0] == runs["10"][0]
    np.testing.assert_array_equal(runs["auto"][1], runs["10"][1])


def test_distributed_fit_under_torchrun_writes_one_labels_file(tmp_path, rng):
    x = blobs(rng, 1001, 6, 5, spread=50)
    np.save(tmp_path / "x.npy", x)
    c_path, l_path = tmp_path / "c.npy", tmp_path / "l.npy"
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "torchkm", "fit",
         str(tmp_path / "x.npy"), "-k", "5", "--distributed", "--device", "cpu", "--init", "k-means||",
         "--max-points-per-centroid", "100", "--centroids", str(c_path), "--labels", str(l_path), "--no-progress"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])  # rank 0 reports, once
    assert summary["processes"] == 2 and summary["n_samples"] == 1001
    centroids, labels = np.load(c_path), np.load(l_path)
    assert centroids.shape == (5, 6) and labels.shape == (1001,)
    # The labels of both ranks' rows are the nearest centroids of the whole file.
    d2 = ((x[:, None, :].astype(np.float64) - centroids[None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_array_equal(labels, d2.argmin(1))
    assert summary["inertia"] == pytest.approx(d2.min(1).sum(), rel=1e-5)


def test_distributed_without_torchrun_is_a_clear_error(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((10, 2), dtype=np.float32))
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "2", "--device", "cpu", "--distributed"]) == 2
    assert "--distributed needs a torchrun launch" in capsys.readouterr().err


def test_streaming_needs_a_gpu_and_says_so(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((10, 2), dtype=np.float32))
    assert main(["fit", str(tmp_path / "x.npy"), "-k", "2", "--device", "cpu", "--streaming", "on"]) == 2
    assert "streaming=True needs rows in host memory and a GPU" in capsys.readouterr().err
