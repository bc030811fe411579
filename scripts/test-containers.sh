#!/usr/bin/env bash
# CI's container step: docker/smoke-test.sh (image build with the unit tests inside,
# coordinator + 3 agent containers to DONE, SIGTERM, podman kube play) when this
# machine can run containers, else one line saying why it was skipped. Called by
# .ci/run after scripts/test.sh.
#
# Without a Docker engine it installs podman and what the podman route needs (Debian
# packages) when they are missing. Skips (exit 0, a line starting "SKIPPED") when:
#   FEDLEARN_SKIP_CONTAINERS=1, podman cannot be installed, or podman cannot run a
#   container here.
# Fails when the smoke test fails or takes longer than FEDLEARN_SMOKE_TIMEOUT seconds
# (default 1200: a cold build from source took 704 s on a busy 2-core machine).
#
# The image takes the binaries scripts/test.sh just built and tested in build/ (or
# BUILD_DIR) when they are there (docker/Dockerfile, PREBUILT=1): what this step checks
# is the image around them (users, volume, signals, health, kube play), and compiling
# the same sources a second time inside the image cost CI about 9 of its 30 minutes.
# FEDLEARN_IMAGE_FROM_SOURCE=1 builds and unit-tests them inside the image instead, as
# a release image is built (docker/build.sh without FEDLEARN_PREBUILT_DIR).
#
#   scripts/test-containers.sh --prepare   only installs and makes the base image, then
#                                          exits 0 (.ci/run runs it beside the builds:
#                                          it waits on the network, they on the CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=0
case "${1:-}" in
  "") ;;
  --prepare) prepare=1 ;;
  *) echo "usage: scripts/test-containers.sh [--prepare]" >&2; exit 2 ;;
esac

skip() { echo "SKIPPED container smoke test (docker/smoke-test.sh): $*"; exit 0; }

[ "${FEDLEARN_SKIP_CONTAINERS:-0}" = 1 ] && skip "FEDLEARN_SKIP_CONTAINERS=1"

. docker/common.sh
if ! { command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; }; then
  # catatonit: the pause process of pods (podman kube play).
  packages=(podman runc debootstrap uidmap slirp4netns fuse-overlayfs catatonit)
  source scripts/apt.sh
  mapfile -t missing < <(missing_packages "${packages[@]}")
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || skip "not root, and missing ${missing[*]}"
    echo "test-containers.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
      skip "could not install ${missing[*]}"
  fi
  FEDLEARN_ENGINE=podman pick_engine
  base="$(ensure_podman_base)" || skip "no base image (debootstrap or podman import failed)"
  podman run --rm --runtime runc "$base" true >/dev/null 2>&1 ||
    skip "podman cannot run a container on this machine"
fi
if [ "$prepare" = 1 ]; then
  echo "test-containers.sh: prepared (engine and base image)"
  exit 0
fi

build_dir="${BUILD_DIR:-build}"
if [ "${FEDLEARN_IMAGE_FROM_SOURCE:-0}" != 1 ] && [ -x "$build_dir/server/fedlearn-coordinator" ] &&
   [ -x "$build_dir/client/fedlearn-client" ] && [ -x "$build_dir/client/fedlearn-health" ]; then
  export FEDLEARN_PREBUILT_DIR="$build_dir"
  echo "test-containers.sh: the image takes the binaries of $build_dir (FEDLEARN_IMAGE_FROM_SOURCE=1 compiles them in the image)"
fi

rc=0
timeout "${FEDLEARN_SMOKE_TIMEOUT:-1200}" docker/smoke-test.sh || rc=$?
case "$rc" in
  0) ;;
  77) skip "the smoke test found no engine that can run containers" ;;
  124) echo "test-containers.sh: the smoke test took over ${FEDLEARN_SMOKE_TIMEOUT:-1200}s" >&2; exit 1 ;;
  *) exit "$rc" ;;
esac
