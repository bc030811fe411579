#!/usr/bin/env bash
# Generates the Python modules for proto/fedlearn/v1/coordinator.proto with Debian's
# protoc (--python_out) and gRPC plugin (/usr/bin/grpc_python_plugin, package
# protobuf-compiler-grpc). Usage: generate.sh [OUT_DIR]   (default: examples/python/build)
# The output is not committed; client.py adds OUT_DIR to sys.path (--gen_dir).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$here/build}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || echo /usr/bin/grpc_python_plugin)}"
command -v protoc >/dev/null || { echo "generate.sh: protoc not found (apt-get install protobuf-compiler)" >&2; exit 1; }
[ -x "$plugin" ] || { echo "generate.sh: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2; exit 1; }
mkdir -p "$out"
protoc -I "$root/proto" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$root/proto/fedlearn/v1/coordinator.proto"
# Make the generated directories importable as packages.
touch "$out/fedlearn/__init__.py" "$out/fedlearn/v1/__init__.py"
echo "$out"
