#!/usr/bin/env bash
# Server strategies on data/mnist, 10 clients, all 10 per round, E=1, B=10, Adadelta
# (lr 1, each client keeps its state unless the setting resets it), for the IID split and
# the FedAvg paper's pathological `shards` split: rounds to 97% test accuracy (IID) and to
# 95% (shards), and the best accuracy within $ROUNDS rounds, each next to the PyTorch peer
# (bench/peers/fedavg_pytorch.py) running the same server update, written on its own from
# the papers (its --self_test checks it against hand-worked steps first), on the same
# partition, from the same initial weights, replaying fedlearn's sampled clients.
#
# Each setting is "NAME|KNOBS|FLAGS": --strategy=NAME, --strategy_config=KNOBS, and extra
# flags: --reset_client_optimizer (fedlearn's, which the peer follows) or client-plan
# flags both sides take (--epochs, --batch_size, --optimizer, --learning_rate). The
# defaults row of each strategy uses its documented defaults; the last three are FedAvg
# with clients resetting their optimizer each round, and the best settings found on
# shards: clients on plain SGD at lr 0.05 for E=2 (no optimizer state carried between
# rounds) under FedAdagrad and under FedAvgM (the sweep is in the README, Results).
#
# Environment: BUILD_DIR (default build-bench), ROUNDS (default 100), PARTITIONS (default
# "iid shards"), SETTINGS (one setting a line, default below), PEER=0 to run fedlearn only.
# Last line:
#   strategy_rounds_shards_best=<n> fedavg_rounds_shards=<n or -best%>
#   ratio_<setting>_<partition>=<fedlearn rounds / PyTorch rounds> ...
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-bench}"
rounds="${ROUNDS:-100}"
partitions="${PARTITIONS:-iid shards}"
python=/usr/bin/python3  # Debian's torch is for Debian's python
default_settings='fedavg||
fedprox||
fedavgm||
fedadam||
fedyogi||
fedadagrad||
fedavg||--reset_client_optimizer
fedadagrad||--epochs=2 --optimizer=sgd --learning_rate=0.05
fedavgm||--epochs=2 --optimizer=sgd --learning_rate=0.05'
settings="${SETTINGS:-$default_settings}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source bench/peers/setup.sh
source bench/peers/rounds.sh
require_data data/mnist
if [ "${PEER:-1}" != 0 ]; then
  apt_install "$(basename "$0")" python3-torch libopenblas0-openmp
  "$python" bench/peers/fedavg_pytorch.py --self_test --partitions=-
fi
build_targets convergence
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
  "OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset for both sides"

summary="$tmp/summary"
: >"$summary"
n=0
while IFS='|' read -r name knobs flags; do
  [ -n "$name" ] || continue
  n=$((n + 1))
  label="s$n-$name"
  for part in $partitions; do
    case "$part" in
      iid) target=0.97 ;;
      shards) target=0.95 ;;
      *) echo "PARTITIONS: iid and/or shards" >&2; exit 2 ;;
    esac
    # FLAGS go to both sides (the client plan: --epochs, --batch_size, --optimizer,
    # --learning_rate), but --reset_client_optimizer, which the peer takes from
    # fedlearn's start line.
    shared=()
    fedlearn_flags=(--partition="$part" --clients=10 --strategy="$name"
                    --strategy_config="$knobs")
    for word in $flags; do
      case "$word" in
        --reset_client_optimizer*) fedlearn_flags+=("$word") ;;
        *) shared+=("$word") ;;
      esac
    done
    run_rounds "$label-$part" data/mnist "$target" "$rounds" --input_norm=mnist \
      ${shared[@]+"${shared[@]}"}
    best=$("$python" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
acc = [r["test_accuracy"] for r in rows if "test_accuracy" in r and r["round"] > 0]
hit = [r["round"] for r in rows if r.get("test_accuracy", 0) >= float(sys.argv[2]) and r["round"] > 0]
print(hit[0] if hit else -len(acc), "%.4f" % max(acc))' "$tmp/$label-$part.fedlearn.jsonl" "$target")
    peer="- -"
    if [ -e "$tmp/$label-$part.result" ]; then
      read -r _ rp _ _ _ bp _ <"$tmp/$label-$part.result"
      peer="$rp $bp"
    fi
    echo "$n $name $part $best $peer ${knobs:-defaults} ${flags}" >>"$summary"
  done
done <<<"$settings"

echo
echo "== rounds to target (97% IID, 95% shards; -N: not reached in N rounds) and best accuracy"
printf '%-3s %-11s %-7s %9s %8s %9s %8s  %s\n' "#" strategy split fedlearn best PyTorch best setting
while read -r i name part rf bf rp bp rest; do
  printf '%-3s %-11s %-7s %9s %8s %9s %8s  %s\n' "$i" "$name" "$part" "$rf" "$bf" "$rp" "$bp" "$rest"
done <"$summary"

# The last line: the best shards result of any setting, FedAvg's at its defaults, and
# each (setting, split)'s rounds over the peer's (n/a where either missed the target).
"$python" - "$summary" <<'PY'
import sys
rows = [line.split() for line in open(sys.argv[1])]
shards = [r for r in rows if r[2] == "shards"]
reached = [int(r[3]) for r in shards if int(r[3]) > 0]
best = min(reached) if reached else "none"
fedavg = [r for r in shards if r[1] == "fedavg"]
fa = fedavg[0][3] if fedavg else "n/a"
if fedavg and int(fa) < 0:
    fa = "-" + fedavg[0][4]
ratios = []
for r in rows:
    rf, rp = r[3], r[5]
    ratio = "n/a"
    if rp not in ("-",) and int(rf) > 0 and not rp.startswith("-"):
        ratio = "%.2f" % (int(rf) / int(rp))
    ratios.append(f"ratio_{r[0]}_{r[1]}_{r[2]}={ratio}")
print(f"strategy_rounds_shards_best={best} fedavg_rounds_shards={fa} " + " ".join(ratios))
PY
