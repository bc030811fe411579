"""The gRPC runtime and the modules generated from proto/fedlearn/v1 at install time."""

from __future__ import annotations

from typing import Any, Tuple

from fedlearn.errors import FedlearnError


def modules() -> Tuple[Any, Any, Any]:
    """``(grpc, coordinator_pb2, coordinator_pb2_grpc)``. Raises ``FedlearnError`` saying
    what to install when they are missing."""
    try:
        import grpc
        import grpc.experimental  # noqa: F401 - ChannelOptions, for make_channel
        from fedlearn.v1 import coordinator_pb2, coordinator_pb2_grpc
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise FedlearnError(
            f"cannot import the gRPC runtime or fedlearn's generated modules ({e}): "
            "install python3-grpcio and python3-protobuf, and the package with "
            "`pip install --no-build-isolation ./python` (which generates them from "
            "proto/)") from None
    return grpc, coordinator_pb2, coordinator_pb2_grpc
