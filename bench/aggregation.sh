#!/usr/bin/env bash
# Aggregation benchmarks, in one run:
#  1. FedAvg fold throughput next to a plain streaming read of the same bytes
#     (Google Benchmark, bench/fedavg_bench.cc);
#  2. ingest: 100 clients pushing mnist_cnn (4.8 MB each) at once from another process
#     (bench/push_load.cc), in GB/s of updates received, verified and folded: in a run's
#     first round, which also pays the coordinator's first touch of its receive buffers,
#     and in its second (steady state); three runs of each, alternated, medians reported;
#  3. peak RSS of the coordinator during a round of the seed CNN (1.2M parameters,
#     4.8 MB) with 10 and with 100 clients pushing over gRPC at once from another process
#     (bench/push_load.cc), for each strategy in $STRATEGIES: the streaming ones should
#     stay flat from 10 to 100 clients (FedAdam and FedYogi add their two model-sized
#     state vectors, FedAvgM one), and a robust one is held to --aggregation_memory
#     (fedmedian@64MiB, krum@32MiB: that budget, the rest spilled).
# Last line: fold_vs_read=<ratio> ingest_gbps_first=<x> ingest_gbps_steady=<x>
#   rss_mb_10=<MB> rss_mb_100=<MB> (FedAvg), then
#   rss_<strategy>_10=<MB> rss_<strategy>_100=<MB> for each strategy.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
if [ ! -x "$build/bench/fedavg_bench" ] || [ ! -x "$build/server/fedlearn-coordinator" ]; then
  scripts/build.sh Release >/dev/null
fi
ninja -C "$build" fedavg_bench push_load fedlearn-coordinator >/dev/null

tmp=$(mktemp -d)
coordinator_pid=""
cleanup() {
  [ -n "$coordinator_pid" ] && kill "$coordinator_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== FedAvg fold vs streaming read (bytes of update data per second)"
"$build/bench/fedavg_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$tmp/fold.json" --benchmark_out_format=json
fold_vs_read=$(/usr/bin/python3 - "$tmp/fold.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
median = {r["run_name"]: r["bytes_per_second"] for r in runs if r.get("aggregate_name") == "median"}
read, fold = median["BM_StreamingRead"], median["BM_FedAvgFold"]
print(f"read {read/1e9:.1f} GB/s, fold {fold/1e9:.1f} GB/s", file=sys.stderr)
print(f"{fold / read:.2f}")
PY
)

# Runs a mnist_cnn coordinator (log $1, then its flags) and bench/push_load against it
# (push_load's flags after `--`); prints push_load's report line.
coordinator_and_load() {
  local log=$1
  shift
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  "$build/server/fedlearn-coordinator" --port=0 --bind=127.0.0.1 --http_port=0 --model=mnist_cnn \
    --tolerance=0 --round_timeout=5m --eval_timeout=5m --done_grace=30s "${flags[@]}" 2>"$log" &
  coordinator_pid=$!
  local port=""
  for _ in $(seq 1 100); do
    port=$(sed -n 's/.*listening on .* (port \([0-9]*\)).*/\1/p' "$log")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "coordinator did not start:" >&2; cat "$log" >&2; exit 1; }
  "$build/bench/push_load" --coordinator="127.0.0.1:$port" "$@"
  wait "$coordinator_pid"
  coordinator_pid=""
}

peak_rss() {  # clients strategy [flag...] -> peak RSS of the coordinator in MB
  local clients=$1 strategy=$2 log="$tmp/coordinator-$1-$2.log"
  shift 2
  coordinator_and_load "$log" --min_clients="$clients" --clients_per_round="$clients" \
    --max_rounds=1 --strategy="$strategy" --aggregation_spill_dir="$tmp" "$@" \
    -- --clients="$clients" >&2
  grep -o 'peak RSS [0-9.]* MB' "$log" | awk '{print $3}'
}

ingest() {  # warm-up rounds -> GB/s of the timed round
  local warmup=$1 line
  line=$(coordinator_and_load "$tmp/coordinator-ingest.log" --min_clients=100 \
    --clients_per_round=100 --max_rounds=$((warmup + 1)) --convergence_threshold=-inf \
    -- --clients=100 --warmup_rounds="$warmup")
  echo "$line" >&2
  echo "$line" | sed -n 's/.*(\([0-9.]*\) GB\/s).*/\1/p'
}
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "== Ingest: 100 clients x 4.8 MB at once, first round and second (steady state)"
first=() steady=()
for _ in 1 2 3; do
  first+=("$(ingest 0)")
  steady+=("$(ingest 1)")
done
ingest_first=$(median "${first[@]}")
ingest_steady=$(median "${steady[@]}")
echo "first round: ${first[*]} GB/s (median $ingest_first); second: ${steady[*]} GB/s (median $ingest_steady)"

strategies="${STRATEGIES:-fedavg fedprox fedavgm fedadam fedyogi fedadagrad fedmedian@64MiB krum@32MiB}"
echo "== Coordinator peak RSS, one round of mnist_cnn (4.8 MB), all clients pushing at once"
printf '%-16s %12s %13s %8s\n' strategy "10 clients" "100 clients" growth
last=""
for setting in $strategies; do
  name=${setting%@*}
  flags=()
  [ "$setting" != "$name" ] && flags=(--aggregation_memory="${setting#*@}")
  r10=$(peak_rss 10 "$name" "${flags[@]}")
  r100=$(peak_rss 100 "$name" "${flags[@]}")
  printf '%-16s %9s MB %10s MB %5.1f MB\n' "$setting" "$r10" "$r100" \
    "$(awk -v a="$r100" -v b="$r10" 'BEGIN { print a - b }')"
  if [ "$name" = fedavg ]; then rss10=$r10; rss100=$r100; fi
  key=$(echo "$setting" | tr '@' '_')
  last="$last rss_${key}_10=$r10 rss_${key}_100=$r100"
done
echo "fold_vs_read=${fold_vs_read} ingest_gbps_first=${ingest_first} ingest_gbps_steady=${ingest_steady} rss_mb_10=${rss10:-n/a} rss_mb_100=${rss100:-n/a}$last"
