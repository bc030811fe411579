#!/usr/bin/env bash
# Builds the fedlearn image (docker/Dockerfile) with docker where an engine answers
# `docker info`, and with podman otherwise (base image from debootstrap, runc; see
# docker/common.sh). The build stage runs the unit tests: a failing test fails this.
# Usage: docker/build.sh [extra build flags...]   e.g. --no-cache, --pull
# Prints the image name last. FEDLEARN_IMAGE names it (default localhost/fedlearn:latest);
# FEDLEARN_CONTEXT is the source tree to build (default: this checkout).
# FEDLEARN_PREBUILT_DIR, a CMake build directory of that tree on this machine, skips the
# compile (PREBUILT=1 in docker/Dockerfile): its binaries, stripped, go into the image.
set -euo pipefail
cd "$(dirname "$0")/.."
. docker/common.sh
context="${FEDLEARN_CONTEXT:-.}"
# What this script creates and removes on exit.
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT
# The CA bundle the data stage trusts for HTTPS (the npm registry): this machine's, so
# that a TLS-intercepting proxy trusted here is trusted there too. A build secret.
ca_bundle="${FEDLEARN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
if [ ! -s "$ca_bundle" ]; then
  ca_bundle="$(mktemp)"
  scratch+=("$ca_bundle")
fi

build_args=(--build-arg PREBUILT=0)
if [ -n "${FEDLEARN_PREBUILT_DIR:-}" ]; then
  prebuilt="$context/.prebuilt"
  rm -rf "$prebuilt"
  scratch+=("$prebuilt")
  install -D -s -m 0755 -t "$prebuilt" "$FEDLEARN_PREBUILT_DIR/server/fedlearn-coordinator" \
    "$FEDLEARN_PREBUILT_DIR/client/fedlearn-client" "$FEDLEARN_PREBUILT_DIR/client/fedlearn-health"
  build_args=(--build-arg PREBUILT=1)
fi

pick_engine || { echo "docker/build.sh: neither docker nor podman is installed" >&2; exit 1; }
case "$ENGINE" in
  docker)
    base="${FEDLEARN_BASE_IMAGE:-docker.io/library/debian:bookworm-slim}"
    DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile --build-arg BASE_IMAGE="$base" "${build_args[@]}" \
      --secret id=ca_bundle,src="$ca_bundle" \
      -t "$FEDLEARN_IMAGE" "$@" "$context" >&2
    ;;
  podman)
    base="${FEDLEARN_BASE_IMAGE:-$(ensure_podman_base)}"
    # --layers keeps every step's layer for the next build (the default, said
    # explicitly); --pull=never: the base is local.
    podman build --runtime runc --layers --pull=never -f docker/Dockerfile \
      --build-arg BASE_IMAGE="$base" "${build_args[@]}" --secret id=ca_bundle,src="$ca_bundle" \
      -t "$FEDLEARN_IMAGE" "$@" "$context" >&2
    ;;
  *) echo "docker/build.sh: unknown engine $ENGINE" >&2; exit 1 ;;
esac
echo "$FEDLEARN_IMAGE"
