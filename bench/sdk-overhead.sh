#!/usr/bin/env bash
# The Python SDK's protocol overhead next to the C++ client's, on mnist_cnn (4.8 MB of
# weights each way per round) over loopback: a coordinator with one client and one
# client per round, $ROUNDS rounds (default 30, so that the first round's
# connection warm-up weighs a thirtieth of the means), training time excluded (the Python
# client's fit returns at once; the C++ side is bench/push_load's CoordinatorClient, the
# agent's RPC layer, which pushes a ready update, encoding it as the agent does:
# --encode_once=false). Per round: the poll's wait for its
# task (the coordinator closing the last round and opening the next), the download
# (task header to verified weights: chunks, CRC-32C per chunk and tensor) and the upload
# (header, go-ahead, chunks, reply) in seconds, and the transfers in MB/s, for both
# sides; the protocol's time per round is all three. Then one local epoch of the same
# model in PyTorch (800 examples at B=10, Adadelta, 1 thread) and the SDK's overhead
# as a share of it, and the SDK's codec alone (reassembly with its checks, encoding
# into chunks) without gRPC. Both clients push 1 MiB chunks.
# Last line: sdk_overhead_pct=<x> sdk_download_mbps=<x> sdk_upload_mbps=<x>
#            cpp_download_mbps=<x> cpp_upload_mbps=<x>
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
rounds="${ROUNDS:-30}"
tmp=$(mktemp -d)
coordinator_pid=""
cleanup() {
  [ -n "$coordinator_pid" ] && kill "$coordinator_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ninja -C "$build" fedlearn-coordinator push_load >/dev/null
venv="$tmp/venv"
bash tests/python/install_sdk.sh "$PWD/python" "$venv" >/dev/null
python="$venv/bin/python"
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; mnist_cnn, $rounds rounds"

start() {  # a coordinator for one client; sets port
  "$build/server/fedlearn-coordinator" --port=0 --bind=127.0.0.1 --http_port=-1 \
    --model=mnist_cnn --min_clients=1 --clients_per_round=1 --tolerance=0 \
    --max_rounds="$rounds" --convergence_threshold=-inf ${COORDINATOR_FLAGS:-} \
    2>"$tmp/coordinator.log" &
  coordinator_pid=$!
  port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/.*listening on .* (port \([0-9]*\)).*/\1/p' "$tmp/coordinator.log")
    [ -n "$port" ] && return 0
    sleep 0.1
  done
  cat "$tmp/coordinator.log" >&2
  exit 1
}

start
"$python" bench/sdk_overhead.py client "127.0.0.1:$port" >"$tmp/python.json"
wait "$coordinator_pid"; coordinator_pid=""
start
"$build/bench/push_load" --coordinator="127.0.0.1:$port" --clients=1 \
  --chunk_bytes=1048576 --encode_once=false --transfer_report | grep '^{' >"$tmp/cpp.json"
wait "$coordinator_pid"; coordinator_pid=""
"$python" bench/sdk_overhead.py epoch >"$tmp/epoch.json"
"$python" bench/sdk_overhead.py codec >"$tmp/codec.json"

"$python" - "$tmp/python.json" "$tmp/cpp.json" "$tmp/epoch.json" "$tmp/codec.json" <<'PY'
import json, sys
py, cpp, ep, codec = (json.load(open(p)) for p in sys.argv[1:5])
def side(name, report, rounds):
    wait_s = report["task_wait_seconds"]
    down_s, up_s = report["download_seconds"], report["upload_seconds"]
    down = report["bytes_received"] / down_s / 1e6
    up = report["bytes_sent"] / up_s / 1e6
    per_round = (wait_s + down_s + up_s) / rounds
    print(f"{name:<8} {per_round:>9.4f} s/round   task wait {1000 * wait_s / rounds:>6.1f} ms"
          f"   download {down:>7.0f} MB/s   upload {up:>7.0f} MB/s")
    return per_round, down, up
print(f"{'client':<8} {'protocol':>9}")
p_round, p_down, p_up = side("python", py, py["rounds_trained"])
c_round, c_down, c_up = side("c++", cpp, cpp["tasks"])
print("the SDK's codec alone (no gRPC), MB/s: " +
      ", ".join(f"{k[:-5].replace('_', ' ')} {v:.0f}" for k, v in codec.items()))
epoch = ep["epoch_seconds"]
pct = 100 * p_round / epoch
print(f"PyTorch epoch of mnist_cnn (800 examples, B=10, 1 thread): {epoch:.2f} s; the SDK's "
      f"protocol per round is {pct:.2f}% of it (C++ client: {100 * c_round / epoch:.2f}%)")
print(f"sdk_overhead_pct={pct:.2f} sdk_download_mbps={p_down:.0f} sdk_upload_mbps={p_up:.0f} "
      f"cpp_download_mbps={c_down:.0f} cpp_upload_mbps={c_up:.0f}")
PY
