#!/usr/bin/env bash
# The GPU test suite file by file within a time budget (the device tool stops a call at 10 minutes):
#   bash scripts/gpu_tests.sh BUDGET_SECONDS FILE... ; logs to $OUT/pytest_<file>.log, a summary line per file.
# Files not started for lack of budget are listed as "not run" (run them in the next call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
budget=$1; shift
start=$SECONDS
status=0
for f in "$@"; do
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then echo "not run: $f"; continue; fi
  log="$OUT/pytest_$(echo "$f" | tr '/' '_' | sed 's/\.py$//').log"
  timeout "$left" python3 -m pytest -q -rs -p no:cacheprovider "$f" >"$log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && status=1
  echo "$f rc=$rc $(tail -1 "$log") ($((SECONDS - start)) s)"
done
exit "$status"
