#!/usr/bin/env bash
# bench_scale.py on 1, 2 and 4 GPUs (as many as the machine has), torchkm under torchrun, then
# flash-kmeans' large-N mode on the same GPU counts, then one table.
#   bash benchmarks/bench_scale.sh OUT_DIR [bench_scale.py arguments...]
# GPUS="1 2 4" picks the GPU counts; FLASH=0 skips flash-kmeans.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift
mkdir -p "$out"
rm -f "$out/rows.jsonl"
have=$(nvidia-smi -L | wc -l)
status=0
for g in ${GPUS:-1 2 4}; do
  [ "$g" -le "$have" ] || { echo "skipping $g GPUs: the machine has $have"; continue; }
  python3 -m torch.distributed.run --standalone --nproc_per_node="$g" benchmarks/bench_scale.py --part torchkm \
    --out "$out" "$@" || status=1
done
if [ "${FLASH:-1}" = 1 ]; then
  for g in ${GPUS:-1 2 4}; do
    [ "$g" -le "$have" ] || continue
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((g - 1))) python3 benchmarks/bench_scale.py --part flash --out "$out" "$@" || status=1
  done
fi
python3 benchmarks/bench_scale.py --part report --out "$out" --json "$out/bench_scale.json" "$@" || status=1
exit "$status"
