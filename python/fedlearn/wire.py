"""Tensors on the wire: the chunked, checksummed encoding of proto/fedlearn/v1.

A model travels as one run of ``TensorChunk`` messages per tensor, in the order of the
model spec: each chunk carries the tensor's name, shape, dtype, encoding, total payload
bytes and its offset, up to 1 MiB of payload, the CRC-32C of that payload, and, on the
tensor's last chunk, the CRC-32C of the whole payload. Payloads are little-endian float32
(``ENCODING_DENSE``) or, for updates, a float32 scale followed by one int8 per value
(``ENCODING_QUANTIZED``: value = scale * q). Everything here works on whole numpy arrays
and bytes: no per-element Python loops, and the CRCs come from ``crc32c`` (SSE4.2).
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Sequence

import crc32c as _crc32c
import numpy as np

from fedlearn.errors import ProtocolError

#: The contract's limit on one chunk's payload.
MAX_CHUNK_BYTES = 1 << 20


def crc32c(data: bytes, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``value`` (the CRC of a prefix)."""
    return _crc32c.crc32c(data, value)


# Continuing a CRC over n more bytes is affine in the CRC so far: crc32c(B, v) =
# L_n(v) ^ crc32c(B, 0), with L_n linear over GF(2) and independent of B's bytes.
# So a tensor's CRC follows from its chunks' CRCs without reading the bytes twice:
# running = L_n(running) ^ chunk_crc. L_n is a 32x32 bit matrix (32 column words),
# made by squaring from L_1 and cached per n (a model's chunk lengths repeat every
# round).
_shift_cache: dict = {}


def _apply(matrix, v: int) -> int:
    out = 0
    k = 0
    while v:
        if v & 1:
            out ^= matrix[k]
        v >>= 1
        k += 1
    return out


def _compose(a, b):
    """The matrix of x -> a(b(x))."""
    return [_apply(a, column) for column in b]


def _shift_matrix(n: int):
    matrix = _shift_cache.get(n)
    if matrix is None:
        base = _crc32c.crc32c(b"\0", 0)
        one = [_crc32c.crc32c(b"\0", 1 << k) ^ base for k in range(32)]  # L_1
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


def reassemble(pb2, spec, chunks: Iterable) -> List[np.ndarray]:
    """Checks ``chunks`` against the model ``spec`` and returns one float32 array per tensor.

    Every chunk's name, shape, dtype, encoding, size and offset, its CRC-32C and each
    tensor's running CRC-32C are verified; the values must be finite. Raises
    ``ProtocolError`` naming the tensor otherwise.
    """
    tensors: List[np.ndarray] = []
    it = iter(chunks)
    for t in spec.tensors:
        shape = tuple(int(d) for d in t.shape)
        total = tensor_numel(shape) * 4
        payload = np.empty(total, dtype=np.uint8)
        filled = 0
        running = 0
        while True:
            c = next(it, None)
            if c is None:
                raise ProtocolError(f"weights ended before tensor {t.name} was complete")
            if c.name != t.name:
                raise ProtocolError(f"expected a chunk of {t.name}, got {c.name}")
            if tuple(c.shape) != shape:
                raise ProtocolError(f"{t.name}: shape {list(c.shape)}, want {list(shape)}")
            if c.dtype != pb2.DTYPE_FLOAT32 or c.encoding != pb2.ENCODING_DENSE:
                raise ProtocolError(f"{t.name}: not dense float32")
            if c.total_bytes != total:
                raise ProtocolError(f"{t.name}: total_bytes {c.total_bytes}, want {total}")
            if c.offset != filled:
                raise ProtocolError(f"{t.name}: chunk at offset {c.offset}, want {filled}")
            data = c.data
            if len(data) > MAX_CHUNK_BYTES or filled + len(data) > total:
                raise ProtocolError(f"{t.name}: chunk of {len(data)} bytes too large")
            crc = crc32c(data)
            if crc != c.chunk_crc32c:
                raise ProtocolError(f"{t.name}: chunk CRC-32C mismatch at offset {c.offset}")
            running = crc if filled == 0 else crc32c_combine(running, crc, len(data))
            payload[filled:filled + len(data)] = np.frombuffer(data, dtype=np.uint8)
            filled += len(data)
            if c.last:
                if filled != total:
                    raise ProtocolError(f"{t.name}: last chunk at {filled} of {total} bytes")
                if running != c.tensor_crc32c:
                    raise ProtocolError(f"{t.name}: tensor CRC-32C mismatch")
                break
        values = payload.view("<f4").reshape(shape)
        if not np.isfinite(values).all():
            raise ProtocolError(f"{t.name}: weights are not all finite")
        tensors.append(values)
    leftover = sum(1 for _ in it)
    if leftover:
        raise ProtocolError(f"{leftover} chunks after the last tensor")
    return tensors


def encode(values: np.ndarray, int8: bool) -> tuple:
    """A tensor's payload and the float32 values the coordinator will decode from it.

    Dense: the float32 values. int8 (``ENCODING_QUANTIZED``): a float32 scale
    s = max|x| / 127, then one int8 q = round(x / s) per value, decoded as s * q.
    """
    v = np.ascontiguousarray(values, dtype="<f4").ravel()
    if not int8:
        return v.tobytes(), v
    scale = (np.max(np.abs(v)) if v.size else np.float32(0)) / np.float32(127)
    if scale > 0:
        q = np.clip(np.rint(v / scale), -127, 127).astype(np.int8)
    else:
        q = np.zeros(v.size, dtype=np.int8)
    decoded = (scale * q.astype(np.float32)).astype(np.float32)
    return np.array([scale], dtype="<f4").tobytes() + q.tobytes(), decoded


def make_chunks(pb2, spec, payloads: Sequence[bytes], chunk_bytes: int,
                int8: bool) -> Iterator:
    """``TensorChunk`` messages for the tensors' payloads, as the contract says."""
    chunk_bytes = max(4, min(chunk_bytes & ~3, MAX_CHUNK_BYTES))
    encoding = pb2.ENCODING_QUANTIZED if int8 else pb2.ENCODING_DENSE
    for t, payload in zip(spec.tensors, payloads):
        view = memoryview(payload)
        total = len(payload)
        offset = 0
        running = 0
        while True:  # a zero-size tensor still sends one (empty, last) chunk
            data = bytes(view[offset:offset + chunk_bytes])
            crc = crc32c(data)
            running = crc if offset == 0 else crc32c_combine(running, crc, len(data))
            offset += len(data)
            last = offset == total
            yield pb2.TensorChunk(
                name=t.name, shape=list(t.shape), dtype=pb2.DTYPE_FLOAT32,
                encoding=encoding, total_bytes=total, offset=offset - len(data),
                data=data, chunk_crc32c=crc, last=last,
                tensor_crc32c=running if last else 0)
            if last:
                break
