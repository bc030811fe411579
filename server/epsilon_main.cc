// fedlearn-epsilon: the privacy a central-DP run will spend, before running
// it: epsilon at --delta after each of --rounds rounds that each sample a
// client with probability --sampling_rate (clients_per_round / clients) and
// noise with multiplier --noise_multiplier, from the coordinator's own
// accountant (server/privacy/rdp_accountant.h). With --target_epsilon it finds
// the smallest noise multiplier that stays within it. --json prints the RDP of
// one round per order and epsilon per round, for
// tests/server/privacy/rdp_check.py.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "server/privacy/rdp_accountant.h"

ABSL_FLAG(double, sampling_rate, 0.1,
          "q, the chance that a client is in a round (clients_per_round / "
          "clients)");
ABSL_FLAG(double, noise_multiplier, 1.0, "z (--dp_noise_multiplier)");
ABSL_FLAG(int, rounds, 50, "rounds released");
ABSL_FLAG(double, delta, 1e-5, "delta (--dp_delta)");
ABSL_FLAG(double, target_epsilon, 0,
          "if > 0: print the smallest noise multiplier (to 3 significant "
          "digits) whose epsilon after --rounds stays within this");
ABSL_FLAG(bool, json, false,
          "print one JSON object: orders, the RDP of one round at each, and "
          "epsilon after each round");

namespace fedlearn {
namespace {

double EpsilonAfter(double q, double z, int rounds, double delta) {
  PrivacyAccountant accountant(delta, /*max_epsilon=*/0);
  for (int r = 0; r < rounds; ++r) accountant.Charge(q, z);
  return accountant.epsilon();
}

int Run() {
  const double q = absl::GetFlag(FLAGS_sampling_rate);
  const double z = absl::GetFlag(FLAGS_noise_multiplier);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const double delta = absl::GetFlag(FLAGS_delta);
  const double target = absl::GetFlag(FLAGS_target_epsilon);
  if (!(q > 0 && q <= 1) || !(z > 0) || rounds < 1 ||
      !(delta > 0 && delta < 1)) {
    std::fprintf(stderr,
                 "fedlearn-epsilon: needs --sampling_rate in (0, 1], "
                 "--noise_multiplier > 0, --rounds >= 1, --delta in (0, 1)\n");
    return 2;
  }
  if (target > 0) {
    // Epsilon falls as z grows: bisect on z between bounds that bracket it.
    double lo = 1e-3, hi = 1e3;
    if (EpsilonAfter(q, hi, rounds, delta) > target) {
      std::fprintf(stderr, "fedlearn-epsilon: no z up to %g reaches %g\n", hi,
                   target);
      return 1;
    }
    while (hi - lo > 5e-4 * hi) {
      const double mid = 0.5 * (lo + hi);
      (EpsilonAfter(q, mid, rounds, delta) > target ? lo : hi) = mid;
    }
    std::printf(
        "noise_multiplier=%.3g (epsilon %.4g after %d rounds at q %g, delta "
        "%g)\n",
        hi, EpsilonAfter(q, hi, rounds, delta), rounds, q, delta);
    return 0;
  }
  PrivacyAccountant accountant(delta, /*max_epsilon=*/0);
  std::vector<double> epsilons;
  for (int r = 0; r < rounds; ++r) {
    accountant.Charge(q, z);
    epsilons.push_back(accountant.epsilon());
  }
  if (absl::GetFlag(FLAGS_json)) {
    auto numbers = [](absl::Span<const double> v) {
      return absl::StrJoin(v, ",", [](std::string* out, double x) {
        char buffer[32];
        std::snprintf(buffer, sizeof(buffer), "%.17g", x);
        out->append(buffer);
      });
    };
    std::printf("{\"orders\":[%s],\"rdp\":[%s],\"epsilon\":[%s]}\n",
                numbers(RdpOrders()).c_str(),
                numbers(SampledGaussianRdp(q, z, RdpOrders())).c_str(),
                numbers(epsilons).c_str());
    return 0;
  }
  std::printf("q %g, z %g, delta %g\nround  epsilon\n", q, z, delta);
  for (int r = 0; r < rounds; ++r) {
    if (r < 10 || (r + 1) % 10 == 0 || r + 1 == rounds) {
      std::printf("%5d  %.4g\n", r + 1, epsilons[r]);
    }
  }
  return 0;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  fedlearn::ParseFlags(argc, argv,
                       "fedlearn-epsilon --sampling_rate=Q "
                       "--noise_multiplier=Z --rounds=N [--delta=D]\n"
                       "The epsilon a central-DP fedlearn run spends.");
  return fedlearn::Run();
}
