#ifndef FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_
#define FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_

namespace fedlearn {

// Central differential privacy's numbers (the --dp_* flags, whose defaults are
// in server/options.inc): every update clipped to L2 norm C, a round's sum
// noised with N(0, (z C)^2) per coordinate. With a target quantile, C adapts
// every round (Andrew et al. 2021): it moves geometrically towards the quantile
// of the update norms, estimated from a noised count of the updates within C.
// The strategy builds them into its aggregate (DpMeanAggregator), the
// accountant charges z per round (rdp_accountant.h).
struct DpParams {
  double clip_norm = 0;         // C, or the first round's C when adaptive
  double noise_multiplier = 0;  // z; 0: no DP
  // Adaptive clipping: the quantile gamma in (0, 1) C tracks (0: C fixed), its
  // learning rate eta_C, and the noise on the count of updates within C
  // (sigma_b; 0: CountStddev's default).
  double target_quantile = 0;
  double clip_learning_rate = 0;
  double clipped_count_stddev = 0;

  bool enabled() const { return noise_multiplier > 0; }
  bool adaptive() const { return enabled() && target_quantile > 0; }

  // Adaptive clipping releases two sums each round: the clipped updates
  // (sensitivity C) and the count of updates within C, each client's flag
  // centred to +-1/2 (sensitivity 1/2). Noised with multipliers z_sum (on C)
  // and sigma_b, they are together one Gaussian mechanism of multiplier z when
  //   z^-2 = z_sum^-2 + (2 sigma_b)^-2,
  // which needs sigma_b > z / 2. sigma_b for `sampled` clients: the one given,
  // else Andrew et al.'s sampled / 20, raised to z where that is smaller (the
  // count then takes a quarter of the budget: z_sum = 1.15 z).
  double CountStddev(int sampled) const {
    if (clipped_count_stddev > 0) return clipped_count_stddev;
    const double paper = sampled / 20.0;
    return paper > noise_multiplier ? paper : noise_multiplier;
  }
  // Whether sigma_b leaves the sum a noise multiplier (sigma_b > z / 2).
  static bool CountStddevFits(double sigma_b, double z) {
    return 2 * sigma_b > z;
  }
  // z_sum for `sampled` clients: z without adaptation.
  double SumNoiseMultiplier(int sampled) const;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_
