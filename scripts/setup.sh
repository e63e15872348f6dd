#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install torchkm with its extras.
# torch: a torch already importable by python3 is reused (the venv sees system packages);
# otherwise torch==2.13.0 is installed, which on these machines is a local CPU wheel. Never a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TORCHKM_VENV:-.venv}
PY=${PYTHON:-python3}
extras=${1:-test,demo}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  pip install -q "torch==2.13.0"
fi
# torch is already satisfied here, so resolving the package's own `torch>=2.4` downloads nothing.
pip install -q -e ".[${extras}]"
"$VENV/bin/python" -c "import torch, torchkm; print(f'torchkm {torchkm.__version__} with torch {torch.__version__} ready in $VENV')"
