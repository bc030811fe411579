#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (any report fails
# the test that made it), then every fuzz target for FUZZ_SECONDS (10) each: the build of
# scripts/sanitize-build.sh, which also checks the lock annotations (-Werror=thread-safety).
# Run by .ci/run after scripts/test.sh.
#   scripts/test-sanitizers.sh         every test but those labelled e2e (whole runs of
#                                      agents training the CNN: 13 of the suite's
#                                      minutes under ASan; they run in scripts/test.sh)
#   scripts/test-sanitizers.sh --all   the whole suite
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${ASAN_BUILD_DIR:-build-asan}"
exclude=(-LE e2e)
[ "${1:-}" = --all ] && { exclude=(); export FEDLEARN_E2E_TESTS=ON; }
scripts/sanitize-build.sh
scripts/fetch-data.sh >/dev/null
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
started=$(date +%s)
ctest --test-dir "$build_dir" --output-on-failure --timeout 900 -j"$(nproc)" "${exclude[@]}"
echo "sanitizers: the suite passed under ASan+UBSan in $(( $(date +%s) - started )) s"
scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
