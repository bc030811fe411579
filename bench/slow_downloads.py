#!/usr/bin/python3
"""Slow downloads against an async coordinator (README, "Slow clients"): N clients
join, one every INTERVAL seconds, and each reads its TRAIN weights one message a
second, each on its own connection whose receive window opens only as far as it
reads. While they read, something else must make new model versions (bench/
slow_downloads.sh runs bench/push_load beside it), so each starts on a version of
its own. Prints what the coordinator's /metrics said the downloads held (with
METRICS set to that URL, read every 0.25 s: the most, and once the last client has
read for a few seconds), its RSS growth by then, and how the downloads ended.

  [METRICS=http://HOST:PORT/metrics] bench/slow_downloads.py ADDRESS COORDINATOR_PID \
      [N=24] [INTERVAL=0.25]

Needs only Debian's python3-grpcio (the messages are encoded by hand, as in
bench/idle_cost.py).
"""
import os
import sys
import threading
import time
import urllib.request

import grpc

from idle_cost import strings, varint  # beside this script
from join_flood import rss_kb


def read_slowly(address, results, index, stop):
    channel = grpc.insecure_channel(address, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 64 << 10),
        ("grpc.max_receive_message_length", 4 << 20)])
    joined = strings(channel.unary_unary("/fedlearn.v1.Coordinator/Join")(b"", timeout=30))
    client_id, token = joined[1], joined[2]
    # RequestUpdateRequest{client_id (field 1), max_wait_ms (field 2) = 5 s}.
    request = b"\x0a" + varint(len(client_id)) + client_id + b"\x10" + varint(5000)
    stream = channel.unary_stream("/fedlearn.v1.Coordinator/RequestUpdate")(
        request, metadata=[("authorization", "Bearer " + token.decode())], timeout=120)
    messages = 0
    try:
        outcome = "finished"
        for _ in stream:
            messages += 1
            if stop.wait(1.0):
                outcome = "reading at the end"
                stream.cancel()
                break
        results[index] = (outcome, messages)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED and "moved on" in (e.details() or ""):
            results[index] = ("moved on", messages)
        elif e.code() == grpc.StatusCode.CANCELLED:
            results[index] = ("cut off", messages)
        else:
            results[index] = (f"{e.code().name}: {e.details()}", messages)
    channel.close()


def held_by_downloads(url):
    """(downloads, model versions they hold, MiB of those) from /metrics at `url`."""
    samples = {}
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            name, _, value = line.partition(" ")
            samples[name] = float(value) if name.startswith("fedlearn_download") else value
    return (int(samples["fedlearn_downloads"]), int(samples["fedlearn_download_versions"]),
            samples["fedlearn_download_version_bytes"] / 2**20)


def sample_held(url, peak, stop, failures):
    """Keeps in peak[0] the sample of /metrics holding the most, until `stop`;
    a scrape that fails goes into `failures`."""
    while not stop.wait(0.25):
        try:
            held = held_by_downloads(url)
        except Exception as e:  # reported at the end: the peak would be wrong
            failures.append(repr(e))
            continue
        if held[2] > peak[0][2]:
            peak[0] = held


def main():
    address, pid = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 24
    interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.25
    r0 = rss_kb(pid)
    results = [None] * n
    stop = threading.Event()
    threads = []
    url = os.environ.get("METRICS")
    peak = [(0, 0, 0.0)]
    sampled = threading.Event()
    failures = []
    if url:
        sampler = threading.Thread(target=sample_held, args=(url, peak, sampled, failures))
        sampler.start()
    for i in range(n):
        t = threading.Thread(target=read_slowly, args=(address, results, i, stop))
        t.start()
        threads.append(t)
        time.sleep(interval)
    time.sleep(5)
    r1 = rss_kb(pid)
    if url:
        sampled.set()
        sampler.join()
        if failures:
            print(f"{len(failures)} scrapes of /metrics failed, e.g. {failures[0]}")
        for when, (downloads, versions, mib) in (("at most", peak[0]),
                                                 ("at the end", held_by_downloads(url))):
            print(f"held {when}: {downloads} downloads holding {versions} model versions, "
                  f"{mib:.1f} MiB")
        print(f"slow_downloads_held_mib={peak[0][2]:.1f}")
    stop.set()
    for t in threads:
        t.join()
    ended = {}
    for outcome, _ in results:
        ended[outcome] = ended.get(outcome, 0) + 1
    ended_early = sorted(m for outcome, m in results if outcome in ("moved on", "cut off"))
    if ended_early:
        print(f"messages read by the downloads the coordinator ended: {ended_early}")
    print(f"slow_downloads: {n} slow readers, coordinator RSS {r0 / 1024:.1f} -> "
          f"{r1 / 1024:.1f} MiB (+{(r1 - r0) / 1024:.1f}); ended: " +
          ", ".join(f"{k} {v}" for k, v in sorted(ended.items())))


if __name__ == "__main__":
    main()
