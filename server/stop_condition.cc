#include "server/stop_condition.h"

namespace fedlearn {

StopCondition::Verdict StopCondition::Observe(int64_t version,
                                              std::optional<double> loss) {
  Verdict verdict;
  bool converged = false;
  if (loss.has_value()) {
    if (previous_.has_value() && *previous_ > 0) {
      const double improvement = (*previous_ - *loss) / *previous_;
      verdict.improvement = improvement;
      converged = improvement < threshold_;
    }
    previous_ = loss;
  }
  if (converged) {
    verdict.stop = true;
    verdict.reason = "converged";
  } else if (version >= max_rounds_) {
    verdict.stop = true;
    verdict.reason = "max_rounds";
  }
  return verdict;
}

}  // namespace fedlearn
