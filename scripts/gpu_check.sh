#!/usr/bin/env bash
# Everything a GPU session checks, in one call of the device tool:
#   device tool: `bash scripts/gpu_check.sh [bench args...]` with carry [".whl"] (wheels of faiss-cpu
#   for the faiss tests, flash-kmeans for the side-by-side benchmark, and tqdm).
# Installs torchkm over the image's own torch/Triton (no downloads), runs the whole test suite on
# the GPU (CUDA and compiled-kernel tests included), the quickstart on CUDA, then the benchmarks
# named in BENCHES (default "lloyd vq": bench_lloyd.py with the arguments given here, "prune":
# bench_prune.py with PRUNE_ARGS, then
# bench_vq.py and the VQ-VAE example against vector-quantize-pytorch, whose wheels and those of its
# dependencies are carried in .whl too). Logs, pictures and JSON go to $OUT.
# GPU_CHECK_SKIP_TESTS=1 runs the benchmarks only; PYTEST_ARGS picks tests (default: all of tests/,
# more than the tool's 10-minute limit on an H200 in 2026-11: tests/kernels/test_assign.py alone
# took 5 minutes; split it over calls, e.g. with scripts/gpu_tests.sh).
# "scale" runs bench_scale.py on 1, 2 and 4 GPUs as far as the machine has them (SCALE_ARGS);
# "boxes" scripts/diag_boxes.py (the box engine's pass against the dense one; BOXES_ARGS).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, numpy, sklearn; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| triton', triton.__version__, '| numpy', numpy.__version__, '| sklearn', sklearn.__version__)"
python3 -c "import faiss; print('faiss', faiss.__version__)" || echo "faiss missing: faiss tests skip"
python3 -c "import flash_kmeans; print('flash-kmeans', flash_kmeans.__version__)" || echo "flash-kmeans missing"
status=0
if [ "${GPU_CHECK_SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -rs ${PYTEST_ARGS:-tests} 2>&1 | tee "$OUT/pytest_gpu.log"
  status=${PIPESTATUS[0]}
  python3 examples/quickstart.py --device cuda --out "$OUT/quickstart_digits_cuda.png" 2>&1 | tee "$OUT/quickstart_cuda.log"
fi
for bench in ${BENCHES:-lloyd vq}; do
  case "$bench" in
    lloyd) python3 benchmarks/bench_lloyd.py --json "$OUT/bench_lloyd.json" "$@" 2>&1 | tee "$OUT/bench_lloyd.log" ;;
    prune) python3 benchmarks/bench_prune.py --json "$OUT/bench_prune.json" ${PRUNE_ARGS:-} 2>&1 | tee "$OUT/bench_prune.log" ;;
    boxes) python3 scripts/diag_boxes.py --json "$OUT/diag_boxes.json" ${BOXES_ARGS:-} 2>&1 | tee "$OUT/diag_boxes.log" ;;
    scale) bash benchmarks/bench_scale.sh "$OUT" ${SCALE_ARGS:-} 2>&1 | tee "$OUT/bench_scale.log" ;;
    vq)
      python3 benchmarks/bench_vq.py --json "$OUT/bench_vq.json" 2>&1 | tee "$OUT/bench_vq.log"
      python3 examples/vqvae.py --device cuda --compare --out "$OUT/vqvae" 2>&1 | tee "$OUT/vqvae_cuda.log" ;;
    *) echo "unknown benchmark $bench" >&2; status=1 ;;
  esac
done
exit "$status"
