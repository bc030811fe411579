#!/usr/bin/python3
"""Rounds to a target test accuracy, fedlearn next to its PyTorch peer: reads the JSON lines
of bench/convergence and of bench/peers/fedavg_pytorch.py, prints the per-round table and
each side's outcome, and writes one line to RESULT:
  <rounds_f> <rounds_p> <seconds_f> <seconds_p> <best_f> <best_p> <wall_f> <wall_p>
rounds/seconds: the first round at or above the target and its seconds_since_start, or
"-N" / "-" for a side that stopped after N rounds without reaching it; best: the best test
accuracy seen; wall: seconds_since_start of the side's last round.

Usage: rounds_table.py FEDLEARN_JSONL PYTORCH_JSONL TARGET RESULT
"""

import json
import sys


def rounds(path):
    rows = [json.loads(line) for line in open(path)]
    return {r["round"]: r for r in rows if "test_accuracy" in r}


def main():
    f, p = rounds(sys.argv[1]), rounds(sys.argv[2])
    target, out = float(sys.argv[3]), sys.argv[4]
    print()
    print(f"{'round':>5} | {'fedlearn acc':>12} {'s':>7} | {'PyTorch acc':>11} {'s':>7}")
    for n in range(max(max(f), max(p)) + 1):
        cells = []
        for side in (f, p):
            r = side.get(n)
            cells.append((f"{r['test_accuracy']:.4f}", f"{r['seconds_since_start']:.1f}")
                         if r else ("-", "-"))
        print(f"{n:>5} | {cells[0][0]:>12} {cells[0][1]:>7} | {cells[1][0]:>11} {cells[1][1]:>7}")
    reached, seconds, best, wall = [], [], [], []
    for name, side in (("fedlearn", f), ("PyTorch", p)):
        hit = [n for n in sorted(side) if n > 0 and side[n]["test_accuracy"] >= target]
        last = max(side)
        top = max(side.values(), key=lambda r: r["test_accuracy"])
        best.append(f"{top['test_accuracy']:.4f}")
        wall.append(f"{side[last]['seconds_since_start']:.2f}")
        if hit:
            n = hit[0]
            print(f"{name}: reached {target:.2f} at round {n} after "
                  f"{side[n]['seconds_since_start']:.1f} s; final accuracy "
                  f"{side[last]['test_accuracy']:.4f}")
            reached.append(str(n))
            seconds.append(f"{side[n]['seconds_since_start']:.2f}")
        else:
            print(f"{name}: did NOT reach {target:.2f} in {last} rounds; best accuracy "
                  f"{top['test_accuracy']:.4f} (round {top['round']}), final "
                  f"{side[last]['test_accuracy']:.4f}, {side[last]['seconds_since_start']:.1f} s")
            reached.append(f"-{last}")
            seconds.append("-")
    with open(out, "w") as fh:
        fh.write(" ".join(reached + seconds + best + wall) + "\n")


if __name__ == "__main__":
    main()
