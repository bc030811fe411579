#!/usr/bin/env bash
# bench/swarm against a live coordinator, small: 30 simulated clients join, two rounds of
# 10 download the weights and push, 3 evaluate, all are told DONE. Every client verifies
# its download chunk by chunk (--verify_every=1), so the raw-message paths swarm uses
# (chunks read in place, pushes written from bytes serialized once) are held to the
# contract whenever the suite runs, not only when someone benchmarks.
#   swarm_test.sh COORDINATOR SWARM SOURCE_DIR WORK_DIR
set -uo pipefail
COORDINATOR=$1 SWARM=$2 SOURCE_DIR=$3 WORK=$4
CLIENT=/bin/false
source "$(dirname "$0")/live_run.sh"

start_coordinator --model=mlp_2nn --min_clients=31 --max_clients=31 --clients_per_round=10 \
  --eval_clients=3 --max_rounds=2 --convergence_threshold=-inf
out="$WORK/swarm.txt"
# Fails showing what swarm printed.
fail_showing_swarm() { cat "$out" "$WORK/swarm.log" >&2; fail "$1"; }
status=0
timeout 120 "$SWARM" --coordinator="127.0.0.1:$GRPC_PORT" --http_port="$HTTP_PORT" \
  --clients=30 --verify_every=1 --idle_seconds=1s --timeout=90s >"$out" 2>"$WORK/swarm.log" ||
  status=$?
[ "$status" = 0 ] || fail_showing_swarm "swarm exited with $status"
result=$(grep '^swarm_result' "$out") || fail_showing_swarm "no swarm_result line"
grep -q ' errors=0 ' <<<"$result" || fail_showing_swarm "errors: $result"
grep -q ' done=1' <<<"$result" || fail_showing_swarm "not every client was told DONE"
# Two rounds of 10 TRAIN downloads and 3 EVALUATE ones at least (more if a round were
# tried again), each verified whole.
verified=$(sed -n 's/.* \([0-9]*\) downloads verified chunk by chunk/\1/p' "$out")
[ "${verified:-0}" -ge 23 ] || fail_showing_swarm "only ${verified:-0} downloads verified"
rounds=$(status_field "len([r for r in s['history'] if r['outcome'] == 'quorum'])")
[ "$rounds" = 2 ] || fail "want 2 rounds closed at quorum, the history has $rounds"
echo "swarm: $result; $verified downloads verified"
