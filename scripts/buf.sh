#!/usr/bin/env bash
# Runs `buf` (Buf's protobuf linter, breaking-change checker and `buf curl`), pinned:
# the binary that ships inside the npm package @bufbuild/buf-linux-x64, fetched once from
# the npm registry into .cache/buf and checked against the registry's sha512.
#   scripts/buf.sh ARGS...      e.g. scripts/buf.sh lint proto
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=1.75.0
integrity="sha512-YGGJAx0lpMCE7aMWjNOJcfoEaG/e+iYHnTC4SZ0P5eS4IffMryA9Z4/bb1m1wNXAEJ8ATFMEZOAk/5x9VE47ig=="
dir="$root/.cache/buf/$version"
bin="$dir/package/bin/buf"
if [ ! -x "$bin" ]; then
  [ "$(uname -m)" = x86_64 ] || { echo "buf.sh: only linux-x64 is pinned" >&2; exit 1; }
  command -v curl >/dev/null || { echo "buf.sh: curl missing (scripts/setup.sh)" >&2; exit 1; }
  mkdir -p "$dir"
  tarball="$dir/buf.tgz"
  curl -fsSL --retry 3 -o "$tarball" \
    "https://registry.npmjs.org/@bufbuild/buf-linux-x64/-/buf-linux-x64-$version.tgz"
  got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  [ "$got" = "$integrity" ] || { rm -f "$tarball"; echo "buf.sh: $tarball: $got, want $integrity" >&2; exit 1; }
  tar -xzf "$tarball" -C "$dir"
  rm -f "$tarball"
fi
exec "$bin" "$@"
