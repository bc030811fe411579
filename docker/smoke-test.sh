#!/usr/bin/env bash
# Smoke test of the container image: builds it (docker/build.sh: docker where an engine
# answers, podman otherwise), starts the coordinator container on a network of its own
# with its state volume, checks grpc.health.v1 and the HTTP side, runs 3 agent
# containers (partitions 0..2 of 3) through a short run to DONE, checks the run's state
# in the volume, that both binaries stop at once with exit code 0 on SIGTERM (`stop`),
# that a new coordinator container on the volume resumes the finished run, and, with
# podman, loads docker/k8s/coordinator.yaml with `podman kube play` and checks its
# health.
# Everything it creates carries the label fedlearn-smoke=<run> and is removed on exit,
# success or failure. Prints the time of each phase.
#
# Usage: docker/smoke-test.sh [--skip-build]   (--skip-build: use the image as it is)
# Exit codes: 0 passed, 1 failed, 77 skipped (no engine that can run containers here).
set -euo pipefail
cd "$(dirname "$0")/.."
. docker/common.sh

skip_build=
case "${1:-}" in
  "") ;;
  --skip-build) skip_build=1 ;;
  *) echo "usage: docker/smoke-test.sh [--skip-build]" >&2; exit 2 ;;
esac

log() { echo "smoke-test: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

if ! pick_engine; then
  log "SKIPPED: neither docker nor podman is installed"
  exit 77
fi
engine() { "$ENGINE" "$@"; }
if ! engine info >/dev/null 2>&1; then
  log "SKIPPED: $ENGINE cannot run here ($ENGINE info fails)"
  exit 77
fi

run_id="$$-$(date +%s)"
prefix="fedlearn-smoke-$run_id"
label="fedlearn-smoke=$run_id"
net="$prefix-net"
vol="$prefix-state"
coord="$prefix-coordinator"
agents=3
kube_yaml=
logs="$(mktemp -d)"

cleanup() {
  local rc=$?
  # Any failure, whatever command's code ended the script, is exit code 1.
  [ "$rc" -eq 0 ] || rc=1
  if [ "$rc" -ne 0 ]; then
    local c
    for c in $(engine ps -a --filter "label=$label" --format '{{.Names}}' 2>/dev/null); do
      log "--- last lines of $c:"
      engine logs --tail 20 "$c" 2>&1 | sed 's/^/  /' >&2 || true
    done
  fi
  if [ -n "$kube_yaml" ]; then engine kube down "$kube_yaml" >/dev/null 2>&1 || true; fi
  local ids
  ids="$(engine ps -aq --filter "label=$label" 2>/dev/null || true)"
  # -v: with the anonymous volumes of VOLUME /var/lib/fedlearn.
  [ -z "$ids" ] || engine rm -f -v $ids >/dev/null 2>&1 || true
  engine network rm "$net" >/dev/null 2>&1 || true
  engine volume rm -f "$vol" >/dev/null 2>&1 || true
  # kube play's volume (named after the PersistentVolumeClaim, renamed below).
  engine volume rm -f "$prefix-kube-state" >/dev/null 2>&1 || true
  rm -rf "$logs"
  local left
  left="$(engine ps -aq --filter "label=$label" 2>/dev/null || true)"
  [ -z "$left" ] || log "warning: containers left behind: $left"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Milliseconds since the epoch, and a duration in ms as seconds ("12.3s").
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
seconds() { printf '%d.%ds' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); }
# Phase timings, listed at the end: "coordinator    4.2s".
phase_start() { phase_name="$1"; phase_t0="$(now_ms)"; log "phase $1 ..."; }
phase_end() {
  local dt=$(( $(now_ms) - phase_t0 ))
  timings+=("$(printf '%-12s %8s' "$phase_name" "$(seconds $dt)")")
  log "phase $phase_name: $(seconds $dt)"
}
timings=()
total_t0="$(now_ms)"

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 1
  done
}

# Stops container $1 (SIGTERM), prints how long that took; fails unless it exited 0
# within 5 seconds (engine stop would send SIGKILL after 10).
stop_promptly() {
  local t0 dt code
  t0="$(now_ms)"
  engine stop -t 10 "$1" >/dev/null
  dt=$(( $(now_ms) - t0 ))
  code="$(engine inspect --format '{{.State.ExitCode}}' "$1")"
  log "$2 stopped in $(seconds $dt) with exit code $code"
  [ "$code" -eq 0 ] || fail "$2 exited $code on SIGTERM, expected 0"
  [ "$dt" -lt 5000 ] || fail "$2 took $(seconds $dt) to stop on SIGTERM"
}

