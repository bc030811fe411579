"""Tensors on the wire: the chunked, checksummed encoding of proto/fedlearn/v1.

A model travels as one run of ``TensorChunk`` messages per tensor, in the order of the
model spec: each chunk carries the tensor's name, shape, dtype, encoding, total payload
bytes and its offset, up to 1 MiB of payload, the CRC-32C of that payload, and, on the
tensor's last chunk, the CRC-32C of the whole payload. Payloads are little-endian float32
(``ENCODING_DENSE``) or, for updates, a float32 scale followed by one int8 per value
(``ENCODING_QUANTIZED``: value = scale * q). Everything here works on whole numpy arrays
and bytes: no per-element Python loops, and the CRCs come from ISA-L where it is installed
(``crc32c``, in software, elsewhere).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Union

import crc32c as _crc32c
import numpy as np

from fedlearn.errors import ProtocolError

#: The contract's limit on one chunk's payload.
MAX_CHUNK_BYTES = 1 << 20

#: A tensor's encoded bytes: ``bytes``, or a byte view of its float32 values.
Payload = Union[bytes, memoryview]


def _isal_crc32c() -> Optional[Callable[[Payload, int], int]]:
    """CRC-32C from ISA-L (Debian's libisal2: ``crc32_iscsi``, with the crc32 and
    carry-less multiply instructions), or None where the library is absent. Debian's
    python3-crc32c has no hardware path: it computes 2.1 GB/s against ISA-L's 22 GB/s
    on 64 KiB (AMD EPYC, AVX-512), which is a sixth of a 4.8 MB download's time."""
    try:
        lib = ctypes.CDLL("libisal.so.2")
    except OSError:
        return None
    iscsi = lib.crc32_iscsi
    iscsi.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    iscsi.restype = ctypes.c_uint32

    def crc(data: Payload, value: int = 0) -> int:
        # crc32_iscsi neither inverts the register on entry nor on exit.
        buffer = np.frombuffer(data, dtype=np.uint8)
        return iscsi(buffer.ctypes.data, buffer.size, value ^ 0xFFFFFFFF) ^ 0xFFFFFFFF

    return crc


_fast_crc32c = _isal_crc32c()


