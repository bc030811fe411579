#!/usr/bin/env bash
# Byzantine clients against each aggregation rule: 10 clients on data/mnist IID, all 10
# per round, 2 of them Byzantine (bench/byzantine_trainer.h: they train, then send
# -10 x their update, Gaussian noise of their update's norm, or +1 in every
# coordinate), for $ROUNDS rounds, for FedAvg and each robust strategy, next to the
# clean run (no Byzantine client). Reports the central test accuracy after the last
# round (bench/convergence's judge, the whole test split).
#
# Environment: BUILD_DIR (default build-bench), ROUNDS (default 20), MODEL (default
# mlp_2nn, the FedAvg paper's 2NN: 20 runs of 20 rounds in minutes; MODEL=mnist_cnn takes
# about 8 times longer), STRATEGIES, ATTACKS.
# Last line:
#   robust_worst_drop=<points> fedavg_worst_drop=<points>
# the best robust strategy's largest drop below clean FedAvg over the attacks, and
# FedAvg's own.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-bench}"
rounds="${ROUNDS:-20}"
model="${MODEL:-mlp_2nn}"
strategies="${STRATEGIES:-fedavg fedmedian fedtrimmedavg krum multikrum}"
attacks="${ATTACKS:-none signflip noise constant}"
python=/usr/bin/python3

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source bench/peers/setup.sh
source bench/peers/rounds.sh
require_data data/mnist
build_targets convergence
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $model, IID, 10 clients," \
  "2 Byzantine, $rounds rounds"

results="$tmp/results"
: >"$results"
for strategy in $strategies; do
  knobs=""
  # Krum and Multi-Krum are told how many clients may lie.
  case "$strategy" in krum | multikrum) knobs="num_byzantine: 2" ;; esac
  for attack in $attacks; do
    byzantine=2
    [ "$attack" = none ] && byzantine=0
    out="$tmp/$strategy-$attack"
    "${clean_env[@]}" "$build/bench/convergence" --data_dir=data/mnist --partition=iid \
      --clients=10 --model="$model" --rounds="$rounds" --target=1.01 --input_norm=mnist \
      --strategy="$strategy" --strategy_config="$knobs" --byzantine="$byzantine" \
      --attack="${attack/none/signflip}" >"$out.jsonl" 2>"$out.log" ||
      { tail -20 "$out.log" >&2; exit 1; }
    accuracy=$("$python" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if r.get("round", 0) > 0 and "test_accuracy" in r]
print("%.4f" % rows[-1]["test_accuracy"])' "$out.jsonl")
    echo "$strategy $attack $accuracy" | tee -a "$results"
  done
done

"$python" - "$results" "$attacks" <<'PY'
import sys
acc = {}
for line in open(sys.argv[1]):
    s, a, x = line.split()
    acc[(s, a)] = float(x) * 100
attacks = sys.argv[2].split()
strategies = list(dict.fromkeys(s for s, _ in acc))
print()
print("== final test accuracy (%), 2 of 10 clients Byzantine")
print("%-14s" % "strategy" + "".join("%10s" % a for a in attacks))
for s in strategies:
    print("%-14s" % s + "".join("%10.2f" % acc[(s, a)] for a in attacks))
clean = acc[("fedavg", "none")]
lies = [a for a in attacks if a != "none"]
def worst(s):
    return max(clean - acc[(s, a)] for a in lies)
robust = [s for s in strategies if s != "fedavg"]
best = min(robust, key=worst)
print(f"clean FedAvg {clean:.2f}%; best robust strategy {best} "
      f"(worst drop {worst(best):.2f} points)")
print(f"robust_worst_drop={worst(best):.2f} fedavg_worst_drop={worst('fedavg'):.2f}")
PY
