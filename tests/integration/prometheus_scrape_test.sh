#!/usr/bin/env bash
# A real Prometheus server (Debian's prometheus) scrapes fedlearn-coordinator's /metrics
# every second during a real run (3 agents on a slice of data/mnist); queries through
# Prometheus' HTTP API must then return the run's completed rounds and accepted updates
# as /api/status reports them.
#
#   prometheus_scrape_test.sh COORDINATOR CLIENT SOURCE_DIR WORK_DIR
# Exits 0 on success, 77 (skipped) without prometheus or data/mnist, 1 on failure.
set -uo pipefail
COORDINATOR=$1 CLIENT=$2 SOURCE_DIR=$3 WORK=$4
source "$(dirname "$0")/live_run.sh"

prometheus=$(command -v prometheus) ||
  skip "prometheus missing (apt-get install prometheus, or scripts/setup.sh)"
need_data

start_coordinator --min_clients=3 --clients_per_round=3 --max_rounds=3 \
  --rounds_between_validations=1 --convergence_threshold=-inf

prom_port=$(free_port)
rm -rf "$WORK/tsdb"
cat >"$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: fedlearn
    static_configs:
      - targets: ["127.0.0.1:$HTTP_PORT"]
YAML
"$prometheus" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" 2>"$WORK/prometheus.log" &
live_pids+=($!)

# query PROMQL: the value of the query's first sample, or nothing.
query() {
  curl -sf --get "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" |
    "$python" -c '
import json, sys
r = json.load(sys.stdin)
if r["status"] == "success" and r["data"]["result"]:
    print(r["data"]["result"][0]["value"][1])'
}

# await_query PROMQL VALUE SECONDS
await_query() {
  local deadline=$((SECONDS + $3)) got=
  while [ $SECONDS -lt $deadline ]; do
    got=$(query "$1" 2>/dev/null)
    [ "$got" = "$2" ] && return 0
    sleep 0.5
  done
  tail -n 5 "$WORK/prometheus.log" >&2
  fail "Prometheus: $1 is '${got}', expected $2"
}

# Prometheus is up and scraping the coordinator before the run starts.
await_query 'up{job="fedlearn"}' 1 60
await_query 'fedlearn_phase{phase="waiting_for_clients"}' 1 30

start_agents 3
await_status 's["phase"] == "PHASE_DONE"' 180
rounds=$(status_field 'sum(1 for r in s["history"] if not r["evaluation"] and r["outcome"] != "abandoned")')
updates=$(status_field 'sum(r["responded"] for r in s["history"] if not r["evaluation"])')
[ "$rounds" -ge 3 ] || fail "only $rounds rounds completed"

await_query 'fedlearn_rounds_completed_total{job="fedlearn"}' "$rounds" 30
await_query 'fedlearn_updates_accepted_total' "$updates" 10
await_query 'fedlearn_phase{phase="done"}' 1 10
# The rounds were seen one by one while they ran, not only at the end.
changes=$(query 'changes(fedlearn_rounds_completed_total[10m])')
[ "${changes:-0}" -ge 2 ] || fail "scrapes saw the completed rounds change $changes times, expected >= 2"
echo "Prometheus: fedlearn_rounds_completed_total = $rounds, updates accepted = $updates"
