#include "server/strategy/server_optimizer.h"

#include <atomic>
#include <cassert>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace fedlearn {
namespace {

// The slot's buffer to write the next state into: the slot itself when nobody
// else holds it, a copy when a save in progress still reads it.
std::vector<float>& Writable(std::shared_ptr<std::vector<float>>& slot) {
  if (slot.use_count() > 1) {
    slot = std::make_shared<std::vector<float>>(*slot);
  } else {
    // use_count is a relaxed load: order the last other holder's reads (a
    // save let go with an acq_rel decrement) before the writes that follow,
    // as the run controller does for its model buffer.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return *slot;
}

absl::Status RestoreSlots(
    const OptimizerState& state, size_t num_parameters,
    std::vector<std::pair<const char*, std::shared_ptr<std::vector<float>>*>>
        slots) {
  if (state.slots.size() != slots.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state has ", state.slots.size(),
                     " vectors, this optimizer keeps ", slots.size()));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& [name, values] = state.slots[i];
    if (name != slots[i].first || values == nullptr ||
        values->size() != num_parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state vector ", i, " is \"", name, "\" of ",
          values == nullptr ? 0 : values->size(), " values; expected \"",
          slots[i].first, "\" of ", num_parameters));
    }
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    *slots[i].second =
        std::make_shared<std::vector<float>>(*state.slots[i].second);
  }
  return absl::OkStatus();
}

}  // namespace

SgdServerOptimizer::SgdServerOptimizer(size_t num_parameters,
                                       double learning_rate, double momentum)
    : num_parameters_(num_parameters),
      learning_rate_(learning_rate),
      momentum_(momentum) {
  if (momentum_ > 0) {
    velocity_ = std::make_shared<std::vector<float>>(num_parameters, 0.0f);
  }
}

void SgdServerOptimizer::Step(absl::Span<const double> delta,
                              absl::Span<const float> current,
                              absl::Span<float> next) {
  assert(delta.size() == num_parameters_ && current.size() == num_parameters_ &&
         next.size() == num_parameters_);
  ++steps_;
  const double lr = learning_rate_;
  if (velocity_ == nullptr) {
    for (size_t i = 0; i < num_parameters_; ++i) {
      next[i] =
          static_cast<float>(static_cast<double>(current[i]) + lr * delta[i]);
    }
    return;
  }
  std::vector<float>& v = Writable(velocity_);
  for (size_t i = 0; i < num_parameters_; ++i) {
    const double vi = momentum_ * static_cast<double>(v[i]) + delta[i];
    v[i] = static_cast<float>(vi);
    next[i] = static_cast<float>(static_cast<double>(current[i]) + lr * vi);
  }
}

OptimizerState SgdServerOptimizer::State() const {
  OptimizerState state;
  state.steps = steps_;
  if (velocity_ != nullptr) state.slots.emplace_back("momentum", velocity_);
  return state;
}

absl::Status SgdServerOptimizer::Restore(const OptimizerState& state) {
  std::vector<std::pair<const char*, std::shared_ptr<std::vector<float>>*>>
      slots;
  if (velocity_ != nullptr) slots.emplace_back("momentum", &velocity_);
  if (absl::Status s = RestoreSlots(state, num_parameters_, std::move(slots));
      !s.ok()) {
    return s;
  }
  steps_ = state.steps;
  return absl::OkStatus();
}

AdaptiveServerOptimizer::AdaptiveServerOptimizer(size_t num_parameters,
                                                 Params params)
    : num_parameters_(num_parameters),
      params_(params),
      m_(std::make_shared<std::vector<float>>(num_parameters, 0.0f)),
      v_(std::make_shared<std::vector<float>>(
          num_parameters, static_cast<float>(params.tau * params.tau))) {}

void AdaptiveServerOptimizer::Step(absl::Span<const double> delta,
                                   absl::Span<const float> current,
                                   absl::Span<float> next) {
  assert(delta.size() == num_parameters_ && current.size() == num_parameters_ &&
         next.size() == num_parameters_);
  ++steps_;
  const double b1 = params_.beta_1;
  const double b2 = params_.beta_2;
  const double tau = params_.tau;
  double lr = params_.learning_rate;
  if (params_.bias_correction) {
    const double t = static_cast<double>(steps_);
    lr *= std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
  }
  std::vector<float>& m = Writable(m_);
  std::vector<float>& v = Writable(v_);
  for (size_t i = 0; i < num_parameters_; ++i) {
    const double d = delta[i];
    const double d2 = d * d;
    const double mi = b1 * static_cast<double>(m[i]) + (1 - b1) * d;
    const double old_v = static_cast<double>(v[i]);
    double vi = 0;
    switch (params_.rule) {
      case Rule::kAdagrad:
        vi = old_v + d2;
        break;
      case Rule::kAdam:
        vi = b2 * old_v + (1 - b2) * d2;
        break;
      case Rule::kYogi: {
        const double diff = old_v - d2;
        const double sign = diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0);
        vi = old_v - (1 - b2) * d2 * sign;
        break;
      }
    }
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    next[i] = static_cast<float>(static_cast<double>(current[i]) +
                                 lr * mi / (std::sqrt(vi) + tau));
  }
}

OptimizerState AdaptiveServerOptimizer::State() const {
  OptimizerState state;
  state.steps = steps_;
  state.slots.emplace_back("m", m_);
  state.slots.emplace_back("v", v_);
  return state;
}

absl::Status AdaptiveServerOptimizer::Restore(const OptimizerState& state) {
  if (absl::Status s =
          RestoreSlots(state, num_parameters_, {{"m", &m_}, {"v", &v_}});
      !s.ok()) {
    return s;
  }
  steps_ = state.steps;
  return absl::OkStatus();
}

}  // namespace fedlearn
