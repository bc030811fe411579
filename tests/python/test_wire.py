"""fedlearn.wire: the chunked, checksummed tensor encoding, against hand-made cases."""

import ctypes.util
import unittest

import crc32c as software_crc32c
import numpy as np

from fedlearn import wire
from fedlearn.errors import ProtocolError
from fedlearn.v1 import coordinator_pb2 as pb2
from fedlearn.wire import (Reassembler, crc32c, crc32c_combine, encode, push_requests,
                           reassemble)


def make_chunks(s, payloads, chunk_bytes, int8=False):
    """The chunks of the requests push_requests serializes, parsed back by protobuf."""
    return [pb2.PushGradientRequest.FromString(r).chunk
            for r in push_requests(pb2, s, payloads, chunk_bytes, int8)]


def spec(*shapes):
    return pb2.ModelSpec(name="t", tensors=[
        pb2.TensorSpec(name=f"w{i}", shape=list(s), dtype=pb2.DTYPE_FLOAT32)
        for i, s in enumerate(shapes)])


def chunk_of_w0(offset, **fields):
    """An empty chunk at ``offset`` of tensor w0 (4 floats), as spec((4,)) has it."""
    return pb2.TensorChunk(name="w0", shape=[4], dtype=pb2.DTYPE_FLOAT32,
                           encoding=pb2.ENCODING_DENSE, total_bytes=16, offset=offset,
                           chunk_crc32c=crc32c(b""), **fields)


