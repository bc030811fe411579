# Sourced by the benchmark scripts that run a coordinator as a process: start_coordinator
# LOG FLAGS... starts $build/server/fedlearn-coordinator on free ports (gRPC on 127.0.0.1,
# HTTP too) with FLAGS, its output in LOG, and sets `coordinator` (its pid), `port` and
# `http` once it listens; it is SIGKILLed when the script exits. Expects `build` and
# `tmp` (removed on exit) set.

coordinator=""
cleanup_coordinator() {
  [ -n "$coordinator" ] && kill -9 "$coordinator" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup_coordinator EXIT

start_coordinator() {  # log flags...
  local log=$1
  shift
  "$build/server/fedlearn-coordinator" --port=0 --bind=127.0.0.1 --http_port=0 \
    --exit_on_done=false "$@" >"$log" 2>&1 &
  coordinator=$!
  disown "$coordinator"  # stopped (or SIGKILLed) on purpose: no job report
  port="" http=""
  for _ in $(seq 100); do
    port=$(grep -o 'port [0-9]*)' "$log" | grep -o '[0-9]*' || true)
    http=$(grep -o 'dashboard on http://[0-9.]*:[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && [ -n "$http" ] && return 0
    sleep 0.1
  done
  cat "$log" >&2
  echo "the coordinator did not start" >&2
  exit 1
}

# Stops the coordinator (SIGKILL with `-9`) and waits until it is gone.
stop_coordinator() {
  kill "${1:--TERM}" "$coordinator" 2>/dev/null || true
  while kill -0 "$coordinator" 2>/dev/null; do sleep 0.05; done
  coordinator=""
}
