#ifndef FEDLEARN_SERVER_STOP_CONDITION_H_
#define FEDLEARN_SERVER_STOP_CONDITION_H_

#include <cstdint>
#include <optional>
#include <string>

namespace fedlearn {

// When training ends: at `max_rounds` model versions, or when the aggregated
// train loss improves by less than `convergence_threshold` (relative) from one
// observation to the next (a round's loss; in async mode a window's). 0 stops
// only on a rising loss, a negative threshold tolerates some rise, -inf never
// converges. Not thread-safe: the run controller serialises.
class StopCondition {
 public:
  StopCondition(int max_rounds, double convergence_threshold)
      : max_rounds_(max_rounds), threshold_(convergence_threshold) {}

  struct Verdict {
    bool stop = false;
    std::string reason;  // "converged" or "max_rounds" when stopping
    // (previous - loss) / previous, when there was a previous loss > 0.
    std::optional<double> improvement;
  };

  // Model version `version` was made; `loss` is the train loss observed with
  // it, if any (an async version may close no window).
  Verdict Observe(int64_t version, std::optional<double> loss);

  // The last loss observed, saved with the run for the next comparison.
  std::optional<double> previous_loss() const { return previous_; }
  void Restore(std::optional<double> previous) { previous_ = previous; }

 private:
  const int max_rounds_;
  const double threshold_;
  std::optional<double> previous_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STOP_CONDITION_H_
