#!/usr/bin/env bash
# Runs every fuzz target (fuzz/) for SECONDS each (default 60), from its committed
# corpus (fuzz/corpus/TARGET); new inputs go to build-asan/fuzz-corpus/TARGET, and a
# crash, leak or sanitizer report to build-asan/fuzz-findings/. Exits 1 if any target
# found something: copy the finding into fuzz/corpus/TARGET (it then runs in ctest as a
# regression test) and fix it.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 0 idx     # a fixed number of executions instead
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(chunk_assembler chunk_wire request_validation safetensors idx config state)
build_dir="${ASAN_BUILD_DIR:-build-asan}"
scripts/sanitize-build.sh "${targets[@]/%/_fuzzer}"
findings="$build_dir/fuzz-findings"
mkdir -p "$findings"
# One target: its verdict in $findings/$t.verdict, a first line ending "no finding" if
# it found nothing.
fuzz_one() {
  local t=$1 work="$build_dir/fuzz-corpus/$1" log="$findings/$1.log" runs cov
  mkdir -p "$work"
  local limit=(-max_total_time="$seconds")
  [ -n "${FUZZ_RUNS:-}" ] && limit=(-runs="$FUZZ_RUNS")
  if "$build_dir/fuzz/${t}_fuzzer" "${limit[@]}" -print_final_stats=1 -rss_limit_mb=2048 \
       -artifact_prefix="$findings/$t-" "$work" "fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz: $t: ${runs:-?} executions, $cov, no finding" >"$findings/$t.verdict"
  else
    { echo "fuzz: $t: FINDING (log $log):"
      grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5; } >"$findings/$t.verdict"
  fi
}
# As many targets at once as there are cores, each single-threaded for the whole time
# given; the verdicts in order at the end.
for t in "${targets[@]}"; do
  rm -f "$findings/$t.verdict"
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
  fuzz_one "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
  cat "$findings/$t.verdict" 2>/dev/null || echo "fuzz: $t: no verdict"
  head -1 "$findings/$t.verdict" 2>/dev/null | grep -q 'no finding$' || failed+=("$t")
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: findings in ${failed[*]}"; exit 1; }
