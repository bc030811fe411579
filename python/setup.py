"""Builds the fedlearn package: generates fedlearn/v1 from ../proto with protoc.

The gRPC modules are generated at build time, never committed: protoc --python_out and
grpc_python_plugin (Debian's protobuf-compiler and protobuf-compiler-grpc) compile
proto/fedlearn/v1/coordinator.proto into the build's fedlearn/v1/. The version is the
contract's: proto/fedlearn/v1/coordinator.proto states it on its `// version:` line.
"""

import os
import re
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "proto")
PROTO = os.path.join(PROTO_ROOT, "fedlearn", "v1", "coordinator.proto")


def contract_version():
    with open(PROTO, encoding="utf-8") as f:
        m = re.search(r"^// version: (\d+\.\d+\.\d+)$", f.read(), re.M)
    if m is None:
        raise RuntimeError(f"{PROTO} has no '// version: X.Y.Z' line")
    return m.group(1)


def generate():
    """Writes fedlearn/v1/ (the generated modules) and fedlearn/_version.py."""
    out = os.path.join(HERE, "fedlearn", "v1")
    os.makedirs(out, exist_ok=True)
    plugin = shutil.which("grpc_python_plugin") or "/usr/bin/grpc_python_plugin"
    if shutil.which("protoc") is None or not os.path.exists(plugin):
        raise RuntimeError("protoc and grpc_python_plugin are needed: apt-get install "
                           "protobuf-compiler protobuf-compiler-grpc")
    with tempfile.TemporaryDirectory() as gen:
        subprocess.check_call([
            "protoc", "-I", PROTO_ROOT, f"--python_out={gen}", f"--grpc_python_out={gen}",
            f"--plugin=protoc-gen-grpc_python={plugin}", PROTO])
        for name in ("coordinator_pb2.py", "coordinator_pb2_grpc.py"):
            shutil.copy(os.path.join(gen, "fedlearn", "v1", name), os.path.join(out, name))
    with open(os.path.join(out, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/fedlearn/v1 at build time."""\n')
    with open(os.path.join(HERE, "fedlearn", "_version.py"), "w") as f:
        f.write(f'"""Generated at build time."""\n__version__ = "{contract_version()}"\n')


class BuildWithProto(build_py):
    def run(self):
        generate()
        super().run()


# Every setuptools command (metadata too) needs the generated package to exist.
generate()
setup(version=contract_version(), cmdclass={"build_py": BuildWithProto})
