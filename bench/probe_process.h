#ifndef FEDLEARN_BENCH_PROBE_PROCESS_H_
#define FEDLEARN_BENCH_PROBE_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fedlearn {

// bench/status_probe in a process of its own, beside the running binary (see
// status_probe.cc for why): started when constructed, against the coordinator
// at `coordinator` (gRPC) and `http_port` (/metrics). Finish stops it and
// returns its report. Not thread-safe: one thread makes it and calls Finish.
class ProbeProcess {
 public:
  ProbeProcess(const std::string& coordinator, int http_port);
  ProbeProcess(const ProbeProcess&) = delete;
  ProbeProcess& operator=(const ProbeProcess&) = delete;

  // Stops the probe; returns its latency lines and adds its failed calls (or
  // 1 when it could not run or report) to `*errors`. Call once.
  std::vector<std::string> Finish(int64_t* errors);

 private:
  pid_t pid_ = 0;
  int to_probe_ = -1, from_probe_ = -1;
  std::string error_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_BENCH_PROBE_PROCESS_H_
