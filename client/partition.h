#ifndef FEDLEARN_CLIENT_PARTITION_H_
#define FEDLEARN_CLIENT_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fedlearn {

// How a data set's examples are dealt out to clients, simulating the data
// heterogeneity of federated learning.
struct PartitionScheme {
  enum class Kind {
    // Shuffle, then split into near-equal parts: every client sees the global
    // label distribution.
    kIid,
    // The FedAvg paper's pathological non-IID split (McMahan et al. 2017):
    // sort by label, cut into 2 * num_partitions equal shards, deal each
    // client 2 shards at random, so most clients see only 2 labels.
    kShards,
    // For each class, client proportions drawn from a symmetric
    // Dirichlet(alpha): small alpha (0.1) gives a few dominant labels per
    // client, large alpha (1000) approaches IID.
    kDirichlet,
  };
  Kind kind = Kind::kIid;
  double alpha = 0.0;  // kDirichlet's concentration, finite and > 0
};

// Parses "iid", "shards" or "dirichlet:ALPHA" (ALPHA a finite number > 0, e.g.
// "dirichlet:0.5"). INVALID_ARGUMENT naming the text for anything else.
absl::StatusOr<PartitionScheme> ParsePartitionScheme(absl::string_view text);

// The inverse of ParsePartitionScheme (ALPHA printed with 6 significant
// digits).
std::string PartitionSchemeToString(const PartitionScheme& scheme);

// Deals the example indices 0 .. labels.size()-1 out to `num_partitions`
// clients under `scheme`. Every index appears in exactly one partition; each
// partition's indices are in ascending order. When there are at least as many
// examples as partitions, no partition is empty: one left empty by the scheme
// (a shard split with fewer than 2 examples per shard, or Dirichlet giving a
// client nothing) takes an example from the largest partition.
//
// Deterministic: a function of (labels, scheme, num_partitions, seed) only.
// The random numbers come from std::mt19937_64, whose sequence the standard
// fixes, through our own shuffle and samplers (not std::shuffle or the std
// distributions, which differ between standard libraries), so the result is
// the same with libstdc++ and libc++. The Dirichlet draws use std::log, exp and
// sqrt; a last-ulp difference between maths libraries could in principle move
// one example across a cut.
//
// INVALID_ARGUMENT if num_partitions < 1 or the scheme's alpha is not finite
// and positive. Costs O(n log n + num_classes * num_partitions).
absl::StatusOr<std::vector<std::vector<int64_t>>> Partition(
    absl::Span<const uint8_t> labels, const PartitionScheme& scheme,
    int num_partitions, uint64_t seed);

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_PARTITION_H_
