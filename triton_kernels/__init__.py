"""Triton kernels of torchkm, installed as ``torchkm._kernels``.

This folder is mapped under the torchkm namespace at build time (see pyproject.toml) because
Triton's own repository ships a top-level package named ``triton_kernels``. Kernels here never
import the public API; ``torchkm._ops`` is the one module that uses them.
"""
