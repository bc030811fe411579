#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: installs dependencies, builds Release,
# fetches the data, runs fedlearn-coordinator and N agents (one fedlearn-client process
# with --agents=N) until the run converges and the evaluation phase is done, then prints
# a summary; the last line is "final test accuracy: <percent>%".
#
# Options: --clients N (10), --partition iid|shards|dirichlet:A (iid),
#          --dataset mnist|fashion-mnist (mnist), --max_rounds R (30), --port P (free port),
#          --http_port P (dashboard; a free port), --mode rounds|async (rounds; async
#          applies each update as it arrives, at most R x N of them),
#          --convergence_threshold T (0.005: stop when the train loss improves by less),
#          --update_encoding dense|int8 (dense; int8 sends a quarter of the bytes)
# Exits non-zero if anything failed; leaves no process behind (also on Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."

clients=10 partition=iid dataset=mnist max_rounds=30 port=0 http_port=0 mode=rounds
threshold=0.005 encoding=dense
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) clients=$2; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --dataset) dataset=$2; shift 2 ;;
    --max_rounds) max_rounds=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --http_port) http_port=$2; shift 2 ;;
    --convergence_threshold) threshold=$2; shift 2 ;;
    --update_encoding)
      encoding=$2; shift 2
      [ "$encoding" = dense ] || [ "$encoding" = int8 ] ||
        { echo "demo.sh: --update_encoding is dense or int8" >&2; exit 2; } ;;
    --mode)
      mode=$2; shift 2
      [ "$mode" = rounds ] || [ "$mode" = async ] ||
        { echo "demo.sh: --mode is rounds or async" >&2; exit 2; } ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh
scripts/build.sh Release fedlearn-coordinator fedlearn-client >/dev/null
scripts/fetch-data.sh
build="${BUILD_DIR:-build}"
data="data/$dataset"
[ -d "$data" ] || { echo "demo.sh: no data set $data" >&2; exit 2; }
case "$mode" in
  rounds) updates=$max_rounds; progress="closed|training stopped|abandoned" ;;
  # In async mode every update is a round of the history: as much training as
  # max_rounds rounds of all clients, and one progress line per clients' worth.
  async) updates=$((max_rounds * clients)); progress="training stopped|applied" ;;
esac

logs=$(mktemp -d)
pids=()
cleanup() {
  local code=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$logs"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# All agents share this machine's cores and finish together, so the demo waits for all of
# them (--tolerance=0): with the default 0.3, the last three updates of every round would
# be computed and then turned away as late.
start=$(date +%s.%N)
"$build/server/fedlearn-coordinator" --port="$port" --bind=127.0.0.1 \
  --min_clients="$clients" --clients_per_round="$clients" --max_rounds="$updates" \
  --mode="$mode" --tolerance=0 --http_port="$http_port" --input_norm="$dataset" \
  --convergence_threshold="$threshold" \
  --round_timeout=10m --eval_timeout=10m 2>"$logs/coordinator.log" &
pids+=($!)
coordinator=$!
dashboard=
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on .* (port \([0-9]*\)).*/\1/p' "$logs/coordinator.log")
  dashboard=$(sed -n 's/.*dashboard on \(http[^ ]*\).*/\1/p' "$logs/coordinator.log")
  [ -n "$port" ] && { [ -n "$dashboard" ] || [ "$http_port" -lt 0 ]; } && break
  sleep 0.1
done
[ -n "$port" ] || { echo "demo.sh: the coordinator did not start:" >&2; cat "$logs/coordinator.log" >&2; exit 1; }
echo "coordinator on 127.0.0.1:$port ($mode mode); $clients agents, $partition partitions of $data"
[ -n "$dashboard" ] && echo "dashboard: $dashboard (live while the run lasts)"

"$build/client/fedlearn-client" --coordinator="127.0.0.1:$port" --data_dir="$data" \
  --partition="$partition" --agents="$clients" --update_encoding="$encoding" \
  2>"$logs/client.log" &
pids+=($!)
client=$!

# Per-round progress, as the coordinator closes rounds.
tail -n +1 -f "$logs/coordinator.log" --pid="$coordinator" 2>/dev/null |
  grep --line-buffered -E "$progress" |
  awk -v every="$([ "$mode" = async ] && echo "$clients" || echo 1)" \
    '/applied/ && ++n % every != 0 { next } { sub(/^[^ ]* /, ""); print; fflush() }' &
follower=$!

# Whichever ends first. The client ends after DONE, or when it failed: then the
# coordinator would wait for agents that never come back, so it is stopped.
coordinator_status=0
client_status=0
finished=""
first_status=0
wait -n -p finished "$coordinator" "$client" || first_status=$?
if [ "$finished" = "$client" ]; then
  client_status=$first_status
  [ "$client_status" -eq 0 ] || kill "$coordinator" 2>/dev/null || true
  wait "$coordinator" || coordinator_status=$?
else
  coordinator_status=$first_status
  wait "$client" || client_status=$?
fi
wait "$follower" 2>/dev/null || true
pids=()
end=$(date +%s.%N)

if [ "$coordinator_status" -ne 0 ] || [ "$client_status" -ne 0 ]; then
  echo "demo.sh: coordinator exited $coordinator_status, client exited $client_status" >&2
  tail -n 20 "$logs/coordinator.log" "$logs/client.log" >&2
  exit 1
fi
summary=$(grep -a "run done:" "$logs/coordinator.log" | tail -n 1 | sed 's/^.*run done: //')
accuracy=$(grep -a "evaluation closed" "$logs/coordinator.log" | tail -n 1 |
  sed -n 's/.* accuracy \([0-9.]*\) .*/\1/p')
[ -n "$accuracy" ] || { echo "demo.sh: the run ended without an evaluation" >&2; exit 1; }
awk -v s="$summary" -v a="$start" -v b="$end" 'BEGIN { printf "summary: %s; wall time %.1f s\n", s, b - a }'
awk -v a="$accuracy" 'BEGIN { printf "final test accuracy: %.2f%%\n", a * 100 }'
