# Sourced by the observability tests: a real run (fedlearn-coordinator and one
# fedlearn-client process with several agents) on a slice of data/mnist, with helpers
# to read its HTTP side. Expects COORDINATOR, CLIENT, SOURCE_DIR and WORK set.
# Every process started here is stopped on exit.

python=/usr/bin/python3
skip() { echo "SKIPPED: $*" >&2; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

mkdir -p "$WORK"
live_pids=()
stop_all() {
  for pid in "${live_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${live_pids[@]}"; do wait "$pid" 2>/dev/null; done
  live_pids=()
}
trap stop_all EXIT

# A port nothing listens on right now.
free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_coordinator FLAGS...: sets GRPC_PORT and HTTP_PORT. It stays up after DONE.
start_coordinator() {
  local log="$WORK/coordinator.log"
  "$COORDINATOR" --port=0 --bind=127.0.0.1 --http_port=0 --exit_on_done=false "$@" \
    2>"$log" &
  live_pids+=($!)
  GRPC_PORT= HTTP_PORT=
  for _ in $(seq 200); do
    GRPC_PORT=$(sed -n 's/.*listening on .* (port \([0-9][0-9]*\)).*/\1/p' "$log")
    HTTP_PORT=$(sed -n 's/.*dashboard on http:[^ ]*:\([0-9][0-9]*\)\/.*/\1/p' "$log")
    [ -n "$GRPC_PORT" ] && [ -n "$HTTP_PORT" ] && return 0
    sleep 0.05
  done
  cat "$log" >&2
  fail "the coordinator did not start"
}

# start_agents N: N agents in one process, each on 1/20 of data/mnist's training split.
start_agents() {
  "$CLIENT" --coordinator="127.0.0.1:$GRPC_PORT" --data_dir="$SOURCE_DIR/data/mnist" \
    --agents="$1" --num_partitions=20 --threads=1 \
    2>"$WORK/client.log" &
  live_pids+=($!)
}

# status_field EXPR: evaluates a Python expression over the parsed /api/status (`s`),
# whose records list their clients (client_ids).
status_field() {
  curl -sf "http://127.0.0.1:$HTTP_PORT/api/status?client_ids=true" |
    "$python" -c "import json, sys; s = json.load(sys.stdin); print($1)"
}

# await_status EXPR SECONDS: waits until the Python condition over /api/status holds.
await_status() {
  local deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(status_field "$1" 2>/dev/null)" = True ] && return 0
    sleep 0.5
  done
  tail -n 20 "$WORK/coordinator.log" "$WORK/client.log" >&2
  fail "timed out waiting for: $1"
}

need_data() {
  [ -e "$SOURCE_DIR/data/mnist/train-labels-idx1-ubyte" ] ||
    [ -e "$SOURCE_DIR/data/mnist/train-labels-idx1-ubyte.gz" ] ||
    skip "data/mnist missing (scripts/fetch-data.sh)"
  command -v curl >/dev/null || skip "curl missing (scripts/setup.sh)"
}
