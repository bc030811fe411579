#!/usr/bin/env bash
# Builds the coordinator and the agent with clang and -Werror=thread-safety, so that
# every ABSL_GUARDED_BY and ABSL_EXCLUSIVE_LOCKS_REQUIRED is checked, not only written.
# Into build-clang/ (or $CLANG_BUILD_DIR); run by .ci/run after scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${CLANG_BUILD_DIR:-build-clang}"
CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFEDLEARN_BUILD_TESTS=OFF -DFEDLEARN_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CXX_FLAGS="-Werror=thread-safety" >/dev/null
ninja -C "$build_dir" fedlearn-coordinator fedlearn-client
echo "thread-safety: clang -Werror=thread-safety build of fedlearn-coordinator and fedlearn-client passed"
