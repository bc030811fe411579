#ifndef FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_
#define FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_

namespace fedlearn {

// Central differential privacy's numbers (the --dp_* flags): every update
// clipped to L2 norm C, a round's sum noised with N(0, (z C)^2) per
// coordinate. With a target quantile, C adapts every round (Andrew et al.
// 2021): it moves geometrically towards the quantile of the update norms,
// estimated from a noised count of the updates within C. The strategy builds
// them into its aggregate (DpMeanAggregator), the accountant charges z per
// round (rdp_accountant.h).
struct DpParams {
  double clip_norm = 0;         // C, or the first round's C when adaptive
  double noise_multiplier = 0;  // z; 0: no DP
  // Adaptive clipping: the quantile gamma in (0, 1) C tracks (0: C fixed), its
  // learning rate eta_C, and the noise on the count of updates within C
  // (sigma_b; 0: a twentieth of the clients sampled, at least z).
  double target_quantile = 0;
  double clip_learning_rate = 0.2;
  double clipped_count_stddev = 0;

  bool enabled() const { return noise_multiplier > 0; }
  bool adaptive() const { return enabled() && target_quantile > 0; }
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_
