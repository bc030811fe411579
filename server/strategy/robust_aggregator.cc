#include "server/strategy/robust_aggregator.h"

#include <algorithm>
#include <cassert>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fedlearn {
namespace {

// Calls visit(begin, length, rows) for every stripe of the store's updates,
// rows holding count() x length floats (row-major, update i in row i).
template <typename Visit>
absl::Status ForEachStripe(const UpdateStore& store, Visit visit) {
  const size_t n = static_cast<size_t>(store.count());
  const size_t p = store.options().num_parameters;
  std::vector<float> rows(n * std::min(p, StoredAggregator::kStripe));
  for (size_t begin = 0; begin < p; begin += StoredAggregator::kStripe) {
    const size_t length = std::min(StoredAggregator::kStripe, p - begin);
    const absl::Span<float> stripe(rows.data(), n * length);
    if (absl::Status s = store.ReadStripe(begin, length, stripe); !s.ok()) {
      return s;
    }
    visit(begin, length, absl::Span<const float>(stripe));
  }
  return absl::OkStatus();
}

// Per coordinate of every stripe: the column's n values, sorted, to `rule`.
template <typename Rule>
absl::Status ForEachSortedColumn(const UpdateStore& store,
                                 absl::Span<double> out, Rule rule) {
  const size_t n = static_cast<size_t>(store.count());
  std::vector<float> column(n);
  return ForEachStripe(
      store, [&](size_t begin, size_t length, absl::Span<const float> rows) {
        for (size_t j = 0; j < length; ++j) {
          for (size_t i = 0; i < n; ++i) column[i] = rows[i * length + j];
          std::sort(column.begin(), column.end());
          out[begin + j] = rule(absl::Span<const float>(column));
        }
      });
}

}  // namespace

StoredAggregator::StoredAggregator(UpdateStore::Options options)
    : store_(std::move(options)), delta_(store_.options().num_parameters) {}

void StoredAggregator::Reset() {
  store_.Clear();
  fold_error_ = absl::OkStatus();
  finished_ = false;
}

absl::StatusOr<Aggregator::Staged> StoredAggregator::Stage(
    absl::Span<float> update) {
  absl::StatusOr<UpdateStore::Staged> stored = store_.Stage(update);
  if (!stored.ok()) return stored.status();
  Staged staged;
  staged.stored = *std::move(stored);
  return staged;
}

void StoredAggregator::Fold(double weight, double scale,
                            absl::Span<const float> update) {
  absl::StatusOr<UpdateStore::Staged> stored = store_.Stage(update);
  if (!stored.ok()) {
    if (fold_error_.ok()) fold_error_ = stored.status();
    return;
  }
  Staged staged;
  staged.stored = *std::move(stored);
  FoldStaged(weight, scale, update, std::move(staged));
}

void StoredAggregator::FoldStaged(double weight, double scale,
                                  absl::Span<const float> update,
                                  Staged staged) {
  (void)weight;  // see the class comment: robust rules count clients
  (void)update;  // the store holds its copy
  assert(!finished_ && scale > 0);
  store_.Keep(std::move(staged.stored), scale);
}

absl::StatusOr<absl::Span<const double>> StoredAggregator::Finish() {
  if (!fold_error_.ok()) return fold_error_;
  assert(count() > 0);
  if (!finished_) {
    if (absl::Status s = Compute(store_, absl::MakeSpan(delta_)); !s.ok()) {
      return s;
    }
    finished_ = true;
  }
  return absl::Span<const double>(delta_);
}

absl::Status MedianAggregator::Compute(const UpdateStore& store,
                                       absl::Span<double> out) {
  return ForEachSortedColumn(store, out, [](absl::Span<const float> sorted) {
    const size_t n = sorted.size();
    if (n % 2 == 1) return static_cast<double>(sorted[n / 2]);
    return (static_cast<double>(sorted[n / 2 - 1]) + sorted[n / 2]) / 2;
  });
}

absl::Status TrimmedMeanAggregator::Compute(const UpdateStore& store,
                                            absl::Span<double> out) {
  const size_t n = static_cast<size_t>(store.count());
  const size_t trim = static_cast<size_t>(beta_ * static_cast<double>(n));
  assert(2 * trim < n);
  return ForEachSortedColumn(
      store, out, [trim](absl::Span<const float> sorted) {
        double sum = 0;
        for (size_t i = trim; i < sorted.size() - trim; ++i) {
          sum += sorted[i];
        }
        return sum / static_cast<double>(sorted.size() - 2 * trim);
      });
}

absl::Status KrumAggregator::Compute(const UpdateStore& store,
                                     absl::Span<double> out) {
  const int n = store.count();
  if (n < 2 * f_ + 3) {
    return absl::FailedPreconditionError(
        absl::StrCat("Krum with num_byzantine ", f_, " needs at least ",
                     2 * f_ + 3, " updates, got ", n));
  }
  const size_t un = static_cast<size_t>(n);
  // Pairwise squared distances, summed stripe by stripe in double.
  std::vector<double> distance(un * un, 0.0);
  if (absl::Status s = ForEachStripe(
          store,
          [&](size_t, size_t length, absl::Span<const float> rows) {
            for (size_t a = 0; a < un; ++a) {
              const float* x = rows.data() + a * length;
              for (size_t b = a + 1; b < un; ++b) {
                const float* y = rows.data() + b * length;
                double d = 0;
                for (size_t j = 0; j < length; ++j) {
                  const double diff = static_cast<double>(x[j]) - y[j];
                  d += diff * diff;
                }
                distance[a * un + b] += d;
                distance[b * un + a] += d;
              }
            }
          });
      !s.ok()) {
    return s;
  }
  // Scores: the n - f - 2 smallest distances to the others.
  const size_t neighbours = static_cast<size_t>(n - f_ - 2);
  std::vector<double> score(un);
  std::vector<double> others;
  for (size_t a = 0; a < un; ++a) {
    others.clear();
    for (size_t b = 0; b < un; ++b) {
      if (b != a) others.push_back(distance[a * un + b]);
    }
    std::partial_sort(others.begin(), others.begin() + neighbours,
                      others.end());
    score[a] =
        std::accumulate(others.begin(), others.begin() + neighbours, 0.0);
  }
  std::vector<int> order(un);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return score[a] < score[b]; });
  const int m = std::min(m_ == 0 ? n - f_ : m_, n);
  selected_.assign(order.begin(), order.begin() + m);
  std::sort(selected_.begin(), selected_.end());
  // Delta: the mean of the selected updates.
  std::fill(out.begin(), out.end(), 0.0);
  return ForEachStripe(
      store, [&](size_t begin, size_t length, absl::Span<const float> rows) {
        for (int i : selected_) {
          const float* x = rows.data() + static_cast<size_t>(i) * length;
          for (size_t j = 0; j < length; ++j) out[begin + j] += x[j];
        }
        for (size_t j = 0; j < length; ++j) out[begin + j] /= m;
      });
}

}  // namespace fedlearn
