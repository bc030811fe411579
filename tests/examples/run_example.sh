#!/usr/bin/env bash
# Runs one example client (examples/) against a fresh coordinator and checks its output.
#
#   run_example.sh COORDINATOR_BINARY SOURCE_DIR WORK_DIR KIND [CLIENT ARGS...]
#
# KIND: python | node-client | node-reflection. Starts
#   COORDINATOR_BINARY --port=0 --bind=127.0.0.1 --model=mlp_2nn --min_clients=1
#                      --clients_per_round=1
# reads the port from its "listening on ... (port N)" line, runs the example, checks
# what it printed and stops the coordinator. Exits 0 on success, 77 (ctest
# SKIP_RETURN_CODE) when the example's runtime is missing, 1 otherwise.
set -uo pipefail

[ $# -ge 4 ] || { echo "usage: $0 COORDINATOR_BINARY SOURCE_DIR WORK_DIR KIND [ARGS...]" >&2; exit 2; }
coordinator="$1" src="$2" work="$3" kind="$4"
shift 4
python=/usr/bin/python3

skip() { echo "SKIPPED: $*" >&2; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

mkdir -p "$work"

# --- The runtime ------------------------------------------------------------------------
case "$kind" in
  python)
    # The SDK, installed by the PythonSdkInstalls fixture (tests/python): its python.
    python="${FEDLEARN_PYTHON:-/usr/bin/python3}"
    [ -x "$python" ] || skip "$python not found"
    "$python" -c 'import fedlearn, numpy' 2>/dev/null ||
      skip "the Python SDK is not installed for $python (tests/python/install_sdk.sh)"
    ;;
  node-client | node-reflection)
    command -v node >/dev/null || skip "node not found (apt-get install nodejs)"
    if [ -d "$src/examples/node/node_modules/@grpc/grpc-js" ]; then
      modules="$src/examples/node/node_modules"
    else
      # Install the locked dependencies into the build tree (not the source tree),
      # once per package-lock.json; the lock serialises the node tests run with -j.
      deps="$work/../node-deps"
      mkdir -p "$deps"
      modules="$deps/node_modules"
      (
        flock 9
        if [ ! -d "$modules/@grpc/grpc-js" ] ||
           ! cmp -s "$src/examples/node/package-lock.json" "$deps/package-lock.json"; then
          command -v npm >/dev/null || { echo "SKIPPED: npm not found and examples/node/node_modules missing" >&2; exit 77; }
          cp "$src/examples/node/package.json" "$src/examples/node/package-lock.json" "$deps/"
          echo "npm ci in $deps" >&2
          timeout 40 npm ci --prefix "$deps" --no-audit --no-fund --loglevel=error --fetch-retries=1 --fetch-retry-maxtimeout=10000 >&2 ||
            { rm -f "$deps/package-lock.json"; echo "SKIPPED: npm ci failed (is the npm registry reachable?)" >&2; exit 77; }
        fi
      ) 9>"$deps/.lock"
      rc=$?
      [ $rc -eq 0 ] || exit $rc
    fi
    export NODE_PATH="$modules"
    ;;
  *) fail "unknown kind $kind" ;;
esac

# --- The coordinator --------------------------------------------------------------------
log="$work/coordinator.log"
"$coordinator" --port=0 --bind=127.0.0.1 --http_port=-1 --model=mlp_2nn --min_clients=1 \
  --clients_per_round=1 2>"$log" >&2 &
cpid=$!
cleanup() {
  kill "$cpid" 2>/dev/null
  wait "$cpid" 2>/dev/null
}
trap cleanup EXIT

