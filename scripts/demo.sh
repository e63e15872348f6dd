#!/usr/bin/env bash
# The main job: set up, then cluster scikit-learn's bundled digits with torchkm, faiss and scikit-learn.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,demo
.venv/bin/python examples/quickstart.py "$@"
