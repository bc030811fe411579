#!/usr/bin/env bash
# What crashing agents cost a run (README, "Alive, ready, retired"). The same federation
# twice on this machine, one after the other: 10 fedlearn-client processes on IID shares
# of data/mnist, 10 a round, $ROUNDS rounds of the seed CNN, the coordinator's default round
# rules (tolerance 0.3, client timeout 20 s, round timeout 5 min):
#   fault-free   nobody dies;
#   churn        in every round 3 of the agents are SIGKILLed 0.3 s after it starts and
#                restarted 1 s later under new ids, with the session files they keep
#                (--session_dir): what the coordinator retires.
# SESSIONS=0 restarts them without their session files: then only the coordinator's own
# signs (a hung-up poll, missed heartbeats) tell it the old identities are dead.
# Prints each run's wall time from round 1's start to the last round's close, and its
# rounds by outcome. Last line: churn_wall_ratio=<churn / fault-free> abandoned=<rounds
# abandoned under churn> quorum=<rounds closed at quorum or all under churn>.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
rounds="${ROUNDS:-8}"
agents=10
if [ ! -x "$build/server/fedlearn-coordinator" ] || [ ! -x "$build/client/fedlearn-client" ]; then
  scripts/build.sh Release >/dev/null
fi
ninja -C "$build" fedlearn-coordinator fedlearn-client >/dev/null
[ -d data/mnist ] || scripts/fetch-data.sh >/dev/null

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Seconds since the epoch, as a decimal, from a coordinator log line's timestamp.
line_time() {
  /usr/bin/python3 -c 'import sys,datetime; print(datetime.datetime.fromisoformat(sys.argv[1].rstrip("Z")).timestamp())' "$1"
}

start_agent() {  # index run
  local session=(--session_dir="$tmp/$2/sessions")
  [ "${SESSIONS:-1}" = 0 ] && session=()
  "$build/client/fedlearn-client" --coordinator="127.0.0.1:$port" --data_dir=data/mnist \
    --partition=iid --num_partitions=$agents --partition_index="$1" --threads=1 \
    --name="agent$1" --progress=none "${session[@]}" \
    >>"$tmp/$2/agent$1.log" 2>&1 &
  agent_pid[$1]=$!
  disown $!  # killed on purpose: no job report
  pids+=($!)
}

run() {  # name churn(0|1)
  local name=$1 churn=$2 log
  mkdir -p "$tmp/$name"
  log="$tmp/$name/coordinator.log"
  "$build/server/fedlearn-coordinator" --port=0 --bind=127.0.0.1 --http_port=-1 \
    --model=mnist_cnn --min_clients=$agents --clients_per_round=$agents \
    --max_rounds="$rounds" --convergence_threshold=-inf --exit_on_done=false \
    >"$log" 2>&1 &
  local coordinator=$!
  pids+=($coordinator)
  port=""
  for _ in $(seq 100); do
    port=$(grep -o 'port [0-9]*)' "$log" | grep -o '[0-9]*' || true)
    [ -n "$port" ] && break
    sleep 0.1
  done
  agent_pid=()
  for i in $(seq 0 $((agents - 1))); do start_agent "$i" "$name"; done
  local round=1 seen=0
  while ! grep -q "round $rounds: closed\|round $rounds: attempt" "$log"; do
    if [ "$churn" = 1 ] && [ $round -le "$rounds" ] &&
       grep -q "round $round: training attempt 1 started" "$log"; then
      sleep 0.3
      local killed=()
      for k in 0 1 2; do killed+=($(( (round * 3 + k) % agents ))); done
      for i in "${killed[@]}"; do kill -9 "${agent_pid[$i]}" 2>/dev/null || true; done
      sleep 1
      for i in "${killed[@]}"; do start_agent "$i" "$name"; done
      round=$((round + 1))
    fi
    sleep 0.05
    seen=$((seen + 1))
    [ $seen -gt 12000 ] && { echo "churn: $name did not finish" >&2; tail "$log" >&2; exit 1; }
  done
  local first last
  first=$(grep -m1 "round 1: training attempt 1 started" "$log" | cut -d' ' -f1)
  last=$(grep -m1 "round $rounds: closed\|round $rounds: attempt" "$log" | cut -d' ' -f1)
  wall=$(/usr/bin/python3 -c "print(f'{$(line_time "$last") - $(line_time "$first"):.1f}')")
  closed=$(grep -c ': closed (quorum)\|: closed (all)' "$log" || true)
  abandoned=$(grep -c 'abandoned' "$log" || true)
  retired=$(grep -c ' retired: it joined again' "$log" || true)
  echo "$name: $rounds rounds in $wall s (round 1 start to round $rounds close); $closed closed" \
       "at quorum or all, $abandoned abandoned, $retired identities retired"
  grep -o 'round [0-9]*: closed ([a-z]*) with [0-9]* of [0-9]* updates in [0-9.]*s' "$log" | sed 's/^/  /'
  kill -9 "$coordinator" "${agent_pid[@]}" 2>/dev/null || true
  wait "$coordinator" 2>/dev/null || true
}

echo "== $agents agents, $agents a round, $rounds rounds of mnist_cnn ($(nproc) cores)"
run fault-free 0
free_wall=$wall
run churn 1
echo "churn_wall_ratio=$(/usr/bin/python3 -c "print(f'{$wall / $free_wall:.2f}')")" \
     "abandoned=$abandoned quorum=$closed"