def crc32c(data: Payload, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``value`` (the CRC of a prefix);
    with ISA-L when it is installed, else with python3-crc32c."""
    if _fast_crc32c is not None:
        return _fast_crc32c(data, value)
    return _crc32c.crc32c(data, value)


# Continuing a CRC over n more bytes is affine in the CRC so far: crc32c(B, v) =
# L_n(v) ^ crc32c(B, 0), with L_n linear over GF(2) and independent of B's bytes.
# So a tensor's CRC follows from its chunks' CRCs without reading the bytes twice:
# running = L_n(running) ^ chunk_crc. L_n is a 32x32 bit matrix (32 column words),
# made by squaring from L_1 and cached per n (a model's chunk lengths repeat every
# round).
_shift_cache: dict = {}


def _apply(matrix: List[int], v: int) -> int:
    out = 0
    k = 0
    while v:
        if v & 1:
            out ^= matrix[k]
        v >>= 1
        k += 1
    return out


def _compose(a: List[int], b: List[int]) -> List[int]:
    """The matrix of x -> a(b(x))."""
    return [_apply(a, column) for column in b]


def _shift_matrix(n: int) -> List[int]:
    matrix = _shift_cache.get(n)
    if matrix is None:
        base = crc32c(b"\0", 0)
        one = [crc32c(b"\0", 1 << k) ^ base for k in range(32)]  # L_1
        matrix = [1 << k for k in range(32)]  # identity
        power = one
        m = n
        while m:
            if m & 1:
                matrix = _compose(power, matrix)
            power = _compose(power, power)
            m >>= 1
        if len(_shift_cache) < 4096:
            _shift_cache[n] = matrix
    return matrix


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """CRC-32C of A followed by B, from CRC(A), CRC(B) and B's length."""
    return _apply(_shift_matrix(length_b), crc_a) ^ crc_b


def tensor_numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class Reassembler:
    """Checks a model's chunks against its ``spec`` as they arrive and places them.

    ``add`` takes each chunk in the order received, so verification (CRC-32C per chunk
    and per tensor, names, shapes, sizes, offsets, finiteness) overlaps the arrival of
    the next ones; ``finish`` returns one float32 array per tensor, viewing ``buffers``
    (one model's bytes, from ``Reassembler.buffers(spec)``) when given, so that a client
    receiving every round reuses the same memory, or new arrays otherwise. Raises
    ``ProtocolError`` naming the tensor on any mismatch.
    """

    @staticmethod
    def buffers(spec) -> List[np.ndarray]:
        """Byte buffers to receive ``spec``'s tensors into, one per tensor. Their pages
        are touched here, so that the first download into them does not also pay a
        page fault per 4 KiB (on a KVM guest, mnist_cnn's first reassembly took
        16-18 ms with untouched buffers and 10-12 ms with these)."""
        buffers = [np.empty(tensor_numel(t.shape) * 4, dtype=np.uint8) for t in spec.tensors]
        for b in buffers:
            b.fill(0)
        return buffers

    def __init__(self, pb2: Any, spec: Any, buffers: Optional[List[np.ndarray]] = None):
        self._pb2 = pb2
        self._tensors = list(spec.tensors)
        self._buffers = buffers
        self._arrays: List[np.ndarray] = []
        self.received_bytes = 0  # payload bytes of the chunks added
        # Each complete tensor's CRC-32C, as checked: what the model was, in a few
        # bytes (Client tells a round's weights from another's by them).
        self.tensor_crcs: List[int] = []
        self._start_tensor(0)

    def _start_tensor(self, index: int) -> None:
        self._index = index
        if index == len(self._tensors):
            return
        t = self._tensors[index]
        self._shape = tuple(int(d) for d in t.shape)
        self._total = tensor_numel(self._shape) * 4
        if self._buffers is not None:
            self._payload = self._buffers[index]
            if self._payload.size != self._total:
                raise ValueError(f"{t.name}: a buffer of {self._payload.size} bytes, "
                                 f"want {self._total}")
        else:
            self._payload = np.empty(self._total, dtype=np.uint8)
        self._filled = 0
        self._running = 0

    def add(self, c) -> None:
        """Verifies one ``TensorChunk`` and copies its payload into place."""
        if self.complete:
            raise ProtocolError(f"a chunk of {c.name} after the last tensor")
        t = self._tensors[self._index]
        pb2 = self._pb2
        if c.name != t.name:
            raise ProtocolError(f"expected a chunk of {t.name}, got {c.name}")
        if tuple(c.shape) != self._shape:
            raise ProtocolError(f"{t.name}: shape {list(c.shape)}, want {list(self._shape)}")
        if c.dtype != pb2.DTYPE_FLOAT32 or c.encoding != pb2.ENCODING_DENSE:
            raise ProtocolError(f"{t.name}: not dense float32")
        if c.total_bytes != self._total:
            raise ProtocolError(f"{t.name}: total_bytes {c.total_bytes}, want {self._total}")
        filled = self._filled
        if c.offset != filled:
            raise ProtocolError(f"{t.name}: chunk at offset {c.offset}, want {filled}")
        data = c.data  # a copy out of the message: read it once
        n = len(data)
        if n > MAX_CHUNK_BYTES or filled + n > self._total:
            raise ProtocolError(f"{t.name}: chunk of {n} bytes too large")
        if n == 0 and self._total > 0:  # as the C++ receiver checks
            raise ProtocolError(f"{t.name}: empty chunk at offset {filled}")
        if filled + n == self._total and not c.last:
            raise ProtocolError(f"{t.name}: chunk at offset {filled} completes the "
                                "tensor but is not marked last")
        crc = crc32c(data)
        if crc != c.chunk_crc32c:
            raise ProtocolError(f"{t.name}: chunk CRC-32C mismatch at offset {c.offset}")
        self._running = crc if filled == 0 else crc32c_combine(self._running, crc, n)
        self._payload[filled:filled + n] = np.frombuffer(data, dtype=np.uint8)
        self._filled = filled + n
        self.received_bytes += n
        if not c.last:
            return
        if self._filled != self._total:
            raise ProtocolError(f"{t.name}: last chunk at {self._filled} of {self._total} "
                                "bytes")
        if self._running != c.tensor_crc32c:
            raise ProtocolError(f"{t.name}: tensor CRC-32C mismatch")
        self.tensor_crcs.append(self._running)
        values = self._payload.view("<f4").reshape(self._shape)
        if not np.isfinite(values).all():
            raise ProtocolError(f"{t.name}: weights are not all finite")
        self._arrays.append(values)
        self._start_tensor(self._index + 1)

    @property
    def complete(self) -> bool:
        """Whether every tensor's last chunk has been added."""
        return self._index == len(self._tensors)

    def finish(self) -> List[np.ndarray]:
        """The model's tensors; raises ``ProtocolError`` if a tensor is incomplete."""
        if not self.complete:
            raise ProtocolError("weights ended before tensor "
                                f"{self._tensors[self._index].name} was complete")
        return self._arrays


def reassemble(pb2, spec, chunks: Iterable) -> List[np.ndarray]:
    """Checks ``chunks`` against the model ``spec`` and returns one float32 array per tensor.

    Every chunk's name, shape, dtype, encoding, size and offset, its CRC-32C and each
    tensor's running CRC-32C are verified; the values must be finite. Raises
    ``ProtocolError`` naming the tensor otherwise.
    """
    r = Reassembler(pb2, spec)
    for c in chunks:
        r.add(c)
    return r.finish()


def encode(values: np.ndarray, int8: bool) -> tuple:
    """A tensor's payload (bytes-like) and the float32 values the coordinator will decode.

    Dense: the float32 values, as a byte view of them (no copy: ``push_requests`` copies
    each chunk out once, into its request). int8 (``ENCODING_QUANTIZED``): a float32 scale
    s = max|x| / 127, then one int8 q = round(x / s) per value, decoded as s * q.
    """
    v = np.ascontiguousarray(values, dtype="<f4").ravel()
    if not int8:
        return memoryview(v).cast("B"), v
    scale = (np.max(np.abs(v)) if v.size else np.float32(0)) / np.float32(127)
    if scale > 0:
        q = np.clip(np.rint(v / scale), -127, 127).astype(np.int8)
    else:
        q = np.zeros(v.size, dtype=np.int8)
    decoded = (scale * q.astype(np.float32)).astype(np.float32)
    return np.array([scale], dtype="<f4").tobytes() + q.tobytes(), decoded


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited_tag(field) -> bytes:
    """The key of a length-delimited field (wire type 2), from its descriptor."""
    return _varint(field.number << 3 | 2)


def push_requests(pb2: Any, spec: Any, payloads: Sequence[Payload], chunk_bytes: int,
                  int8: bool) -> Iterator[bytes]:
    """The serialized ``PushGradientRequest`` of each chunk of the tensors' payloads,
    chunked as the contract says.

    Each chunk's payload is copied once, from ``payloads`` straight into its request's
    bytes. Protobuf serializes the chunk's other fields; its ``data`` field and the
    request's ``chunk`` field around it are framed here (a key and a length each, the
    field numbers read from the generated descriptors), which the coordinator parses as
    it would protobuf's own output: a parser takes a message's fields in any order. Built
    with the message classes, a 1 MiB chunk was copied four times more (into a
    ``bytes``, the ``TensorChunk``, the ``PushGradientRequest`` and its serialization).
    """
    chunk_bytes = max(4, min(chunk_bytes & ~3, MAX_CHUNK_BYTES))
    encoding = pb2.ENCODING_QUANTIZED if int8 else pb2.ENCODING_DENSE
    request_fields = pb2.PushGradientRequest.DESCRIPTOR.fields_by_name
    chunk_key = _length_delimited_tag(request_fields["chunk"])
    data_key = _length_delimited_tag(pb2.TensorChunk.DESCRIPTOR.fields_by_name["data"])
    for t, payload in zip(spec.tensors, payloads):
        view = memoryview(payload).cast("B")
        total = len(view)
        offset = 0
        running = 0
        while True:  # a zero-size tensor still sends one (empty, last) chunk
            data = view[offset:offset + chunk_bytes]
            n = len(data)
            crc = crc32c(data)
            running = crc if offset == 0 else crc32c_combine(running, crc, n)
            last = offset + n == total
            fields = pb2.TensorChunk(
                name=t.name, shape=list(t.shape), dtype=pb2.DTYPE_FLOAT32,
                encoding=encoding, total_bytes=total, offset=offset, chunk_crc32c=crc,
                last=last, tensor_crc32c=running if last else 0).SerializeToString()
            data_head = data_key + _varint(n)
            yield b"".join((chunk_key, _varint(len(fields) + len(data_head) + n), fields,
                            data_head, data))
            offset += n
            if last:
                break
