#ifndef FEDLEARN_BENCH_PROCESS_STATS_H_
#define FEDLEARN_BENCH_PROCESS_STATS_H_

// What the benchmarks read about a process from /proc, and the statistics they
// print of their samples.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace fedlearn {

// The median, 99th percentile (nearest rank) and largest of `v`, and its size.
struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
  size_t n = 0;
};
Percentiles Of(std::vector<double> v);

// Of process `pid`: resident memory in KiB, user + system CPU seconds, open
// file descriptors and threads (0 when /proc does not say).
int64_t RssKb(int pid);
double CpuSeconds(int pid);
int64_t OpenFds(int pid);
int64_t Threads(int pid);
// Bytes process `pid` has passed to write(2) and its kind so far
// (/proc/PID/io, wchar), whatever the file.
int64_t BytesWritten(int pid);

// Least-squares slope of y over x (0 for fewer than two points).
double Slope(const std::vector<std::pair<double, double>>& points);

// A process's resources at one point of a run: `at` is what the slopes are
// taken against (a round, minutes).
struct ResourceSample {
  double at;
  int64_t rss_kb, fds, threads;
};
ResourceSample ReadResources(int pid, double at);

// Least-squares slopes over `at` of the samples from `from` on, and how many
// samples that is.
struct ResourceSlopes {
  double rss_kb = 0, fds = 0, threads = 0;
  size_t samples = 0;
};
ResourceSlopes SlopesFrom(const std::vector<ResourceSample>& samples,
                          double from);

}  // namespace fedlearn

#endif  // FEDLEARN_BENCH_PROCESS_STATS_H_
