"""The package installs as torchkm, with the kernels under torchkm._kernels, never top-level."""

import importlib.metadata as md
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import torchkm


def test_version_and_public_names():
    assert torchkm.__version__ == md.version("torchkm-triton")
    for name in ("fit", "assign", "update", "transform", "KMeans", "KMeansResult", "IterationStats"):
        assert hasattr(torchkm, name), name


def test_kernels_live_under_the_torchkm_namespace():
    spec = importlib.util.find_spec("torchkm._kernels")
    assert spec is not None and Path(spec.origin).parent.name == "triton_kernels"


def test_wheel_maps_kernels_under_torchkm_and_ships_no_top_level_triton_kernels(tmp_path):
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(root)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("torchkm_triton-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "torchkm/_kernels/__init__.py" in names
    assert "torchkm/py.typed" in names
    # Triton's repository ships a top-level `triton_kernels` package; ours must never shadow it.
    assert {n.split("/")[0] for n in names} == {"torchkm", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}


def test_typed_marker_ships():
    assert (Path(torchkm.__file__).parent / "py.typed").exists()
