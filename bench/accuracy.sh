#!/usr/bin/env bash
# Test accuracy of the seed CNN (mnist_cnn) trained centrally, fedlearn next to PyTorch:
# 5 epochs, batch 10, Adadelta (lr 1.0, rho 0.95, eps 1e-7) on data/mnist (8,000 train /
# 2,000 test), evaluated on the test set after every epoch.
#   fedlearn: bench/central_train.cc, the client's own CnnTrainer (client/cnn_trainer.h)
#   PyTorch:  bench/peers/train_pytorch.py --mode=accuracy (Debian's python3-torch 1.13)
# Both start from the same initial weights (the registry's seeded Glorot-uniform
# initialisation, written by central_train --init_out and loaded by the peer), so the
# epoch-0 rows must agree; shuffling and dropout masks differ between the two.
#
# Usage: bench/accuracy.sh [--fashion] [--epochs N] [--batch_size B] [--threads T]
#                          [--input_norm preset|none|train|MEAN,STD] [--lr_decay G] [--seed S]
#   --fashion     also train on data/fashion-mnist (60,000 / 10,000; several minutes per side)
#   --input_norm  input scaling on both sides. preset (the default): what the coordinator's
#                 --input_norm puts in the plan for that data set (mnist 0.1307,0.3081;
#                 fashion-mnist 0.2860,0.3530); none: pixel / 255; train: the train
#                 split's own pixel mean and std; or MEAN,STD
#   --lr_decay    learning rate multiplier after every epoch on both sides (default 1)
#   --seed        initial weights, shuffling and dropout (default 1): single runs differ by
#                 a few tenths of a percent between seeds
# Environment: BUILD_DIR (default build-bench).
# Last line: fedlearn_acc=<x> pytorch_acc=<x> (final-epoch test accuracy on mnist).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-bench}"
python=/usr/bin/python3  # Debian's torch is for Debian's python

fashion=0 epochs=5 batch_size=10 threads=1 input_norm=preset lr_decay=1 seed=1
while [ $# -gt 0 ]; do
  case "$1" in
    --fashion) fashion=1 ;;
    --epochs) epochs=$2; shift ;;
    --batch_size) batch_size=$2; shift ;;
    --threads) threads=$2; shift ;;
    --input_norm) input_norm=$2; shift ;;
    --lr_decay) lr_decay=$2; shift ;;
    --seed) seed=$2; shift ;;
    *) echo "usage: $0 [--fashion] [--epochs N] [--batch_size B] [--threads T]" \
         "[--input_norm preset|none|train|MEAN,STD] [--lr_decay G] [--seed S]" >&2; exit 2 ;;
  esac
  shift
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- Prerequisites: data, the peer's packages, central_train ----------------------------------
datasets=(mnist)
[ "$fashion" -eq 1 ] && datasets+=(fashion-mnist)
for d in "${datasets[@]}"; do
  if [ ! -e "data/$d/train-labels-idx1-ubyte" ] && [ ! -e "data/$d/train-labels-idx1-ubyte.gz" ]; then
    echo "== data/$d missing: running scripts/fetch-data.sh"
    scripts/fetch-data.sh
  fi
done

source bench/peers/setup.sh
apt_install "$(basename "$0")" python3-torch libopenblas0-openmp

build_targets central_train

# As in bench/train-vs-pytorch.sh: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE slow current
# OpenBLAS here; both sides run without them (they affect the wall times, not accuracy).
echo "== OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are UNSET for both sides;" \
  "$threads thread(s) each; PyTorch loads the OpenMP build of OpenBLAS"

