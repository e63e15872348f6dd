"""The vocabulary workflows of examples/, run small: real photographs and real sentences, on the CPU."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_visual_vocabulary_retrieves_every_near_duplicate(tmp_path):
    out = _example("visual_vocabulary").main(
        ["--images", "5", "--k", "256", "--device", "cpu", "--out", str(tmp_path / "vocab.png")])
    assert out["k"] == 256 and out["descriptors"] > 1000
    assert out["top1"] == 1.0
    assert (tmp_path / "vocab.png").stat().st_size > 10_000


def test_embeddings_vocabulary_prints_cluster_members(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = _example("embeddings_vocabulary").main(
        ["--max-sentences", "300", "--k", "8", "--show", "3", "--device", "cpu", "--out", str(tmp_path / "emb.png")])
    printed = capsys.readouterr().out
    assert out["n"] == 300 and sum(out["sizes"]) == 300 and min(out["sizes"]) > 0
    assert printed.count("\ncluster ") == 3
    # Spherical k-means of unit vectors: the mean cosine distance to a centroid is well below 1.
    assert 0.0 < out["inertia"] / 300 < 0.8
    assert (tmp_path / "emb.png").stat().st_size > 10_000


@pytest.mark.parametrize("name", ["visual_vocabulary", "embeddings_vocabulary"])
def test_examples_explain_themselves(name, capsys):
    with pytest.raises(SystemExit):
        _example(name).main(["--help"])
    assert "torchkm" in capsys.readouterr().out