port=
for _ in $(seq 200); do
  port=$(sed -n 's/.*listening on .* (port \([0-9][0-9]*\)).*/\1/p' "$log" | head -n1)
  [ -n "$port" ] && break
  kill -0 "$cpid" 2>/dev/null || { cat "$log" >&2; fail "the coordinator exited before listening"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log" >&2; fail "no 'listening on ... (port N)' line within 20 s"; }
echo "coordinator pid $cpid on 127.0.0.1:$port" >&2

# --- The example ------------------------------------------------------------------------
out="$work/output.txt"
case "$kind" in
  python)
    timeout 50 "$python" "$src/examples/python/client.py" --coordinator="127.0.0.1:$port" \
      --timeout=40 "$@" >"$out"
    ;;
  node-client)
    timeout 50 node "$src/examples/node/client.js" --coordinator="127.0.0.1:$port" \
      --timeout=40 "$@" >"$out"
    ;;
  node-reflection)
    timeout 50 node "$src/examples/node/reflection.js" --coordinator="127.0.0.1:$port" "$@" >"$out"
    ;;
esac
rc=$?
cat "$out"
if [ $rc -ne 0 ]; then
  echo "--- coordinator log" >&2; cat "$log" >&2
  fail "the $kind example exited with $rc"
fi

# --- Its output -------------------------------------------------------------------------
# The clients print JSON: the round they trained must be in the history, closed with
# one response out of one selected client.
check_history='
  const s = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const r = s.history.find((h) => Number(h.round) === Number(s.trained_round) && !h.evaluation);
  if (!r) { console.error("trained round " + s.trained_round + " not in the history"); process.exit(1); }
  if (Number(r.responded) !== 1 || Number(r.selected) !== 1 || !["all", "quorum"].includes(r.outcome)) {
    console.error("round " + r.round + ": selected " + r.selected + ", responded " + r.responded +
                  ", outcome " + r.outcome + "; want 1, 1, all|quorum");
    process.exit(1);
  }
  console.error("ok: round " + r.round + " closed (" + r.outcome + ") with " + r.responded + " response");'
check_history_py='
import json, sys
s = json.load(open(sys.argv[1]))
r = [h for h in s["history"] if int(h["round"]) == int(s["trained_round"]) and not h.get("evaluation")]
if not r: sys.exit("trained round %s not in the history" % s["trained_round"])
r = r[0]
if int(r["responded"]) != 1 or int(r["selected"]) != 1 or r["outcome"] not in ("all", "quorum"):
    sys.exit("round %s: selected %s, responded %s, outcome %s; want 1, 1, all|quorum"
             % (r["round"], r["selected"], r["responded"], r["outcome"]))
if int(r["bytes_received"]) != s["update_bytes"]:
    sys.exit("round %s received %s bytes; the client sent %s" % (r["round"], r["bytes_received"], s["update_bytes"]))
if s["model_verified"] is not True:
    sys.exit("the next round'"'"'s model was not checked against the update")
print("ok: round %s closed (%s) with %s response of %s bytes (%s); the next model is the old plus the update"
      % (r["round"], r["outcome"], r["responded"], s["update_bytes"], s["encoding"]), file=sys.stderr)
'
case "$kind" in
  python) "$python" -c "$check_history_py" "$out" || fail "unexpected output" ;;
  node-client) node -e "$check_history" "$out" || fail "unexpected output" ;;
  node-reflection)
    for want in \
      'fedlearn.v1.Coordinator' \
      'grpc.health.v1.Health' \
      'rpc Join ( .fedlearn.v1.JoinRequest ) returns ( .fedlearn.v1.JoinResponse );' \
      'rpc RequestUpdate ( .fedlearn.v1.RequestUpdateRequest ) returns ( stream .fedlearn.v1.TaskMessage );' \
      'rpc PushGradient ( stream .fedlearn.v1.PushGradientRequest ) returns ( .fedlearn.v1.PushGradientResponse );' \
      'rpc GetStatus ( .fedlearn.v1.GetStatusRequest ) returns ( .fedlearn.v1.GetStatusResponse );' \
      '"phase":"PHASE_WAITING_FOR_CLIENTS"' \
      '"model":"mlp_2nn"'; do
      grep -qF -- "$want" "$out" || fail "output lacks: $want"
    done
    echo "ok: reflection listed and described fedlearn.v1.Coordinator and called GetStatus" >&2
    ;;
esac
kill -0 "$cpid" 2>/dev/null || fail "the coordinator died during the run"
exit 0