# --- Train both sides on one data set; prints the per-epoch table ---------------------------
# Leaves the final test accuracies in $tmp/<dataset>.final ("<fedlearn> <pytorch>").
compare() {
  local d=$1 norm=$input_norm
  if [ "$norm" = preset ]; then
    case "$d" in
      mnist) norm=0.1307,0.3081 ;;
      fashion-mnist) norm=0.2860,0.3530 ;;
    esac
  fi
  echo
  echo "== $d: $epochs epochs, batch $batch_size, Adadelta(lr=1.0, rho=0.95, eps=1e-7)," \
    "lr x$lr_decay per epoch, --input_norm=$norm"
  "${clean_env[@]}" "$build/bench/central_train" --data_dir="data/$d" --epochs="$epochs" \
    --batch_size="$batch_size" --threads="$threads" --seed="$seed" --init_out="$tmp/$d.init.f32" \
    --input_norm="$norm" --lr_decay="$lr_decay" \
    | tee "$tmp/$d.fedlearn.jsonl"
  "${peer_env[@]}" "$python" bench/peers/train_pytorch.py --mode=accuracy --data_dir="data/$d" \
    --epochs="$epochs" --batch_size="$batch_size" --threads="$threads" --seed="$seed" \
    --init_weights="$tmp/$d.init.f32" --input_norm="$norm" --lr_decay="$lr_decay" \
    | tee "$tmp/$d.pytorch.jsonl"
  "$python" - "$tmp/$d.fedlearn.jsonl" "$tmp/$d.pytorch.jsonl" "$tmp/$d.final" <<'PY'
import json, sys

def epochs(path):
    rows = [json.loads(line) for line in open(path)]
    return {r["epoch"]: r for r in rows if "epoch" in r}

fedlearn, pytorch, final_path = epochs(sys.argv[1]), epochs(sys.argv[2]), sys.argv[3]
print()
columns = f"{'test acc':>8} {'test loss':>9} {'train loss':>10} {'s':>5}"
print(f"{'':>5} | {'fedlearn':^{len(columns)}} | {'PyTorch':^{len(columns)}}")
print(f"{'epoch':>5} | {columns} | {columns}")
for e in sorted(fedlearn):
    cells = []
    for r in (fedlearn[e], pytorch[e]):
        train_loss = f"{r['train_loss']:.4f}" if "train_loss" in r else "-"
        seconds = f"{r['epoch_seconds']:.1f}" if "epoch_seconds" in r else "-"
        cells.append(f"{r['test_accuracy']:>8.4f} {r['test_loss']:>9.4f} {train_loss:>10} "
                     f"{seconds:>5}")
    print(f"{e:>5} | {cells[0]} | {cells[1]}")
# The shared premise: both sides start from the same weights, so before any
# training they evaluate the same network on the same test set (both print 4
# decimals: the loss is allowed their rounding and float summation). A layout or
# flatten-order mismatch in --init_weights would show here, and makes every
# row after it meaningless.
if 0 in fedlearn and 0 in pytorch:
    a, b = fedlearn[0], pytorch[0]
    if (abs(a["test_accuracy"] - b["test_accuracy"]) > 1e-4 or
            abs(a["test_loss"] - b["test_loss"]) > 2e-4 + 1e-4 * abs(a["test_loss"])):
        sys.exit(f"epoch 0 differs (fedlearn {a['test_accuracy']:.4f} / "
                 f"{a['test_loss']:.6f}, PyTorch {b['test_accuracy']:.4f} / "
                 f"{b['test_loss']:.6f}): the two sides did not start from the same "
                 "network")
else:
    sys.exit("no epoch-0 row on one side: cannot check the shared starting point")
last = max(fedlearn)
print(f"wall time: fedlearn {fedlearn[last]['wall_seconds']:.1f} s, "
      f"PyTorch {pytorch[last]['wall_seconds']:.1f} s")
with open(final_path, "w") as f:
    f.write(f"{fedlearn[last]['test_accuracy']:.4f} {pytorch[last]['test_accuracy']:.4f}\n")
PY
}

for d in "${datasets[@]}"; do compare "$d"; done
for d in "${datasets[@]}"; do
  read -r f p <"$tmp/$d.final"
  echo "$d final test accuracy: fedlearn $f, PyTorch $p"
done
read -r fedlearn_acc pytorch_acc <"$tmp/mnist.final"
echo "fedlearn_acc=$fedlearn_acc pytorch_acc=$pytorch_acc"
