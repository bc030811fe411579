#!/usr/bin/env bash
# A long run with clients coming and going (README, "Many clients"): a coordinator with
# --state_dir, $ROUNDS rounds (300) of mlp_2nn, 10 of 50 scripted clients a round
# (bench/swarm, 51 with the one that starts the run), where after every task a client
# leaves with probability $CHURN (0.1: its poll hangs up, a new client joins in its place)
# and every push is cut off after its first chunk with probability $KILL (0.05: the client
# was killed mid-push; it restarts naming its old identity, which the coordinator retires).
# The coordinator's RSS, open file descriptors and threads are read at every round; their
# slopes from round 50 on are printed. Then the coordinator is SIGKILLed and started again
# on its state directory, and its status is compared with the one before: same phase,
# same records. STATE_DIR=0 runs without a state directory (and without the kill and the
# resume: state_intact=na), to tell the run's memory from its saves'. Last line:
#   soak_rss_mib_per_100=<x> soak_fds_per_100=<x> soak_threads_per_100=<x>
#   rounds=<training rounds closed> abandoned=<attempts abandoned> state_intact=<0|1|na>
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
rounds="${ROUNDS:-300}"
churn="${CHURN:-0.1}"
kill="${KILL:-0.05}"
if [ ! -x "$build/server/fedlearn-coordinator" ]; then scripts/build.sh Release >/dev/null; fi
ninja -C "$build" fedlearn-coordinator swarm >/dev/null

tmp=$(mktemp -d)
state=(--state_dir="$tmp/state")
[ "${STATE_DIR:-1}" = 0 ] && state=()
source bench/coordinator.sh
start() {  # log
  start_coordinator "$1" --model=mlp_2nn --min_clients=51 --clients_per_round=10 \
    --eval_clients=10 --max_rounds="$rounds" --convergence_threshold=-inf \
    --round_timeout=30s "${state[@]}"
}

lscpu | grep -E '^Model name|^CPU\(s\)' | tr -s ' '
start "$tmp/coordinator.log"
"$build/bench/swarm" --coordinator="127.0.0.1:$port" --http_port="$http" \
  --coordinator_pid="$coordinator" --clients=50 --idle_seconds=1s --verify_every=10 \
  --churn="$churn" --kill_push="$kill" --sample_rounds --timeout=60m | tee "$tmp/swarm.txt" || true
before=$("$build/bench/swarm" --coordinator="127.0.0.1:$port" --status_only)
intact=na
if [ ${#state[@]} -gt 0 ]; then
  echo "state directory: $(du -sb "$tmp/state" | cut -f1) bytes ($(ls "$tmp/state" | tr '\n' ' '))"
  echo "before the kill: $before"
  stop_coordinator -9
  start "$tmp/coordinator-resumed.log"
  after=$("$build/bench/swarm" --coordinator="127.0.0.1:$port" --status_only)
  echo "resumed:         $after"
  # Clients join a resumed run anew; everything else must be as it was.
  intact=0
  [ "$(sed 's/ clients_joined=[0-9]*//' <<<"$before")" = "$(sed 's/ clients_joined=[0-9]*//' <<<"$after")" ] &&
    grep -q 'phase=PHASE_DONE' <<<"$after" && intact=1
else
  echo "run: $before"
fi
slopes=$(grep '^soak_slopes' "$tmp/swarm.txt" | cut -d' ' -f2- || true)
closed=$(grep -o 'training_[a-z]*=[0-9]*' <<<"$before" | grep -v abandoned |
  awk -F= '{ n += $2 } END { print n + 0 }')
abandoned=$(grep -o 'training_abandoned=[0-9]*' <<<"$before" | cut -d= -f2 || true)
echo "$(sed 's/\([a-z_0-9]*\)=/soak_\1=/g' <<<"$slopes") rounds=${closed:-0} abandoned=${abandoned:-0} state_intact=$intact"
