#ifndef FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_
#define FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_

namespace fedlearn {

// Central differential privacy's two numbers (--dp_clip_norm,
// --dp_noise_multiplier): every update clipped to L2 norm C, a round's sum
// noised with N(0, (z C)^2) per coordinate. The strategy builds them into its
// clipping and aggregate (strategy.h), the accountant charges z per round
// (rdp_accountant.h).
struct DpParams {
  double clip_norm = 0;         // C
  double noise_multiplier = 0;  // z; 0: no DP
  bool enabled() const { return noise_multiplier > 0; }
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_PRIVACY_DP_PARAMS_H_
