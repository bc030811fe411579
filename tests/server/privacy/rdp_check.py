#!/usr/bin/python3
"""Checks the coordinator's privacy accountant against an independent computation.

The accountant (server/privacy/rdp_accountant.cc) sums a binomial expansion in log
space. This script computes the same Renyi DP of the sampled Gaussian mechanism from
its definition instead, by numerical integration in arbitrary precision (mpmath):

  A(alpha) = E_{x ~ N(0, z^2)} [ ((1 - q) + q * exp((2x - 1) / (2 z^2)))^alpha ]
  RDP(alpha) = log A(alpha) / (alpha - 1)

the alpha-th moment of the likelihood ratio between the mixture (1-q) N(0, z^2) +
q N(1, z^2) and N(0, z^2) (Mironov, Talwar and Zhang 2019, Section 3). Epsilon at
delta then follows by the conversion of Balle et al. 2020 (Theorem 21), written here
again. Both must agree with fedlearn-epsilon's JSON to 1e-3 relative, for several
(q, z, rounds).

At q = 1 it also checks the closed form RDP = alpha / (2 z^2), and that the RDP
epsilon is an upper bound on the exact epsilon of the Gaussian mechanism (Balle and
Wang 2018: delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) with
s = z / sqrt(rounds)) and within 25% of it.

Usage: rdp_check.py PATH/TO/fedlearn-epsilon
"""
import json
import multiprocessing
import subprocess
import sys

import mpmath as mp

# 12 digits: the tool and the integral then agree to about 2e-10, far inside the
# tolerance, in half the time that 20 digits take (the test ran for a minute).
mp.mp.dps = 12
TOLERANCE = 1e-3

# (q, z, rounds): the privacy.sh settings (q = 10/100, z in {0.5, 1, 2}), a
# DP-SGD-like small q over many steps, and q = 1 for the closed form.
CASES = [
    (0.1, 0.5, 50),
    (0.1, 1.0, 50),
    (0.1, 2.0, 50),
    (0.01, 1.1, 1000),
    (0.3, 1.5, 20),
    (1.0, 1.0, 1),
    (1.0, 2.0, 10),
]


def rdp_by_integration(q, z, alpha):
    """RDP of one round at order alpha, from the integral."""
    q, z, alpha = mp.mpf(q), mp.mpf(z), mp.mpf(alpha)

    def integrand(x):
        ratio = (1 - q) + q * mp.exp((2 * x - 1) / (2 * z * z))
        return mp.npdf(x, 0, z) * ratio**alpha

    # The mass sits near 0 (the N(0, z^2) part) and, for large alpha, near
    # x = alpha (where the growing ratio meets the Gaussian tail): split there.
    points = sorted({-mp.inf, -12 * z, mp.mpf(0), mp.mpf("0.5"), alpha / 2,
                     alpha - 12 * z, alpha, alpha + 12 * z, mp.inf})
    a = mp.quad(integrand, points)
    return float(mp.log(a) / (alpha - 1))


def epsilon(rdp, orders, delta):
    best = mp.inf
    for r, a in zip(rdp, orders):
        a = mp.mpf(a)
        eps = r + mp.log((a - 1) / a) - (mp.log(delta) + mp.log(a)) / (a - 1)
        best = min(best, eps)
    return max(float(best), 0.0)


def gaussian_exact_epsilon(s, delta):
    """Exact epsilon of the Gaussian mechanism, sensitivity 1, noise s."""
    def delta_at(eps):
        return (mp.ncdf(1 / (2 * s) - eps * s)
                - mp.exp(eps) * mp.ncdf(-1 / (2 * s) - eps * s))
    lo, hi = mp.mpf(0), mp.mpf(200)  # delta_at falls as eps grows: bisect
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) > delta else (lo, mid)
    return float(hi)


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def main():
    tool = sys.argv[1]
    delta = 1e-5
    failures = []
    checks = 0
    worst = 0.0  # the largest relative difference from the tool seen
    pool = multiprocessing.Pool()  # one integral per order, on every core
    for q, z, rounds in CASES:
        out = subprocess.run(
            [tool, f"--sampling_rate={q}", f"--noise_multiplier={z}",
             f"--rounds={rounds}", f"--delta={delta}", "--json"],
            check=True, capture_output=True, text=True).stdout
        got = json.loads(out)
        orders = got["orders"]
        mine = pool.starmap(rdp_by_integration, [(q, z, a) for a in orders])
        for a, theirs, ours in zip(orders, got["rdp"], mine):
            checks += 1
            worst = max(worst, relative(theirs, ours))
            if relative(theirs, ours) > TOLERANCE:
                failures.append(f"q={q} z={z} alpha={a}: RDP {theirs} vs "
                                f"integrated {ours}")
            if q == 1.0:
                closed = a / (2 * z * z)
                checks += 1
                if relative(ours, closed) > TOLERANCE:
                    failures.append(f"z={z} alpha={a}: integrated RDP {ours} "
                                    f"vs closed form {closed}")
        for t in sorted({1, rounds // 2 or 1, rounds}):
            theirs = got["epsilon"][t - 1]
            ours = epsilon([t * r for r in mine], orders, delta)
            checks += 1
            worst = max(worst, relative(theirs, ours))
            if relative(theirs, ours) > TOLERANCE:
                failures.append(f"q={q} z={z} rounds={t}: epsilon {theirs} vs "
                                f"{ours}")
        line = (f"q={q:<5} z={z:<4} rounds={rounds:<5} "
                f"epsilon={got['epsilon'][-1]:.4f} (integrated "
                f"{epsilon([rounds * r for r in mine], orders, delta):.4f})")
        if q == 1.0:
            exact = gaussian_exact_epsilon(mp.mpf(z) / mp.sqrt(rounds), delta)
            checks += 1
            ratio = got["epsilon"][-1] / exact
            if not 1.0 <= ratio <= 1.25:
                failures.append(f"z={z} rounds={rounds}: RDP epsilon "
                                f"{got['epsilon'][-1]} vs exact Gaussian "
                                f"{exact} (ratio {ratio:.3f})")
            line += f" exact Gaussian {exact:.4f}"
        print(line)
    pool.close()
    pool.join()
    print(f"largest relative difference from fedlearn-epsilon: {worst:.2e}")
    for f in failures:
        print("FAIL:", f)
    print(f"{checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
