#!/usr/bin/env bash
# The server and integration tests under ThreadSanitizer (scripts/tsan-build.sh): any
# report fails the test that made it. Run by .ci/run after scripts/test-sanitizers.sh.
# Left out: the tests labelled e2e (agents training the CNN for whole runs: minutes
# each under TSan; their threads are the same as the shorter process tests'), and those
# that measure the process's memory (TSan's shadow memory is in every figure).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${TSAN_BUILD_DIR:-build-tsan}"
scripts/tsan-build.sh
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/$build_dir/tsan.supp"

# The set-up itself: TSan must see an absl::Mutex (no report for a counter only touched
# under it) and must report a race in our code through the suppressions.
check="$build_dir/tsan_check"  # built by tsan-build.sh
"$check" || { echo "tsan: a race-free program was reported: abseil's Mutex is not visible" >&2; exit 1; }
if "$check" race 2>"$check.log"; then
  echo "tsan: an unlocked counter was not reported: the set-up hides races" >&2; exit 1
fi
grep -q 'WARNING: ThreadSanitizer: data race' "$check.log" ||
  { cat "$check.log" >&2; echo "tsan: the race check failed for another reason" >&2; exit 1; }

started=$(date +%s)
# Every test this build made (what tsan-build.sh does not build is registered as
# *_NOT_BUILT; the fuzz corpora run in the other two builds), but the ones above.
ctest --test-dir "$build_dir" --output-on-failure --timeout 600 -j"$(nproc)" \
  -E '_NOT_BUILT|FuzzCorpus|PeakMemory' -LE 'e2e|integration|python|examples'
echo "tsan: the server and integration tests passed under TSan in $(( $(date +%s) - started )) s"
