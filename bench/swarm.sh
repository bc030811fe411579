#!/usr/bin/env bash
# Ten thousand clients on two cores (README, "Many clients"). For each N in $SIZES and each
# model in $MODELS: a fresh coordinator (--min_clients=N+1, --clients_per_round=N/10,
# $ROUNDS rounds, --eval_clients=N/10, default timeouts), then bench/swarm: N simulated
# clients on the gRPC callback API, each on its own connection, join, poll and heartbeat
# idle for 42 s, renewing every long poll once (the coordinator's CPU and RSS measured),
# then one more joins and the rounds run: every selected client downloads the weights and
# pushes a small valid dense update at once, so that a round's time is the coordinator's
# coordination alone ($COORDINATOR_FLAGS:
# more flags for the coordinator, e.g. --grpc_memory=512MiB; $SWARM_FLAGS: for swarm, e.g.
# --clients_per_connection=3 where open files are capped below N). Prints swarm's
# report per run; last line:
#   swarm_n=<largest N with no error in any model's run (a download the coordinator cut
#   off as stalled is one)> rss_per_client_kb=<at that N>
#   round_overhead_s_1000=<median first-task-to-next-first-task of 1,000-client mlp_2nn
#   rounds>
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
sizes="${SIZES:-1000 10000}"
models="${MODELS:-mlp_2nn mnist_cnn}"
rounds="${ROUNDS:-4}"
if [ ! -x "$build/server/fedlearn-coordinator" ]; then scripts/build.sh Release >/dev/null; fi
ninja -C "$build" fedlearn-coordinator swarm >/dev/null
# A connection per client on both ends of loopback.
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"

tmp=$(mktemp -d)
source bench/coordinator.sh

lscpu | grep -E '^Model name|^CPU\(s\)' | tr -s ' '

# The kernel's TCP counters around a run. Both ends of every connection share this
# machine's TCP memory (net.ipv4.tcp_mem): when a round's downloads fill the clients'
# receive queues faster than swarm reads them, the kernel enters memory pressure, drops
# and retransmits, and may abort a connection; a run that did is not the coordinator's
# figure alone, and says so. Without pressure, most retransmissions on loopback are
# tail-loss probes: a receiver short of CPU acknowledges late, the sender probes, and the
# receiver reports the probe a duplicate (DSACK). Nothing was lost then.
tcp_counters() {  # each "Tcp:"/"TcpExt:" line of names is followed by one of values
  awk '$1 == "Tcp:" || $1 == "TcpExt:" {
         if (!($1 in names)) { names[$1] = $0; next }
         split(names[$1], name); for (i = 2; i <= NF; i++) v[name[i]] = $i }
       END { print v["TCPMemoryPressures"] + 0, v["RetransSegs"] + 0,
                   v["TCPAbortOnTimeout"] + 0, v["TCPRcvQDrop"] + 0,
                   v["TCPLossProbes"] + 0, v["TCPDSACKRecv"] + 0 }' \
    /proc/net/netstat /proc/net/snmp
}
tcp_report() {  # before after
  read -r p0 r0 a0 d0 l0 s0 <<<"$1"
  read -r p1 r1 a1 d1 l1 s1 <<<"$2"
  echo "kernel TCP during the run: memory pressure $((p1 - p0)) times, $((r1 - r0))" \
    "segments retransmitted, $((l1 - l0)) tail-loss probes sent, $((s1 - s0)) segments" \
    "reported back as duplicates (the first copy had arrived), $((d1 - d0)) receive-queue" \
    "drops, $((a1 - a0)) connections aborted on timeout"
}
# Extra flags, split on whitespace only (no globbing).
read -ra coordinator_flags <<<"${COORDINATOR_FLAGS:-}"
read -ra swarm_flags <<<"${SWARM_FLAGS:-}"
best_n=0 best_rss="" overhead_1000=""
first_model=$(echo $models | cut -d' ' -f1)
for n in $sizes; do
  held=1  # every model's run at this N without an error
  rss=""
  for model in $models; do
    start_coordinator "$tmp/coordinator-$n-$model.log" \
      --model="$model" --min_clients=$((n + 1)) --clients_per_round=$((n / 10)) \
      --eval_clients=$((n / 10)) --max_clients=$((n + 1)) --max_rounds="$rounds" \
      --convergence_threshold=-inf "${coordinator_flags[@]}"
    # A round of mnist_cnn at N = 10,000 sends 1,000 x 4.8 MB at once. With gRPC's
    # bandwidth-delay probing, each download's window grows to megabytes, and what swarm
    # has not read yet waits in the receive queues of this one kernel, whose TCP memory
    # (net.ipv4.tcp_mem) every client shares, where real clients each have their own:
    # memory pressure, drops, aborted connections. So its downloads keep gRPC's 64 KiB
    # window (README, "Many clients"). $SWARM_FLAGS come after and may say otherwise.
    model_flags=()
    if [ "$model" = mnist_cnn ]; then model_flags=(--bdp_probe=false); fi
    all_swarm_flags=("${model_flags[@]}" "${swarm_flags[@]}")
    echo "== N=$n $model ${COORDINATOR_FLAGS:+(coordinator: $COORDINATOR_FLAGS) }${all_swarm_flags[*]:+(swarm: ${all_swarm_flags[*]})}"
    out="$tmp/swarm-$n-$model.txt"
    status=0
    tcp_before=$(tcp_counters)
    "$build/bench/swarm" --coordinator="127.0.0.1:$port" --http_port="$http" \
      --coordinator_pid="$coordinator" --clients="$n" "${all_swarm_flags[@]}" | tee "$out" || status=$?
    # swarm counts a download cut off after its round moved on as late, which a download
    # cut off as stalled for --stall_timeout can look like from outside; the coordinator
    # counts those apart, and any is an error here.
    stalled=$(curl -s "http://127.0.0.1:$http/metrics" |
      sed -n 's/^fedlearn_downloads_cut_off_total{reason="stalled"} //p')
    stop_coordinator
    tcp_report "$tcp_before" "$(tcp_counters)"
    echo "downloads cut off as stalled (the coordinator's /metrics): ${stalled:-unknown}"
    result=$(grep '^swarm_result' "$out" || true)
    get() { echo "$result" | grep -o "$1=[^ ]*" | cut -d= -f2; }
    if [ "$status" != 0 ] || [ "$(get errors)" != 0 ] || [ "${stalled:-1}" != 0 ]; then
      held=0
    fi
    if [ "$model" = "$first_model" ]; then rss=$(get rss_per_client_kb); fi
    if [ "$n" = 10000 ] && [ "$model" = mlp_2nn ]; then overhead_1000=$(get round_overhead_s); fi
  done
  # N is held when no model's run had an error; the idle figure is the first model's.
  if [ "$held" = 1 ] && [ "$n" -gt "$best_n" ]; then best_n=$n best_rss=$rss; fi
done
echo "swarm_n=$best_n rss_per_client_kb=${best_rss:-na} round_overhead_s_1000=${overhead_1000:-na}"
