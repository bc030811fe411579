#!/usr/bin/env bash
# Rounds to a target test accuracy, fedlearn next to an independent FedAvg simulation in
# PyTorch, on data/mnist (8,000 train / 2,000 test) with 10 clients, all 10 per round,
# E=1, B=10, Adadelta(lr 1.0, rho 0.95, eps 1e-7; each client keeps its optimizer state),
# FedAvg weighted by local train size:
#   fedlearn: bench/convergence.cc, a real in-process coordinator and 10 agents (threads,
#             1 compute thread each) training with the C++ CnnTrainer over gRPC;
#   PyTorch:  bench/peers/fedavg_pytorch.py, the clients one after another on 2 threads.
# Both use the same partition of the training split (common/partition.h, seed 1, written
# by convergence --partitions_out) and the same initial global weights (convergence
# --initial_out); shuffling orders and dropout masks differ. The global model is judged
# after every round on all 2,000 test digits.
#   iid:    target 97% test accuracy, at most $ROUNDS_IID rounds (default 40)
#   shards: target 95%, at most $ROUNDS_SHARDS rounds (default 60) - FedAvg paper's
#           pathological non-IID split, most clients see 2 labels
# A side that does not reach the target reports its best accuracy and rounds run; its
# ratio is then a lower bound written ">x" or "<x" (or "n/a" if neither reached it).
#
# Environment: BUILD_DIR (default build-bench), ROUNDS_IID, ROUNDS_SHARDS, PARTITIONS
# (default "iid shards").
# Last line: rounds_ratio_iid=<x> rounds_ratio_shards=<x> time_ratio_iid=<x>
#   rounds ratio: fedlearn's rounds to target over PyTorch's;
#   time ratio:   PyTorch's training wall time to target over fedlearn's.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-bench}"
rounds_iid="${ROUNDS_IID:-40}"
rounds_shards="${ROUNDS_SHARDS:-60}"
partitions="${PARTITIONS:-iid shards}"
python=/usr/bin/python3  # Debian's torch is for Debian's python

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- Prerequisites: data, the peer's packages, convergence ------------------------------------
if [ ! -e data/mnist/train-labels-idx1-ubyte ] && [ ! -e data/mnist/train-labels-idx1-ubyte.gz ]; then
  echo "== data/mnist missing: running scripts/fetch-data.sh"
  scripts/fetch-data.sh
fi

source bench/peers/setup.sh
apt_install python3-torch libopenblas0-openmp

build_targets convergence

# As in bench/train-vs-pytorch.sh: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow current
# OpenBLAS here; both sides run without them (in this script only).
echo "== OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>}" \
  "in this shell; both are UNSET for the fedlearn and the PyTorch commands below"

