#!/usr/bin/python3
"""What an idle client costs the coordinator, split in two (README, "Many
clients"): N clients join, each on its own connection, and the coordinator's
RSS is read; then each holds a RequestUpdate poll, and it is read again.

  bench/idle_cost.py ADDRESS COORDINATOR_PID [N=2000]

Run it against a coordinator that will not start a round (--min_clients above
N) with --max_clients of at least N. Needs only Debian's python3-grpcio: the
few fields sent are encoded by hand, and of the JoinResponse only its client id
and session token are read.
"""
import sys
import time

import grpc

from join_flood import rss_kb  # beside this script


def varint(v):
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def strings(message):
    """Field number -> value of the length-delimited fields; others skipped."""
    i, out = 0, {}
    while i < len(message):
        key, i = read_varint(message, i)
        wire = key & 7
        if wire == 2:
            n, i = read_varint(message, i)
            out[key >> 3] = message[i:i + n]
            i += n
        elif wire == 0:
            _, i = read_varint(message, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    return out


def main():
    address, pid = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    r0 = rss_kb(pid)
    clients = []
    for _ in range(n):
        channel = grpc.insecure_channel(address,
                                        options=[("grpc.use_local_subchannel_pool", 1)])
        joined = strings(channel.unary_unary("/fedlearn.v1.Coordinator/Join")(b"", timeout=30))
        clients.append((channel, joined[1], joined[2]))  # client_id, session_token
    time.sleep(3)
    r1 = rss_kb(pid)
    polls = []
    for channel, client_id, token in clients:
        # RequestUpdateRequest{client_id = 1, max_wait_ms = 2}: held 25 s.
        request = b"\x0a" + varint(len(client_id)) + client_id + b"\x10" + varint(25000)
        polls.append(channel.unary_stream("/fedlearn.v1.Coordinator/RequestUpdate")(
            request, metadata=[("authorization", "Bearer " + token.decode())], timeout=60))
    time.sleep(5)
    r2 = rss_kb(pid)
    for poll in polls:
        poll.cancel()
    print(f"idle_cost: {n} clients; a joined connection {(r1 - r0) / n:.1f} KiB, "
          f"its held poll {(r2 - r1) / n:.1f} KiB more, {(r2 - r0) / n:.1f} KiB in all")


if __name__ == "__main__":
    main()
