#!/usr/bin/env bash
# Installs the Python SDK (python/) as a user would, into a fresh virtual environment
# that sees Debian's python3-grpcio, python3-protobuf, python3-numpy, python3-crc32c
# (and python3-torch): `python3 -m venv --system-site-packages`, then
# `pip install --no-build-isolation` (the build needs protoc and grpc_python_plugin
# from Debian, not PyPI). The SDK tests run with that environment's python.
#   install_sdk.sh SDK_DIR VENV_DIR
set -euo pipefail
sdk=$1 venv=$2
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
# One build at a time in the source tree (build trees running ctest side by side).
exec 9>"$sdk/.install.lock"
flock 9
"$venv/bin/pip" install --quiet --no-build-isolation --no-index "$sdk"
"$venv/bin/python" -c 'import fedlearn; print("fedlearn", fedlearn.__version__, "installed in '"$venv"'")'
