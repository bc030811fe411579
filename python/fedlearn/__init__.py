"""fedlearn: the Python SDK of the fedlearn coordinator.

``fedlearn.Client`` federates any model whose training you write in numpy (or anything
that yields float32 arrays); ``fedlearn.torch`` wraps a PyTorch ``nn.Module``. The
coordinator is the C++ ``fedlearn-coordinator``; the wire contract is
proto/fedlearn/v1/coordinator.proto, whose modules are generated at install time.
"""

from fedlearn._version import __version__
from fedlearn.client import Client, Plan, Summary, TlsConfig, make_channel
from fedlearn.errors import FedlearnError, ModelMismatchError, ProtocolError

__all__ = [
    "Client", "Plan", "Summary", "TlsConfig", "make_channel", "FedlearnError",
    "ModelMismatchError", "ProtocolError", "__version__",
]