class WireTest(unittest.TestCase):
    def test_crc32c_check_value_and_continuation(self):
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)  # the standard check value
        self.assertEqual(crc32c(b"6789", crc32c(b"12345")), 0xE3069283)

    def test_isal_crc32c_agrees_with_the_software_one(self):
        # setup.sh installs libisal2; where it is, the SDK must be using it.
        if ctypes.util.find_library("isal") is None:
            self.skipTest("libisal2 is not installed")
        self.assertIsNotNone(wire._fast_crc32c)
        rng = np.random.default_rng(11)
        data = rng.integers(0, 256, 70000, dtype=np.uint8)
        view = memoryview(data)
        for start, end, value in ((0, 0, 0), (0, 9, 0), (3, 4, 0x12345678),
                                  (1, 65537, 0), (0, 70000, 0xFFFFFFFF), (17, 69999, 5)):
            self.assertEqual(wire._fast_crc32c(view[start:end], value),
                             software_crc32c.crc32c(data[start:end].tobytes(), value),
                             (start, end, value))

    def test_combined_crcs_equal_one_pass(self):
        rng = np.random.default_rng(7)
        data = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
        for cut in (0, 1, 3, 64, 2499, 4999, 5000):
            a, b = data[:cut], data[cut:]
            self.assertEqual(crc32c_combine(crc32c(a), crc32c(b), len(b)), crc32c(data),
                             cut)

    def test_dense_round_trip_in_chunks_of_every_size(self):
        s = spec((3, 5), (), (0,), (1000,))
        rng = np.random.default_rng(1)
        values = [rng.standard_normal(tuple(t.shape)).astype(np.float32)
                  for t in s.tensors]
        for chunk_bytes in (4, 12, 64, 1 << 20):
            payloads = [encode(v, False)[0] for v in values]
            chunks = make_chunks(s, payloads, chunk_bytes)
            got = reassemble(pb2, s, chunks)
            for want, have in zip(values, got):
                self.assertEqual(have.shape, want.shape)
                np.testing.assert_array_equal(have, want)
            # The zero-size tensor still has its one (empty, last) chunk.
            self.assertTrue(any(c.name == "w2" and c.last and not c.data for c in chunks))

    def test_framed_requests_parse_as_the_messages_protobuf_would_build(self):
        # Data of 4, 200 (a two-byte length) and 1 MiB (three bytes) per chunk, and a
        # name long enough that the chunk's fields alone pass 127 bytes.
        s = pb2.ModelSpec(name="t", tensors=[
            pb2.TensorSpec(name="x" * 150, shape=[1], dtype=pb2.DTYPE_FLOAT32),
            pb2.TensorSpec(name="b", shape=[50], dtype=pb2.DTYPE_FLOAT32),
            pb2.TensorSpec(name="w", shape=[2, 1 << 18], dtype=pb2.DTYPE_FLOAT32)])
        rng = np.random.default_rng(3)
        values = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in s.tensors]
        for int8 in (False, True):
            payloads = [encode(v, int8)[0] for v in values]
            requests = list(push_requests(pb2, s, payloads, 1 << 20, int8))
            self.assertEqual(len(requests), 4 if not int8 else 3)
            tensor = 0
            offset = 0
            for r in requests:
                parsed = pb2.PushGradientRequest.FromString(r)
                payload = bytes(memoryview(payloads[tensor]).cast("B"))
                data = payload[offset:offset + (1 << 20)]
                last = offset + len(data) == len(payload)
                want = pb2.PushGradientRequest(chunk=pb2.TensorChunk(
                    name=s.tensors[tensor].name, shape=s.tensors[tensor].shape,
                    dtype=pb2.DTYPE_FLOAT32,
                    encoding=pb2.ENCODING_QUANTIZED if int8 else pb2.ENCODING_DENSE,
                    total_bytes=len(payload), offset=offset, data=data,
                    chunk_crc32c=crc32c(data), last=last,
                    tensor_crc32c=crc32c(payload) if last else 0))
                self.assertEqual(parsed, want, (int8, tensor, offset))
                offset += len(data)
                if last:
                    tensor, offset = tensor + 1, 0
            self.assertEqual(tensor, len(s.tensors))

    def test_int8_decodes_within_half_a_step(self):
        x = np.array([-2.0, -0.5, 0.0, 0.25, 1.0], dtype=np.float32)
        payload, decoded = encode(x, True)
        self.assertEqual(len(payload), 4 + x.size)  # a scale, then one int8 each
        scale = np.frombuffer(payload[:4], "<f4")[0]
        self.assertAlmostEqual(float(scale), 2.0 / 127, places=7)
        q = np.frombuffer(payload[4:], np.int8)
        np.testing.assert_array_equal(decoded, scale * q.astype(np.float32))
        self.assertLessEqual(float(np.max(np.abs(decoded - x))), float(scale) / 2)
        zero_payload, zero = encode(np.zeros(3, np.float32), True)
        np.testing.assert_array_equal(zero, np.zeros(3, np.float32))

    def _chunks(self, s, values):
        return make_chunks(s, [encode(v, False)[0] for v in values], 8)

    def test_every_broken_chunk_is_named(self):
        s = spec((4,))
        good = self._chunks(s, [np.arange(4, dtype=np.float32)])
        cases = {
            "chunk CRC-32C mismatch": lambda c: c[0].__setattr__("data", b"\0" * 8),
            "offset": lambda c: c[1].__setattr__("offset", 0),
            "shape": lambda c: c[0].shape.__setitem__(0, 5),
            "expected a chunk of w0": lambda c: c[0].__setattr__("name", "other"),
            "tensor CRC-32C mismatch": lambda c: c[1].__setattr__("tensor_crc32c", 1),
            "ended before": lambda c: c.pop(),
            # Each chunk of a tensor with values holds a byte at least, and the
            # one that completes the tensor, only it, is marked last (as the C++
            # receiver checks).
            "empty chunk at offset 8": lambda c: c.insert(1, chunk_of_w0(8)),
            "completes the tensor but is not marked last": lambda c: (
                c[1].__setattr__("last", False),
                c.append(chunk_of_w0(16, last=True, tensor_crc32c=c[1].tensor_crc32c))),
        }
        for words, mutate in cases.items():
            chunks = [pb2.TensorChunk.FromString(c.SerializeToString()) for c in good]
            mutate(chunks)
            with self.assertRaises(ProtocolError) as e:
                reassemble(pb2, s, chunks)
            self.assertIn(words, str(e.exception))
            self.assertIn("w0", str(e.exception))

    def test_non_finite_weights_and_extra_chunks_are_refused(self):
        s = spec((2,))
        with self.assertRaisesRegex(ProtocolError, "not all finite"):
            reassemble(pb2, s, self._chunks(s, [np.array([1, np.nan], np.float32)]))
        extra = self._chunks(s, [np.ones(2, np.float32)]) * 2
        with self.assertRaisesRegex(ProtocolError, "after the last tensor"):
            reassemble(pb2, s, extra)

    def test_a_client_receives_every_round_into_the_same_buffers(self):
        s = spec((3, 5), (0,), (7,))
        buffers = Reassembler.buffers(s)
        self.assertEqual([b.nbytes for b in buffers], [60, 0, 28])
        rng = np.random.default_rng(3)
        for _ in range(2):  # a second model overwrites the first in place
            values = [rng.standard_normal(tuple(t.shape)).astype(np.float32)
                      for t in s.tensors]
            r = Reassembler(pb2, s, buffers)
            for c in self._chunks(s, values):
                self.assertFalse(r.complete)
                r.add(c)
            self.assertTrue(r.complete)
            self.assertEqual(r.received_bytes, 88)
            got = r.finish()
            for want, have, buffer in zip(values, got, buffers):
                np.testing.assert_array_equal(have, want)
                self.assertTrue(have.size == 0 or np.shares_memory(have, buffer))
        with self.assertRaisesRegex(ValueError, "w0: a buffer of 60 bytes, want 8"):
            Reassembler(pb2, spec((2,)), buffers)

    def test_dense_payload_is_a_view_of_the_values(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        payload, decoded = encode(x, False)
        self.assertEqual(bytes(payload), x.tobytes())
        self.assertTrue(np.shares_memory(decoded, x))


if __name__ == "__main__":
    unittest.main()
