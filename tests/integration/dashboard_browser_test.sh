#!/usr/bin/env bash
# The dashboard in a real browser during a real run: headless Chromium loads
# http://127.0.0.1:HTTP_PORT/ from fedlearn-coordinator while 3 agents train on a slice
# of data/mnist, once mid-run and once at DONE. Checks that the curves have points and
# that the numbers on the page are /api/status's; saves a screenshot.
#
#   dashboard_browser_test.sh COORDINATOR CLIENT SOURCE_DIR WORK_DIR SCREENSHOT [MODE]
# MODE: rounds (default; 4 rounds of 3 agents), async (--mode=async, 15 updates) or
# private (rounds under central DP whose budget stops training after 3 rounds).
# Exits 0 on success, 77 (skipped) without chromium or data/mnist, 1 on failure.
set -uo pipefail
COORDINATOR=$1 CLIENT=$2 SOURCE_DIR=$3 WORK=$4 SCREENSHOT=$5 MODE=${6:-rounds}
source "$(dirname "$0")/live_run.sh"

chromium=$(command -v chromium || command -v chromium-browser) ||
  skip "chromium missing (apt-get install chromium, or scripts/setup.sh)"
need_data

# dump_dom FILE [SCREENSHOT]: the page's DOM once its scripts have run.
dump_dom() {
  local profile
  profile=$(mktemp -d "$WORK/profile.XXXXXX")
  local flags=(--headless --no-sandbox --disable-gpu --no-first-run
    --disable-background-networking --disable-component-update --disable-sync
    --user-data-dir="$profile" --window-size=1400,2400 --virtual-time-budget=5000)
  timeout 60 "$chromium" "${flags[@]}" --dump-dom "http://127.0.0.1:$HTTP_PORT/" \
    >"$1" 2>"$WORK/chromium.log" || { cat "$WORK/chromium.log" >&2; fail "chromium --dump-dom failed"; }
  if [ $# -ge 2 ]; then
    timeout 60 "$chromium" "${flags[@]}" --screenshot="$2" "http://127.0.0.1:$HTTP_PORT/" \
      2>>"$WORK/chromium.log" || fail "chromium --screenshot failed"
  fi
  rm -rf "$profile"
}

# check_dom DOM STATUS_BEFORE STATUS_AFTER MODE: compares the rendered page with the
# /api/status fetched just before and just after it was rendered, and its transfers cards
# with $WORK/metrics.txt, /metrics fetched just after.
check_dom() {
  "$python" - "$@" "$MODE" "$WORK/metrics.txt" <<'PY'
import json, sys
from html.parser import HTMLParser

dom_path, before_path, after_path, mode, run_mode = sys.argv[1:6]
before, after = json.load(open(before_path)), json.load(open(after_path))

class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.text, self.attrs, self.series, self.rows = {}, {}, {}, {}
        self.stack = []  # open elements with an id: text goes to the innermost
        self.table = None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.attrs["body"] = a
        if tag == "table" and a.get("id"):
            self.table = a["id"]
            self.rows[self.table] = 0
        if tag == "tr" and self.table and ("data-client-id" in a or "data-tensor" in a):
            self.rows[self.table] += 1
        if tag == "polyline" and "data-series" in a:
            self.series.setdefault(a["data-series"], []).append(int(a.get("data-points", -1)))
        if "id" in a:
            self.text.setdefault(a["id"], "")
            self.stack.append((tag, a["id"]))
        elif self.stack and tag == self.stack[-1][0]:
            self.stack.append((tag, None))
    def handle_endtag(self, tag):
        if tag == "table":
            self.table = None
        if self.stack and self.stack[-1][0] == tag:
            self.stack.pop()
    def handle_data(self, data):
        for _, i in self.stack:
            if i:
                self.text[i] += data

page = Page()
page.feed(open(dom_path).read())
errors = []
def expect(ok, what):
    if not ok:
        errors.append(what)

body = page.attrs.get("body", {})
expect(body.get("data-updated") == "1", f"page never rendered a status: body {body}")
text = {k: v.strip() for k, v in page.text.items()}

# The transfers cards show /metrics (fetched just after the page was rendered): the
# receive buffers always, and at DONE, when nothing moves, every figure.
expect(body.get("data-metrics-updated") == "1", f"page never rendered /metrics: body {body}")
metrics = {}
for line in open(sys.argv[6] if len(sys.argv) > 6 else "/dev/null"):
    if line.strip() and not line.startswith("#"):
        name, _, value = line.rstrip("\n").rpartition(" ")
        metrics[name] = value
fmt = lambda name: f"{int(float(metrics.get(name, 'nan'))):,}" if name in metrics else "missing"
expect(text.get("receive-buffers", "").endswith(" / " + fmt("fedlearn_receive_buffers")),
       f"receive buffers {text.get('receive-buffers')} vs {fmt('fedlearn_receive_buffers')}")
if mode == "done":
    expect(text.get("downloads") == fmt("fedlearn_downloads"),
           f"downloads {text.get('downloads')} vs {fmt('fedlearn_downloads')}")
    expect(text.get("receive-buffers") == fmt("fedlearn_receive_buffers_in_use") + " / " +
           fmt("fedlearn_receive_buffers"), f"receive buffers {text.get('receive-buffers')}")
    cut = sum(int(float(metrics.get(f'fedlearn_downloads_cut_off_total{{reason="{r}"}}', 0)))
              for r in ("stalled", "moved_on"))
    expect(text.get("downloads-cut-off") == f"{cut:,}",
           f"downloads cut off {text.get('downloads-cut-off')} vs {cut}")
    too_slow = 'fedlearn_updates_rejected_total{reason="too_slow"}'
    expect(text.get("uploads-cut-off") == fmt(too_slow),
           f"uploads cut off {text.get('uploads-cut-off')} vs {fmt(too_slow)}")
num = lambda v: int(v) if v is not None else 0
closed = lambda s: [r for r in s.get("history", []) if not r.get("evaluation") and r.get("outcome") != "abandoned"]

# The page shows a moment between the two fetches.
rounds = {num(before["round"]), num(after["round"])}
expect(num(text.get("round")) in set(range(min(rounds), max(rounds) + 1)),
       f"round {text.get('round')} not between {sorted(rounds)}")
# A phase the run passed through between the fetches: before's, after's, or one in between
# (on a slow machine a whole evaluation can fall between the two).
lifecycle = ["WAITING_FOR_CLIENTS", "TRAINING", "EVALUATING", "DONE"]
ends = sorted(lifecycle.index(s["phase"].replace("PHASE_", "")) for s in (before, after))
phase = text.get("phase")
expect(phase in lifecycle[ends[0]:ends[1] + 1],
       f"phase {phase} is not between {before['phase']} and {after['phase']}")
points = page.series.get("train_loss", [0])[0]
expect(len(closed(before)) <= points <= len(closed(after)) and points >= 1,
       f"train_loss has {points} points, status has {len(closed(before))}..{len(closed(after))} closed rounds")
acc_points = page.series.get("train_accuracy", [0])[0]
expect(acc_points == points, f"train_accuracy has {acc_points} points, train_loss {points}")
expect(text.get("clients-joined") == str(len(after["clients"])),
       f"clients joined {text.get('clients-joined')} vs {len(after['clients'])}")
expect(page.rows.get("clients") == len(after["clients"]), f"clients table rows {page.rows.get('clients')}")
expect(page.rows.get("tensors") == len(after["model"]["tensors"]), f"tensors table rows {page.rows.get('tensors')}")

if mode == "done":
    # Nothing moves any more: every number must be exactly /api/status's.
    expect(before["history"] == after["history"], "history changed after DONE")
    expect(phase == "DONE", f"phase {phase}")
    expect(text.get("round") == str(after["round"]), f"round {text.get('round')} vs {after['round']}")
    n = len(closed(after))
    expect(points == n, f"train_loss points {points} vs {n} rounds")
    validated = sum(1 for r in closed(after) if r["metrics"]["has_validation"])
    expect(page.series.get("validation_loss", [0])[0] == validated,
           f"validation_loss points {page.series.get('validation_loss')} vs {validated}")
    expect(page.series.get("duration_seconds", [0])[0] == len(after["history"]),
           f"duration bars {page.series.get('duration_seconds')} vs {len(after['history'])} records")
    final = "%.2f%%" % (100 * after["final_evaluation"]["test_accuracy"])
    expect(text.get("final-accuracy") == final, f"final accuracy {text.get('final-accuracy')} vs {final}")
    last = after["history"][-1]
    for key in ("selected", "responded", "dropped"):
        expect(text.get(key) == str(last[key]), f"{key} {text.get(key)} vs {last[key]}")
    # Under DP no client's own norm is shown.
    norms = 0 if run_mode == "private" else len(after["clients"])
    expect(page.series.get("last_update_norm", [-1])[0] == norms,
           f"update norms {page.series.get('last_update_norm')}, expected {norms}")
    if run_mode == "private":
        expect(after["stop_reason"] == "privacy_budget", f"stop reason {after['stop_reason']}")
        eps = page.series.get("dp_epsilon", [0])[0]
        expect(eps == n == after["privacy"]["rounds"],
               f"epsilon points {eps}, {n} rounds, {after['privacy']['rounds']} charged")
        shown = "%g" % float("%.4g" % after["privacy"]["epsilon"])  # the page's fmtSig
        expect(text.get("dp-epsilon") == shown, f"epsilon {text.get('dp-epsilon')} vs {shown}")
        expect(page.series.get("dp_budget", [0])[0] == 1, "no budget line")
    else:
        expect("dp_epsilon" not in page.series or page.series["dp_epsilon"] == [0],
               f"an epsilon curve without DP: {page.series.get('dp_epsilon')}")

if errors:
    print("dashboard does not match /api/status:\n  " + "\n  ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"dashboard ({mode}): phase {phase}, round {text.get('round')}, {points} points per curve, "
      f"final accuracy {text.get('final-accuracy')}")
PY
}

case "$MODE" in
  rounds) start_coordinator --min_clients=3 --clients_per_round=3 --max_rounds=4 \
    --rounds_between_validations=1 --convergence_threshold=-inf ;;
  async) start_coordinator --mode=async --min_clients=3 --max_rounds=15 \
    --convergence_threshold=-inf ;;
  # q = 1, z = 3: epsilon 2.547 after 3 rounds, 2.992 after 4 (fedlearn-epsilon). C is
  # small so that the noise (z C / 3 per coordinate) leaves the agents a model to train.
  private) start_coordinator --min_clients=3 --clients_per_round=3 --max_rounds=6 \
    --rounds_between_validations=1 --convergence_threshold=-inf \
    --dp_noise_multiplier=3 --dp_clip_norm=0.01 --dp_max_epsilon=2.8 ;;
  *) fail "MODE is rounds, async or private, not $MODE" ;;
esac
start_agents 3

# Mid-run: a round has closed and training goes on.
await_status 'len(s["history"]) >= 1 and s["phase"] == "PHASE_TRAINING"' 120
curl -sf "http://127.0.0.1:$HTTP_PORT/api/status" >"$WORK/before.json"
dump_dom "$WORK/mid.html"
curl -sf "http://127.0.0.1:$HTTP_PORT/api/status" >"$WORK/after.json"
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$WORK/metrics.txt"
check_dom "$WORK/mid.html" "$WORK/before.json" "$WORK/after.json" running || exit 1

# At DONE (the coordinator keeps serving): exact agreement, and the screenshot.
await_status 's["phase"] == "PHASE_DONE"' 180
curl -sf "http://127.0.0.1:$HTTP_PORT/api/status" >"$WORK/before.json"
dump_dom "$WORK/done.html" "$SCREENSHOT"
curl -sf "http://127.0.0.1:$HTTP_PORT/api/status" >"$WORK/after.json"
curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$WORK/metrics.txt"
check_dom "$WORK/done.html" "$WORK/before.json" "$WORK/after.json" done || exit 1
[ -s "$SCREENSHOT" ] || fail "no screenshot at $SCREENSHOT"
echo "screenshot: $SCREENSHOT"
