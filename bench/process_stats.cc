#include "bench/process_stats.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace fedlearn {

Percentiles Of(std::vector<double> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  p.max = v.back();
  return p;
}

namespace {

// The number after `key` in /proc/PID/FILE ("status": "VmRSS:", "Threads:";
// "io": "wchar:"), or 0.
int64_t ProcField(int pid, const char* file, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/", file));
  std::string word;
  while (in >> word) {
    if (word == key) {
      int64_t value = 0;
      in >> value;
      return value;
    }
  }
  return 0;
}

}  // namespace

int64_t RssKb(int pid) { return ProcField(pid, "status", "VmRSS:"); }

double CpuSeconds(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  // Fields after the parenthesised command name; utime and stime are the
  // 14th and 15th fields of the whole line.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int64_t OpenFds(int pid) {
  std::error_code error;
  int64_t n = 0;
  for (auto it = std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/fd"), error);
       !error && it != std::filesystem::directory_iterator();
       it.increment(error)) {
    ++n;
  }
  return n;
}

int64_t Threads(int pid) { return ProcField(pid, "status", "Threads:"); }

int64_t BytesWritten(int pid) { return ProcField(pid, "io", "wchar:"); }

double Slope(const std::vector<std::pair<double, double>>& points) {
  const double n = static_cast<double>(points.size());
  if (n < 2) return 0;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double d = n * sxx - sx * sx;
  return d == 0 ? 0 : (n * sxy - sx * sy) / d;
}

ResourceSample ReadResources(int pid, double at) {
  return {at, RssKb(pid), OpenFds(pid), Threads(pid)};
}

ResourceSlopes SlopesFrom(const std::vector<ResourceSample>& samples,
                          double from) {
  std::vector<std::pair<double, double>> rss, fds, threads;
  for (const ResourceSample& x : samples) {
    if (x.at < from) continue;
    rss.emplace_back(x.at, static_cast<double>(x.rss_kb));
    fds.emplace_back(x.at, static_cast<double>(x.fds));
    threads.emplace_back(x.at, static_cast<double>(x.threads));
  }
  return {Slope(rss), Slope(fds), Slope(threads), rss.size()};
}

}  // namespace fedlearn
