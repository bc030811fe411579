#!/usr/bin/env bash
# Installs every Debian package that building, testing and the demo need.
# Idempotent: when everything is already there it prints nothing and exits 0.
# Works as root or through sudo.
#   scripts/setup.sh               everything below
#   scripts/setup.sh --build-only  only what building and the unit tests need (the
#                                  container build stage, docker/Dockerfile)
set -euo pipefail

build_packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config ccache
  # libraries
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  grpc-proto libabsl-dev libeigen3-dev libopenblas-dev zlib1g-dev libssl-dev
  libcpp-httplib-dev
  # tests and benchmarks (openssl makes tls_test's certificates)
  libgtest-dev libgmock-dev libbenchmark-dev openssl
)

case "${1:-}" in
  "") ;;
  --build-only) build_only=1 ;;
  *) echo "usage: scripts/setup.sh [--build-only]" >&2; exit 2 ;;
esac

packages=(
  "${build_packages[@]}"
  # the clang build (-Wthread-safety), the sanitizer build and fuzzers (AddressSanitizer,
  # UndefinedBehaviorSanitizer and libFuzzer runtimes), and formatting
  clang libclang-rt-14-dev clang-format
  # tools the scripts and tests call (npm for scripts/fetch-data.sh comes with
  # NodeSource's nodejs, which conflicts with Debian's npm package: fetch-data.sh
  # installs Debian's npm itself when there is no npm command)
  python3 python3-numpy ca-certificates curl procps nodejs
  # the network-partition test: a network namespace and a veth pair
  iproute2
  # tests/server/rdp_check.py: the privacy accountant checked by numerical integration
  python3-mpmath
  # the Python SDK (python/) and its tests: the gRPC runtime (its modules come from
  # protoc and grpc_python_plugin above, in protobuf-compiler-grpc), CRC-32C in C and,
  # ten times as fast, ISA-L's (libisal2, loaded by the SDK when present), a virtual
  # environment to pip-install it into, and PyTorch for fedlearn.torch and
  # examples/pytorch
  python3-grpcio python3-protobuf python3-crc32c libisal2 python3-venv python3-pip
  python3-setuptools python3-torch
  # the dashboard and metrics tests: a real browser and a real Prometheus server
  chromium prometheus
)
if [ -n "${build_only:-}" ]; then packages=("${build_packages[@]}"); fi

source "$(dirname "$0")/apt.sh"
apt_install setup.sh "${packages[@]}"
