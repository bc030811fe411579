#!/usr/bin/python3
"""A flood of joins, to measure what the coordinator keeps per client record
(README, "Forgotten"): for SECONDS, Join is called with futures, 64 at a time,
from this one process on one connection (no client polls or heartbeats, so each
is gone after --client_timeout); then, WAIT seconds later, the coordinator's
RSS is read again.

  bench/join_flood.py ADDRESS COORDINATOR_PID [SECONDS=60] [WAIT=12]

Needs only Debian's python3-grpcio: the empty JoinRequest is sent as raw bytes.
"""
import sys
import time

import grpc


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main():
    address, pid = sys.argv[1], int(sys.argv[2])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 60
    wait = float(sys.argv[4]) if len(sys.argv) > 4 else 12
    join = grpc.insecure_channel(address).unary_unary("/fedlearn.v1.Coordinator/Join")
    before = rss_kb(pid)
    joined = errors = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for call in [join.future(b"", timeout=30) for _ in range(64)]:
            try:
                call.result()
                joined += 1
            except grpc.RpcError:
                errors += 1
    time.sleep(wait)
    after = rss_kb(pid)
    print(f"join_flood: {joined} joins ({joined / seconds:.0f}/s), {errors} errors; "
          f"coordinator RSS {before / 1024:.0f} MB before, {after / 1024:.0f} MB "
          f"{wait:.0f} s after")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
