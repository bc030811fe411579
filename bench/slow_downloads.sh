#!/usr/bin/env bash
# What slow downloads hold in async mode (README, "Slow clients"): for each value V in
# $VERSIONS (default "0 4": no bound, the default, and four versions), an async
# mnist_cnn coordinator with --download_versions=V, two bench/push_load clients pushing
# all the time (a new model version per update), and bench/slow_downloads.py: $N (24)
# clients joining one every 0.25 s, each reading its weights one message a second. Prints
# the most the downloads held while they read, as the coordinator's /metrics said it
# (fedlearn_download_version_bytes, read every 0.25 s), its RSS growth, and how the
# downloads ended. RSS is the heap's high-water mark, not what is held at the end: the
# coordinator keeps freed model-sized blocks for reuse, up to four models' worth and at
# least 64 MiB (KeepModelSizedBlocksOnTheHeap, server/main.cc).
# Last line: slow_downloads_held_mib_<V>=<most held> slow_downloads_rss_mb_<V>=<growth>
# for each V.
set -euo pipefail
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
  out=$(METRICS="http://127.0.0.1:$http/metrics" \
    /usr/bin/python3 bench/slow_downloads.py "127.0.0.1:$port" "$coordinator" "$n")
  echo "$out" | grep -v '^slow_downloads_held_mib='
  line=$(echo "$out" | grep '^slow_downloads:')
  held=$(echo "$out" | sed -n 's/^slow_downloads_held_mib=//p')
  echo "model versions made: $(curl -s "http://127.0.0.1:$http/metrics" |
    sed -n 's/^fedlearn_rounds_completed_total //p')"
  kill "$load" 2>/dev/null || true
  wait "$load" 2>/dev/null || true
  load=""
  stop_coordinator -9
  growth=$(echo "$line" | sed -n 's/.*(+\([0-9.]*\)).*/\1/p')
  last="$last slow_downloads_held_mib_$v=$held slow_downloads_rss_mb_$v=$growth"
done
echo "${last# }"
