#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (ctest).
# Works as root or through sudo; exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh Release
# The federated integration test trains on the real digits of data/mnist.
scripts/fetch-data.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure --timeout 300 -j"$(nproc)"
