# Sourced after bench/peers/setup.sh by the scripts that measure rounds to a target
# accuracy, fedlearn's bench/convergence next to bench/peers/fedavg_pytorch.py
# (bench/convergence-vs-pytorch.sh, bench/fedavg-paper.sh). Needs $tmp, $build and $python.
# $PEER_THREADS (default 2): the peer's torch/OpenBLAS threads. On a loaded machine 1 is
# the fair choice: OpenMP's 2 threads spin at each barrier, and with other processes on
# both cores a training step of fedavg_cnn ran 5x slower on 2 threads than on 1.

# Fetches the data sets (scripts/fetch-data.sh) unless data directory $1 has its labels.
require_data() {
  local dir=$1
  if [ ! -e "$dir/train-labels-idx1-ubyte" ] && [ ! -e "$dir/train-labels-idx1-ubyte.gz" ]; then
    echo "== $dir missing: running scripts/fetch-data.sh"
    scripts/fetch-data.sh
  fi
}

# run_rounds LABEL DATA_DIR TARGET ROUNDS [FLAG...]
# Runs fedlearn (bench/convergence) and then the PyTorch peer on DATA_DIR, each until
# TARGET test accuracy or ROUNDS rounds, prints the per-round table, and leaves
# rounds_table.py's result line in $tmp/LABEL.result. The FLAGs go to both sides (flags
# both take: --model, --clients_per_round, --epochs, --batch_size, --input_norm, --optimizer,
# --learning_rate); $fedlearn_flags (an array, may be empty) adds flags for convergence
# only. The peer uses convergence's partition and initial
# weights and replays the clients its coordinator sampled, round by round, with the
# strategy convergence ran (its start line). PEER=0 runs fedlearn only (no table, no
# result line).
run_rounds() {
  local label=$1 data=$2 target=$3 rounds=$4
  shift 4
  local out="$tmp/$label"
  echo
  echo "== $label: fedlearn on $data, target $target, at most $rounds rounds;" \
    "$* ${fedlearn_flags[*]-} (logs in $out.fedlearn.log while running)"
  "${clean_env[@]}" "$build/bench/convergence" --data_dir="$data" --rounds="$rounds" \
    --target="$target" --partitions_out="$out.partitions.json" \
    --initial_out="$out.initial.safetensors" "$@" ${fedlearn_flags[@]+"${fedlearn_flags[@]}"} \
    2>"$out.fedlearn.log" | tee "$out.fedlearn.jsonl" ||
    { tail -20 "$out.fedlearn.log" >&2; exit 1; }
  # The peer runs fedlearn's strategy with the knobs fedlearn resolved (its start line),
  # so that defaults are written once, in server/strategy/strategy.cc.
  local peer_strategy=()
  mapfile -t peer_strategy < <("$python" -c '
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if row.get("event") == "start":
        print("--strategy=" + row.get("strategy", "fedavg"))
        print("--strategy_config=" + row.get("strategy_config", ""))
        if row.get("reset_client_optimizer"):
            print("--reset_optimizer")
        break' "$out.fedlearn.jsonl")
  [ "${PEER:-1}" = 0 ] && return 0
  echo "== $label: PyTorch (same partition and initial weights, fedlearn's sampled clients;" \
    "${peer_strategy[*]})"
  "${peer_env[@]}" "$python" bench/peers/fedavg_pytorch.py --data_dir="$data" \
    --partitions="$out.partitions.json" --initial="$out.initial.safetensors" \
    --replay="$out.fedlearn.jsonl" --rounds="$rounds" --target="$target" \
    --threads="${PEER_THREADS:-2}" "${peer_strategy[@]}" "$@" |
    tee "$out.pytorch.jsonl"
  "$python" bench/peers/rounds_table.py "$out.fedlearn.jsonl" "$out.pytorch.jsonl" \
    "$target" "$out.result"
  grep '"event":"stopped"' "$out.fedlearn.jsonl" | sed 's/^/fedlearn /'
}
