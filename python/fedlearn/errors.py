"""The SDK's exceptions: every error from the coordinator carries its gRPC code."""

from __future__ import annotations

from typing import Any, Optional


class FedlearnError(Exception):
    """An error from the coordinator or the protocol.

    ``code`` is the ``grpc.StatusCode`` the coordinator answered with (``None`` for an
    error found on this side), ``message`` its text. The codes have one meaning each
    (README, "Status codes"): INVALID_ARGUMENT a malformed request, UNAUTHENTICATED a
    wrong token, NOT_FOUND an unknown client (re-join), FAILED_PRECONDITION a wrong phase
    or stale round, ALREADY_EXISTS a duplicate, RESOURCE_EXHAUSTED over a limit,
    UNAVAILABLE shutting down or unreachable (retry).
    """

    def __init__(self, message: str, code: Optional[Any] = None):
        self.code = code
        self.message = message
        name = getattr(code, "name", None)
        super().__init__(f"{name}: {message}" if name else message)


class ProtocolError(FedlearnError):
    """What the coordinator sent breaks the contract (a bad chunk, a CRC mismatch)."""


class ModelMismatchError(FedlearnError):
    """The local model's tensors differ from the coordinator's model spec."""


def from_rpc_error(error: Any, what: str) -> FedlearnError:
    """A ``FedlearnError`` for a ``grpc.RpcError`` raised by call ``what``."""
    return FedlearnError(f"{what}: {error.details()}", error.code())
