#!/usr/bin/env bash
# A real gRPC tool on the service: every `buf curl` line of the README's "Calling it
# from anywhere" runs, as written but for the port, against a live coordinator, through
# server reflection alone (scripts/buf.sh fetches a pinned buf from the npm registry).
#   buf_curl_test.sh COORDINATOR SOURCE_DIR WORK_DIR
# Exits 0 on success, 77 (skipped) when buf cannot be fetched, 1 on failure.
set -uo pipefail
COORDINATOR=$1 SOURCE_DIR=$2 WORK=$3
CLIENT=/bin/false
source "$(dirname "$0")/live_run.sh"

buf="$SOURCE_DIR/scripts/buf.sh"
"$buf" --version >/dev/null 2>"$WORK/buf.log" ||
  skip "buf could not be fetched: $(tail -1 "$WORK/buf.log")"
mapfile -t commands < <(grep -E '^buf curl ' "$SOURCE_DIR/README.md")
[ ${#commands[@]} -ge 5 ] || fail "the README shows ${#commands[@]} buf curl lines, want 5 or more"

mkdir -p "$WORK/bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$buf" >"$WORK/bin/buf"
chmod +x "$WORK/bin/buf"
start_coordinator --model=mlp_2nn --min_clients=5
# What each call must answer with, by what it asks.
expect_for() {
  case "$1" in
    *--list-services*) echo "fedlearn.v1.Coordinator grpc.health.v1.Health" ;;
    *--list-methods*) echo "fedlearn.v1.Coordinator/Join grpc.health.v1.Health/Check" ;;
    */GetStatus) echo '"phase": "PHASE_WAITING_FOR_CLIENTS"' ;;
    */Join) echo '"clientId": "client-' ;;
    */grpc.health.v1.Health/Check) echo '"status": "SERVING"' ;;
    *) echo "" ;;
  esac
}
for line in "${commands[@]}"; do
  command=${line//localhost:50051/127.0.0.1:$GRPC_PORT}
  want=$(expect_for "$line")
  [ -n "$want" ] || fail "no expectation for: $line"
  # The README's line, run by a shell as a user would, with buf from scripts/buf.sh.
  out=$(PATH="$WORK/bin:$PATH" eval "timeout 30 $command" 2>&1) || fail "$line: $out"
  case "$want" in
    '"'*) grep -qF -- "$want" <<<"$out" || fail "$line: no $want in: $out" ;;
    *) for w in $want; do grep -qxF -- "$w" <<<"$out" || fail "$line: no $w in: $out"; done ;;
  esac
  echo "ok: $line"
done