# --- build ---------------------------------------------------------------------------
if [ "$ENGINE" = podman ] && [ -z "$skip_build" ]; then
  # Timed on its own: debootstrap the first time, then nothing.
  phase_start base
  ensure_podman_base >/dev/null || fail "no base image"
  phase_end
fi
phase_start build
if [ -z "$skip_build" ]; then
  docker/build.sh >"$logs/build.log" 2>&1 || { tail -40 "$logs/build.log" >&2; fail "image build"; }
  grep -E '^(100% tests passed|[0-9]+% tests passed)|tests failed' "$logs/build.log" | tail -1 >&2 || true
fi
engine image inspect "$FEDLEARN_IMAGE" >/dev/null 2>&1 || fail "no image $FEDLEARN_IMAGE"
phase_end

# --- coordinator ------------------------------------------------------------------------
phase_start coordinator
engine network create --label "$label" "$net" >/dev/null
engine volume create --label "$label" "$vol" >/dev/null
# A short run: the 2NN model, 2 rounds of all 3 agents, then the evaluation. It stays up
# after DONE (--exit_on_done=false) so that the test can read the result and stop it.
# Starts the coordinator container named $1 on the state volume.
start_coordinator() {
  engine run -d --name "$1" --label "$label" --network "$net" \
    -v "$vol:/var/lib/fedlearn" -p 127.0.0.1::8080 -p 127.0.0.1::50051 \
    "$FEDLEARN_IMAGE" fedlearn-coordinator --port=50051 --http_port=8080 \
    --http_bind=0.0.0.0 --state_dir=/var/lib/fedlearn --model=mlp_2nn \
    --min_clients="$agents" --clients_per_round="$agents" --tolerance=0 --max_rounds=2 \
    --convergence_threshold=0 --rounds_between_validations=1 --round_timeout=120s \
    --eval_timeout=120s --exit_on_done=false >/dev/null
}
start_coordinator "$coord"
wait_for 30 engine exec "$coord" fedlearn-health --address=localhost:50051 --timeout=2s ||
  fail "coordinator not SERVING within 30s"
log "health in the container: $(engine exec "$coord" fedlearn-health --address=localhost:50051)"
coord_ip="$(engine inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$coord")"
[ -n "$coord_ip" ] || fail "no address for $coord on $net"
# From another container over the network, as the agents will connect.
log "health over $net: $(engine run --rm --label "$label" --network "$net" "$FEDLEARN_IMAGE" \
  fedlearn-health --address="$coord_ip:50051" --timeout=10s)" || fail "health over the network"
http_port="$(engine port "$coord" 8080 | head -1 | sed 's/.*://')"
status_url="http://127.0.0.1:$http_port/api/status"
wait_for 10 curl -fsS "$status_url" || fail "no $status_url"
metrics="$(curl -fsS "http://127.0.0.1:$http_port/metrics")" || fail "no /metrics"
grep -q '^fedlearn_round ' <<<"$metrics" || fail "no fedlearn_round in /metrics"
uid="$(engine exec "$coord" id -u)"
[ "$uid" -ne 0 ] || fail "the coordinator runs as root"
engine exec "$coord" sh -c 'test -w /var/lib/fedlearn' || fail "/var/lib/fedlearn not writable"
log "coordinator $coord_ip: uid $uid, /var/lib/fedlearn writable, HTTP on 127.0.0.1:$http_port"
phase_end

# --- agents -------------------------------------------------------------------------------
phase_start run
for i in $(seq 0 $((agents - 1))); do
  # The network has no DNS here (podman with CNI, no dnsname plugin): the name
  # "coordinator" comes from --add-host, so the agent's flags read as they would in
  # compose.
  engine run -d --name "$prefix-agent-$i" --label "$label" --network "$net" \
    --add-host "coordinator:$coord_ip" "$FEDLEARN_IMAGE" \
    fedlearn-client --coordinator=coordinator:50051 \
    --data_dir=/usr/share/fedlearn/data/mnist --partition=iid \
    --num_partitions="$agents" --partition_index="$i" --threads=1 --name="agent$i" >/dev/null
done
for i in $(seq 0 $((agents - 1))); do
  code="$(timeout 600 "$ENGINE" wait "$prefix-agent-$i" | tail -1)" || fail "agent $i still running after 600s"
  [ "$code" = 0 ] || fail "agent $i exited $code"