# --- Run both sides on one partition; prints the per-round table ------------------------------
# Leaves "<rounds_f> <rounds_p> <time_f> <time_p>" in $tmp/<partition>.result ("-" for a
# side that missed the target).
compare() {
  local part=$1 target=$2 rounds=$3
  echo
  echo "== $part: target $target, at most $rounds rounds; fedlearn (coordinator + 10 agents," \
    "logs in $tmp/$part.fedlearn.log while running)"
  "${clean_env[@]}" "$build/bench/convergence" --data_dir=data/mnist --partition="$part" \
    --clients=10 --rounds="$rounds" --target="$target" \
    --partitions_out="$tmp/$part.partitions.json" --initial_out="$tmp/$part.initial.safetensors" \
    2>"$tmp/$part.fedlearn.log" | tee "$tmp/$part.fedlearn.jsonl" ||
    { tail -20 "$tmp/$part.fedlearn.log" >&2; exit 1; }
  echo "== $part: PyTorch (same partition and initial weights)"
  "${peer_env[@]}" "$python" bench/peers/fedavg_pytorch.py --data_dir=data/mnist \
    --partitions="$tmp/$part.partitions.json" --initial="$tmp/$part.initial.safetensors" \
    --rounds="$rounds" --target="$target" --threads=2 | tee "$tmp/$part.pytorch.jsonl"
  "$python" - "$tmp/$part.fedlearn.jsonl" "$tmp/$part.pytorch.jsonl" "$target" \
    "$tmp/$part.result" <<'PY'
import json, sys

def rounds(path):
    rows = [json.loads(line) for line in open(path)]
    return {r["round"]: r for r in rows if "test_accuracy" in r}

f, p, target, out = rounds(sys.argv[1]), rounds(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print()
print(f"{'round':>5} | {'fedlearn acc':>12} {'s':>7} | {'PyTorch acc':>11} {'s':>7}")
for n in range(max(max(f), max(p)) + 1):
    cells = []
    for side in (f, p):
        r = side.get(n)
        cells.append((f"{r['test_accuracy']:.4f}", f"{r['seconds_since_start']:.1f}")
                     if r else ("-", "-"))
    print(f"{n:>5} | {cells[0][0]:>12} {cells[0][1]:>7} | {cells[1][0]:>11} {cells[1][1]:>7}")
summary = []
for name, side in (("fedlearn", f), ("PyTorch", p)):
    hit = [n for n in sorted(side) if n > 0 and side[n]["test_accuracy"] >= target]
    last = max(side)
    best = max(side.values(), key=lambda r: r["test_accuracy"])
    if hit:
        n = hit[0]
        print(f"{name}: reached {target:.2f} at round {n} after "
              f"{side[n]['seconds_since_start']:.1f} s; final accuracy "
              f"{side[last]['test_accuracy']:.4f}")
        summary += [str(n), f"{side[n]['seconds_since_start']:.2f}"]
    else:
        print(f"{name}: did NOT reach {target:.2f} in {last} rounds; best accuracy "
              f"{best['test_accuracy']:.4f} (round {best['round']}), final "
              f"{side[last]['test_accuracy']:.4f}, {side[last]['seconds_since_start']:.1f} s")
        summary += [f"-{last}", "-"]
with open(out, "w") as fh:
    fh.write(" ".join(summary[0::2] + summary[1::2]) + "\n")
PY
  grep '"event":"stopped"' "$tmp/$part.fedlearn.jsonl" | sed 's/^/fedlearn /'
}

for part in $partitions; do
  case "$part" in
    iid) compare iid 0.97 "$rounds_iid" ;;
    shards) compare shards 0.95 "$rounds_shards" ;;
    *) echo "PARTITIONS: iid and/or shards" >&2; exit 2 ;;
  esac
done

# --- The ratios -------------------------------------------------------------------------------
# A negative round count "-N" means the side stopped after N rounds without reaching the
# target: a ratio with it is a bound (fedlearn missing: ">"; PyTorch missing: "<").
ratio() {  # ratio NUMERATOR DENOMINATOR
  awk -v a="$1" -v b="$2" 'BEGIN {
    if (a == "" || b == "" || a == "-" || b == "-") { print "n/a"; exit }
    if (a < 0 && b < 0) { print "n/a"; exit }
    if (a < 0) { printf ">%.2f\n", -a / b; exit }
    if (b < 0) { printf "<%.2f\n", a / -b; exit }
    printf "%.2f\n", a / b }'
}
rounds_ratio_iid=n/a rounds_ratio_shards=n/a time_ratio_iid=n/a
if [ -e "$tmp/iid.result" ]; then
  read -r rf rp tf tp <"$tmp/iid.result"
  rounds_ratio_iid=$(ratio "$rf" "$rp")
  time_ratio_iid=$(ratio "$tp" "$tf")
fi
if [ -e "$tmp/shards.result" ]; then
  read -r rf rp tf tp <"$tmp/shards.result"
  rounds_ratio_shards=$(ratio "$rf" "$rp")
fi
echo
echo "rounds_ratio_iid=$rounds_ratio_iid rounds_ratio_shards=$rounds_ratio_shards time_ratio_iid=$time_ratio_iid"
