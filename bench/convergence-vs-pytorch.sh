#!/usr/bin/env bash
# Rounds to a target test accuracy, fedlearn next to an independent FedAvg simulation in
# PyTorch, on data/mnist (8,000 train / 2,000 test) with 10 clients, all 10 per round,
# E=1, B=10, Adadelta(lr $LEARNING_RATE, default 1.0, rho 0.95, eps 1e-7; each client
# keeps its optimizer state),
# FedAvg weighted by local train size:
#   fedlearn: bench/convergence.cc, a real in-process coordinator and 10 agents (threads,
#             1 compute thread each) training with the C++ CnnTrainer over gRPC;
#   PyTorch:  bench/peers/fedavg_pytorch.py, the clients one after another on 2 threads.
# Both use the same partition of the training split (client/partition.h, seed 1, written
# by convergence --partitions_out) and the same initial global weights (convergence
# --initial_out), and PyTorch trains the clients in the order fedlearn's coordinator sampled
# them; shuffling orders and dropout masks differ. The global model is judged after every
# round on all 2,000 test digits. The runs themselves: bench/peers/rounds.sh.
#   iid:    target 97% test accuracy, at most $ROUNDS_IID rounds (default 40)
#   shards: target $TARGET_SHARDS (default 95%), at most $ROUNDS_SHARDS rounds (default
#           60) - FedAvg paper's pathological non-IID split, most clients see 2 labels
# A side that does not reach the target reports its best accuracy and rounds run; its
# ratio is then a lower bound written ">x" or "<x" (or "n/a" if neither reached it).
#
# Environment: BUILD_DIR (default build-bench), ROUNDS_IID, ROUNDS_SHARDS, TARGET_SHARDS,
# PARTITIONS (default "iid shards"), INPUT_NORM (both sides' input scaling, as the
# coordinator's --input_norm; default mnist, the coordinator's own default, which
# standardises with the data set's pixel mean and std; none: p/255), LEARNING_RATE (both
# sides').
# Last line: rounds_ratio_iid=<x> rounds_ratio_shards=<x> time_ratio_iid=<x>
#   rounds ratio: fedlearn's rounds to target over PyTorch's;
#   time ratio:   PyTorch's training wall time to target over fedlearn's.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-bench}"
rounds_iid="${ROUNDS_IID:-40}"
rounds_shards="${ROUNDS_SHARDS:-60}"
target_shards="${TARGET_SHARDS:-0.95}"
learning_rate="${LEARNING_RATE:-1.0}"
partitions="${PARTITIONS:-iid shards}"
input_norm="${INPUT_NORM:-mnist}"
python=/usr/bin/python3  # Debian's torch is for Debian's python

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- Prerequisites: data, the peer's packages, convergence ------------------------------------
source bench/peers/setup.sh
source bench/peers/rounds.sh
require_data data/mnist
apt_install "$(basename "$0")" python3-torch libopenblas0-openmp
# The peer against hand-worked steps first (its optimizers, FedAvg's weighted mean).
"$python" bench/peers/fedavg_pytorch.py --self_test --partitions=-

build_targets convergence

# As in bench/train-vs-pytorch.sh: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow current
# OpenBLAS here; both sides run without them (in this script only).
echo "== OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>}" \
  "in this shell; both are UNSET for the fedlearn and the PyTorch commands below"

# --- Run both sides on each partition; prints the per-round tables ----------------------------
for part in $partitions; do
  fedlearn_flags=(--partition="$part" --clients=10)
  case "$part" in
    iid) run_rounds iid data/mnist 0.97 "$rounds_iid" --input_norm="$input_norm" \
      --learning_rate="$learning_rate" ;;
    shards) run_rounds shards data/mnist "$target_shards" "$rounds_shards" \
      --input_norm="$input_norm" --learning_rate="$learning_rate" ;;
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
  read -r rf rp tf tp _ <"$tmp/iid.result"
  rounds_ratio_iid=$(ratio "$rf" "$rp")
  time_ratio_iid=$(ratio "$tp" "$tf")
fi
if [ -e "$tmp/shards.result" ]; then
  read -r rf rp tf tp _ <"$tmp/shards.result"
  rounds_ratio_shards=$(ratio "$rf" "$rp")
fi
echo
echo "rounds_ratio_iid=$rounds_ratio_iid rounds_ratio_shards=$rounds_ratio_shards time_ratio_iid=$time_ratio_iid"