done
status="$(curl -fsS "$status_url")"
grep -q '"PHASE_DONE"' <<<"$status" || fail "coordinator not DONE: ${status:0:300}"
accuracy="$(echo "$status" | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
e = s.get("final_evaluation") or s.get("finalEvaluation") or {}
print("%.1f%%" % (100 * float(e.get("test_accuracy", 0))))' 2>/dev/null || echo '?')"
log "run DONE: 3 agents exited 0; final test accuracy $accuracy"
engine logs "$coord" 2>&1 | grep -E 'closed|stopped|evaluat' | tail -5 | sed 's/^/  /' >&2 || true
# The run's state in the volume.
state_files="$(engine exec "$coord" ls /var/lib/fedlearn)"
grep -q 'state' <<<"$state_files" || fail "no state in /var/lib/fedlearn: $state_files"
log "state in the volume: $(echo $state_files)"
run_id="$(/usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["run_id"])' <<<"$status")"
phase_end

# --- SIGTERM ------------------------------------------------------------------------------
phase_start sigterm
stop_promptly "$coord" "coordinator"
# An agent that keeps retrying an address where nobody answers, stopped the same way.
engine run -d --name "$prefix-agent-stop" --label "$label" --network "$net" \
  "$FEDLEARN_IMAGE" fedlearn-client --coordinator=127.0.0.1:1 \
  --data_dir=/usr/share/fedlearn/data/mnist >/dev/null
sleep 2
[ "$(engine inspect --format '{{.State.Running}}' "$prefix-agent-stop")" = true ] ||
  fail "the retrying agent did not keep running"
stop_promptly "$prefix-agent-stop" "agent"
phase_end

# --- resume -------------------------------------------------------------------------------
# A new coordinator container on the same volume takes the finished run back.
phase_start resume
start_coordinator "$coord-2"
wait_for 30 engine exec "$coord-2" fedlearn-health --address=localhost:50051 --timeout=2s ||
  fail "second coordinator not SERVING within 30s"
status2="$(curl -fsS "http://127.0.0.1:$(engine port "$coord-2" 8080 | head -1 | sed 's/.*://')/api/status")" ||
  fail "no /api/status from the second coordinator"
grep -q '"PHASE_DONE"' <<<"$status2" && grep -q "\"$run_id\"" <<<"$status2" ||
  fail "the second coordinator did not resume run $run_id: ${status2:0:300}"
log "a new container on the volume resumed run $run_id, DONE"
stop_promptly "$coord-2" "second coordinator"
phase_end

# --- kube play ------------------------------------------------------------------------------
if [ "$ENGINE" = podman ]; then
  phase_start kube-play
  # The coordinator's Deployment and volume claim as podman plays them (it leaves out
  # the Service); the image is the local one, the claim gets this run's name.
  kube_yaml="$logs/coordinator.yaml"
  sed -e "s|image: fedlearn:latest|image: $FEDLEARN_IMAGE|" \
      -e "s|fedlearn-state|$prefix-kube-state|g" docker/k8s/coordinator.yaml >"$kube_yaml"
  engine kube play --network "$net" "$kube_yaml" >"$logs/kube.log" 2>&1 ||
    { cat "$logs/kube.log" >&2; fail "podman kube play docker/k8s/coordinator.yaml"; }
  kube_coord="$(engine ps --filter pod=fedlearn-coordinator-pod-0 --format '{{.Names}}' |
    grep -v -- '-infra$' | head -1)"
  [ -n "$kube_coord" ] || { engine ps -a >&2; fail "no coordinator container from kube play"; }
  wait_for 30 engine exec "$kube_coord" fedlearn-health --address=localhost:50051 --timeout=2s ||
    fail "kube-played coordinator not SERVING within 30s"
  log "kube play: $kube_coord $(engine exec "$kube_coord" fedlearn-health --address=localhost:50051)"
  [ "$(engine exec "$kube_coord" id -u)" = 10001 ] || fail "kube play: not running as uid 10001"
  engine exec "$kube_coord" sh -c 'test -w /var/lib/fedlearn' ||
    fail "kube play: the claim's volume is not writable"
  engine kube down "$kube_yaml" >/dev/null
  kube_yaml=
  engine volume rm -f "$prefix-kube-state" >/dev/null
  phase_end
fi

log "PASSED with $ENGINE in $(seconds $(( $(now_ms) - total_t0 )))"
printf '  %s\n' "${timings[@]}" >&2
