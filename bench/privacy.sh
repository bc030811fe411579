#!/usr/bin/env bash
# Central differential privacy in the FedAvg paper's setting: 100 clients on
# data/fashion-mnist (600 examples each, IID), 10 sampled per round (q = 0.1), E=5, B=10,
# $ROUNDS rounds (default 50), with DP at noise multipliers $ZS (default 0.5 1 2) next to
# the non-private run (FedAvg weighted by num_examples). Reports the final central test
# accuracy (bench/convergence's judge, the whole test split) and the epsilon at delta
# 1e-5 the coordinator reported after the last round, checked against fedlearn-epsilon.
#
# The clip norm C: the median L2 norm of the updates the non-private run received over
# all its rounds (bench/convergence prints each round's norms), so that about half of the
# updates would be clipped at the start: the rule of thumb of McMahan et al. 2018, and
# the fixed point adaptive clipping (Andrew et al. 2021) tracks at quantile 0.5.
# CLIP=C skips that and uses C. A last run at z = 1 adapts C instead (--dp_target_quantile
# 0.5, Andrew et al. 2021), starting from a tenth of that C.
#
# Environment: BUILD_DIR (default build-bench), ROUNDS (50), ZS ("0.5 1 2"), MODEL
# (default mlp_2nn, the FedAvg paper's 2NN: a 50-round run takes minutes; the paper's
# CNN, fedavg_cnn, about 20 times longer), CLIP.
# Last line:
#   dp_eps_z1=<epsilon after the last round at z=1> dp_acc_z1=<accuracy> nodp_acc=<accuracy>
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build-bench}"
rounds="${ROUNDS:-50}"
zs="${ZS:-0.5 1 2}"
model="${MODEL:-mlp_2nn}"
python=/usr/bin/python3
data=data/fashion-mnist

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source bench/peers/setup.sh
source bench/peers/rounds.sh
require_data "$data"
build_targets convergence fedlearn-epsilon
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $model on $data, 100" \
  "clients, 10 per round, E=5, B=10, $rounds rounds"

# run LABEL [FLAG...]: one run of bench/convergence; its JSON lines in $tmp/LABEL.jsonl.
run() {
  local label=$1
  shift
  local start=$SECONDS
  "${clean_env[@]}" "$build/bench/convergence" --data_dir="$data" --partition=iid \
    --clients=100 --clients_per_round=10 --epochs=5 --batch_size=10 --model="$model" \
    --rounds="$rounds" --target=1.01 --input_norm=fashion-mnist "$@" \
    >"$tmp/$label.jsonl" 2>"$tmp/$label.log" || { tail -20 "$tmp/$label.log" >&2; exit 1; }
  "$python" - "$tmp/$label.jsonl" "$label" "$((SECONDS - start))" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds = [r for r in rows if r.get("round", 0) > 0 and "test_accuracy" in r]
last = rounds[-1]
print(f"{sys.argv[2]:<10} rounds {last['round']:>3}  accuracy {100 * last['test_accuracy']:6.2f}%"
      f"  best {100 * max(r['test_accuracy'] for r in rounds):6.2f}%"
      f"  epsilon {last.get('dp_epsilon', 0):8.4g}  ({sys.argv[3]} s)")
PY
}

run nodp
if [ -n "${CLIP:-}" ]; then
  clip=$CLIP
  echo "== clip norm C = $clip (CLIP)"
else
  clip=$("$python" - "$tmp/nodp.jsonl" <<'PY'
import json, statistics, sys
norms = [n for l in open(sys.argv[1]) for n in json.loads(l).get("update_norms", [])]
print("%.4g" % statistics.median(norms))
PY
)
  echo "== clip norm C = $clip: the median norm of the non-private run's updates"
fi
for z in $zs; do
  run "z$z" --dp_noise_multiplier="$z" --dp_clip_norm="$clip" --dp_delta=1e-5
done
# Adaptive clipping (Andrew et al. 2021) at z = 1, tracking the median norm from a
# tenth of C: it needs no norms from a non-private run.
adaptive_from=$("$python" -c "print('%.4g' % ($clip / 10))")
run adaptive --dp_noise_multiplier=1 --dp_clip_norm="$adaptive_from" \
  --dp_target_quantile=0.5 --dp_delta=1e-5
"$python" - "$tmp/adaptive.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
clips = [r["dp_clip_norm"] for r in rows if r.get("round", 0) > 0 and "dp_clip_norm" in r]
print("== adaptive clip norm by round: " + " ".join("%.3g" % c for c in clips[::5] + clips[-1:]))
PY

"$python" - "$tmp" "$zs" "$rounds" "$build/server/fedlearn-epsilon" <<'PY'
import json, subprocess, sys
tmp, zs, rounds, tool = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
def last(label):
    rows = [json.loads(l) for l in open(f"{tmp}/{label}.jsonl")]
    return [r for r in rows if r.get("round", 0) > 0 and "test_accuracy" in r][-1]
nodp = last("nodp")
print()
print(f"== final test accuracy after {rounds} rounds, epsilon at delta 1e-5")
print(f"{'run':<12}{'accuracy':>10}{'epsilon':>10}{'planned':>10}")
print(f"{'non-private':<12}{100 * nodp['test_accuracy']:>9.2f}%{'inf':>10}{'':>10}")
out = {}
for z in zs:
    r = last(f"z{z}")
    # What fedlearn-epsilon plans for the same run: every round at q = 10/100.
    planned = subprocess.run([tool, "--sampling_rate=0.1", f"--noise_multiplier={z}",
                              f"--rounds={r['round']}", "--json"], check=True,
                             capture_output=True, text=True).stdout
    planned = json.loads(planned)["epsilon"][-1]
    print(f"{'z=' + z:<12}{100 * r['test_accuracy']:>9.2f}%{r['dp_epsilon']:>10.4g}"
          f"{planned:>10.4g}")
    if abs(r["dp_epsilon"] - planned) > 1e-4 * planned:
        sys.exit(f"z={z}: the coordinator reported epsilon {r['dp_epsilon']}, "
                 f"fedlearn-epsilon plans {planned}")
    out[z] = r
r = last("adaptive")
print(f"{'z=1 adapt.':<12}{100 * r['test_accuracy']:>9.2f}%{r['dp_epsilon']:>10.4g}")
z1 = out.get("1") or out.get("1.0")
if z1 is None:
    print(f"nodp_acc={nodp['test_accuracy']:.4f}")
else:
    print(f"dp_eps_z1={z1['dp_epsilon']:.4g} dp_acc_z1={z1['test_accuracy']:.4f} "
          f"nodp_acc={nodp['test_accuracy']:.4f}")
PY
