#!/usr/bin/env bash
# What slow downloads hold in async mode (README, "Slow clients"): for each value V in
# $VERSIONS (default "0 4": no bound, the default, and four versions), an async
# mnist_cnn coordinator with --download_versions=V, two bench/push_load clients pushing
# all the time (a new model version per update), and bench/slow_downloads.py: $N (24)
# clients joining one every 0.25 s, each reading its weights one message a second. Prints
# the coordinator's RSS growth while they read and how their downloads ended.
# Model-sized buffers are given back to the system when freed (glibc's mmap threshold
# fixed at 1 MiB; by default it rises to the size of the blocks freed, and then freed
# models stay in the heap), so that RSS follows the models held rather than the most
# ever held.
# Last line: slow_downloads_rss_mb_<V>=<growth> for each V.
set -euo pipefail
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1048576
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
n="${N:-24}"
if [ ! -x "$build/server/fedlearn-coordinator" ]; then scripts/build.sh Release >/dev/null; fi
ninja -C "$build" fedlearn-coordinator push_load >/dev/null
tmp=$(mktemp -d)
source bench/coordinator.sh
load=""
trap '[ -n "$load" ] && kill "$load" 2>/dev/null; cleanup_coordinator' EXIT

lscpu | grep -E '^Model name|^CPU\(s\)' | tr -s ' '
last=""
for v in ${VERSIONS:-0 4}; do
  start_coordinator "$tmp/coordinator-$v.log" --mode=async --model=mnist_cnn \
    --min_clients=2 --max_rounds=100000000 --convergence_threshold=-inf \
    --download_versions="$v"
  # Pushes until killed: the timed round it would wait for never comes.
  "$build/bench/push_load" --coordinator="127.0.0.1:$port" --clients=2 \
    --warmup_rounds=100000000 >"$tmp/load-$v.log" 2>&1 &
  load=$!
  sleep 2
  echo "== --download_versions=$v"
  line=$(/usr/bin/python3 bench/slow_downloads.py "127.0.0.1:$port" "$coordinator" "$n")
  echo "$line"
  echo "model versions made: $(curl -s "http://127.0.0.1:$http/metrics" |
    sed -n 's/^fedlearn_rounds_completed_total //p')"
  kill "$load" 2>/dev/null || true
  wait "$load" 2>/dev/null || true
  load=""
  stop_coordinator -9
  growth=$(echo "$line" | sed -n 's/.*(+\([0-9.]*\)).*/\1/p')
  last="$last slow_downloads_rss_mb_$v=$growth"
done
echo "${last# }"
