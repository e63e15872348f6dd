#!/usr/bin/env bash
# The GPU test suite within a time budget (the device tool stops a call at 10 minutes):
#   bash scripts/gpu_tests.sh BUDGET_SECONDS FILE... ; logs to $OUT/pytest_<file>.log, a summary line per file.
# Files not started for lack of budget are listed as "not run" (run them in the next call).
# SHARDS=N: the files' test functions instead split into N runs, dealt round robin (a test's cases
# stay together, so each kernel variant mostly compiles in one process), run side by side on the one GPU:
# Triton's compiles take most of a run's time and the device has 16 cores. Logs to
# $OUT/pytest_shard_<i>.log, a summary line per shard. Failed tests are named after the summary lines;
# a shard stopped by the budget lists the test functions it held (its log's dots say how far it got).
# PYTEST_ADDOPTS reaches the test runs, not the collection (a -v there would change what it parses).
# WRAP: a command the test runs start under, e.g. WRAP="compute-sanitizer --tool memcheck --print-limit 3".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=$1; shift
start=$SECONDS
status=0
shards=${SHARDS:-1}
if [ "$shards" -gt 1 ]; then
  rm -f "$OUT"/test_ids_* "$OUT"/pytest_shard_*.log  # an earlier run's shards would be run again
  # (by test function: case ids may hold spaces)
  env -u PYTEST_ADDOPTS python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep '::' \
    | sed 's/\[.*//' | uniq > "$OUT/test_ids.txt"
  total=$(wc -l < "$OUT/test_ids.txt")
  # (an empty shard would run pytest without ids: the whole suite)
  [ "$total" -lt "$shards" ] && shards=$total
  [ "$shards" -lt 1 ] && { echo "no test functions collected"; exit 1; }
  for i in $(seq 0 $((shards - 1))); do  # round robin: a file's heavy tests tend to sit together
    awk -v n="$shards" -v i="$i" '(NR - 1) % n == i' "$OUT/test_ids.txt" > "$OUT/test_ids_$(printf %02d "$i")"
  done
  pids=()
  for ids in "$OUT"/test_ids_*; do
    i=${ids##*_}
    timeout "$((budget - (SECONDS - start)))" ${WRAP:-} python3 -m pytest -q -rfEs -p no:cacheprovider $(cat "$ids") \
      >"$OUT/pytest_shard_$i.log" 2>&1 &
    pids+=($!)
  done
  i=0
  for pid in "${pids[@]}"; do
    wait "$pid"; rc=$?
    [ "$rc" -ne 0 ] && status=1
    shard=$(printf %02d $i)
    echo "shard $i ($(head -1 "$OUT/test_ids_$shard" | cut -d: -f1) ...) rc=$rc $(tail -1 "$OUT/pytest_shard_$shard.log")"
    grep -E '^(FAILED|ERROR) ' "$OUT/pytest_shard_$shard.log" | sed 's/^/    /'
    if [ "$rc" -eq 124 ]; then
      echo "    stopped by the budget; its test functions:"
      sed 's/^/      /' "$OUT/test_ids_$shard"
    fi
    i=$((i + 1))
  done
  echo "$total test functions in $shards shards ($((SECONDS - start)) s)"
  exit "$status"
fi
for f in "$@"; do
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then echo "not run: $f"; continue; fi
  log="$OUT/pytest_$(echo "$f" | tr '/' '_' | sed 's/\.py$//').log"
  timeout "$left" ${WRAP:-} python3 -m pytest -q -rfEs -p no:cacheprovider "$f" >"$log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && status=1
  echo "$f rc=$rc $(tail -1 "$log") ($((SECONDS - start)) s)"
  grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
done
exit "$status"
