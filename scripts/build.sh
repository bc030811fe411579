#!/usr/bin/env bash
# Configures and builds fedlearn with CMake and Ninja into build/ (or $BUILD_DIR).
# Usage: scripts/build.sh [Release|Debug] [ninja targets...]   (no targets: everything)
set -euo pipefail
cd "$(dirname "$0")/.."
build_type="${1:-Release}"
shift || true
build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >/dev/null
ninja -C "$build_dir" "$@"
